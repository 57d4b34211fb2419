"""Issue 42: the numbers a user gets from their own table. One test (or more) per finding, each of
which failed on the code before the fix:

1. the split clustered identical rows (also tests/test_split_rows.py);
2. experiment=linreg published DP-SGD's unconverged estimate;
3. the flagship spent a quarter of epsilon on intervals it never claimed, with a WARNING;
4. privacy.json, coefficients.csv and the console disagreed on the claim;
5. non-private runs claimed absurd intervals from an unstable fit;
6. load_model(run).coefficients() failed on every command-line run; a Pipeline lost feature names;
7. the console's epsilons contradicted the request.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from hydra import compose, initialize_config_module

from dptrain.tasks import cli
from dptrain.tasks.predict import load_model


def _run(run_dir: Path, overrides: list[str]) -> Path:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["trainer.progress=false", "logger.tensorboard=false",
                                                       *overrides])
    cli.run(cfg, run_dir=run_dir)
    return run_dir


def _survey(path: Path, n: int, seed: int, *, rid: bool = False, region: bool = False) -> pd.DataFrame:
    """educ 1..16 and married only (32 distinct rows), as a user extracts the teaching example."""
    rng = np.random.default_rng(seed)
    educ = rng.integers(1, 17, size=n)
    df = pd.DataFrame({"educ": educ})
    eta = -1.67 + 0.14 * educ
    if region:
        df["region"] = rng.choice(list("abcd"), size=n, p=[0.4, 0.3, 0.2, 0.1])
        eta = eta + df["region"].map({"a": 0.0, "b": 0.3, "c": -0.2, "d": 0.1}).to_numpy()
    df["married"] = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
    if rid:
        df.insert(0, "rid", np.arange(n))
    df.to_csv(path, index=False)
    return df


SURVEY = ["data=table", "data.target=married", "data.positive=1", "data.negative=0",
          "++data.numeric={educ: {lower: 1, upper: 16}}"]


def test_finding1_the_default_split_gives_the_row_id_splits_accuracy(tmp_path):
    """The survey table of 32 distinct rows: test accuracy 0.06 (majority 0.52) with the content-keyed
    split, whole (educ, married) combinations on the test side. The exact fit (no privacy, so no noise
    in the comparison) now has the same test accuracy as with a row-id split key, within 0.02."""
    _survey(tmp_path / "s.csv", 25_000, seed=3)
    _survey(tmp_path / "r.csv", 25_000, seed=3, rid=True)
    accs = []
    for name, extra in (("s", []), ("r", ["data.split_key=[rid]"])):
        run = _run(tmp_path / f"run_{name}",
                   ["experiment=logit_nonprivate", *SURVEY, f"data.path={tmp_path}/{name}.csv", *extra])
        accs.append(json.loads((run / "private" / "metrics.json").read_text())["test/acc"])
    assert abs(accs[0] - accs[1]) < 0.02 and accs[0] > 0.55, accs


def _income(path: Path, n: int, seed: int) -> pd.DataFrame:
    """Census-like income ~ educ + age (the study's design, scripts/table_numbers_study.py)."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(n, 2)) @ np.linalg.cholesky([[1.0, 0.3], [0.3, 1.0]]).T
    educ = np.clip(np.round(13 + 3 * u[:, 0]), 1, 16)
    age = np.clip(np.round(45 + 14 * u[:, 1]), 18, 90)
    income = 40_000 + 3000 * educ + 500 * age + rng.gamma(1.5, 40_000, size=n) - 60_000
    df = pd.DataFrame({"educ": educ, "age": age, "income": np.clip(income, 0, 200_000)})
    df.to_csv(path, index=False)
    return df


INCOME = ["experiment=linreg", "data=table", "data.target=income", "++data.target_bounds={lower: 0, upper: 200000}",
          "++data.numeric={educ: {lower: 1, upper: 16}, age: {lower: 18, upper: 90}}"]


def _ols(df: pd.DataFrame, run: Path) -> tuple[pd.Series, pd.Series]:
    """statsmodels' OLS on the run's training rows (recomputed by the public split rule)."""
    from omegaconf import OmegaConf

    from dptrain.data import schema_from_config
    from dptrain.data.split import split_scores

    cfg = OmegaConf.load(run / ".hydra" / "resolved_config.yaml")
    schema = schema_from_config(cfg.data)
    tr = df[split_scores(df, schema, seed=int(cfg.seed)) >= schema.test_fraction]
    fit = sm.OLS(tr.income, sm.add_constant(tr[["educ", "age"]])).fit()
    return fit.params.rename({"const": "(Intercept)"}), fit.bse.rename({"const": "(Intercept)"})


def test_finding2_linreg_publishes_the_sufficient_statistics_estimate_not_an_unconverged_one(tmp_path):
    """experiment=linreg on income ~ educ + age (N 20,000, epsilon 1) held DP-SGD's model after 10
    epochs at lr 0.2: 5-6 OLS standard errors off, privacy or not, and nothing said so. The preset now
    releases the noisy sufficient statistics (estimator=ssp): the estimates are within 5 OLS standard
    errors (in the study, within 2 in >= 90% of tables), the intervals claimed; with privacy off the
    table is statsmodels' OLS exactly."""
    df = _income(tmp_path / "i.csv", 20_000, seed=5)
    run = _run(tmp_path / "dp", [*INCOME, f"data.path={tmp_path}/i.csv"])
    table = pd.read_csv(run / "coefficients.csv").set_index("term")
    params, bse = _ols(df, run)
    assert table.method.str.startswith("ssp").all() and table.claimed.all()
    assert ((table.estimate - params).abs() <= 5 * bse).all(), (table.estimate, params, bse)
    exact = pd.read_csv(_run(tmp_path / "np", [*INCOME, f"data.path={tmp_path}/i.csv", "privacy=none"])
                        / "coefficients.csv").set_index("term")
    np.testing.assert_allclose(exact.estimate, params[exact.index], rtol=1e-6)
    np.testing.assert_allclose(exact.std_error, bse[exact.index], rtol=1e-6)
    assert exact.method.str.startswith("NON-PRIVATE ordinary least squares").all()


def test_finding3_the_flagship_spends_nothing_on_intervals_it_cannot_claim(tmp_path, caplog):
    """experiment=logit on Adult (104 terms) printed '[WARNING] intervals NOT CLAIMED' first in every run
    and spent a quarter of epsilon on them. The plan (public numbers only) now finds that no interval
    could be claimed: one plain line says so, no WARNING, and the run's epsilon is DP-SGD's alone."""
    caplog.set_level(logging.INFO, logger="dptrain")
    run = _run(tmp_path / "run", ["experiment=logit", "privacy.target_epsilon=1", "trainer.epochs=2"])
    report = json.loads((run / "privacy.json").read_text())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    plan = [r.getMessage() for r in caplog.records if r.getMessage().startswith("coefficient intervals: none")]
    assert len(plan) == 1 and "DP-SGD gets the whole epsilon" in plan[0]
    assert report["estimator"]["intervals"].startswith("none computed")
    from dptrain.privacy.accounting import history_epsilon
    from dptrain.privacy.curves import history_between

    curve = report["dp_curves"]
    history = history_between(sigma=report["noise_multiplier"], sigma_c=curve["noise_multiplier"],
                              sample_rate=report["sample_rate"], start=0, end=report["steps"],
                              log_every=curve["log_every"])
    assert report["epsilon"] == pytest.approx(history_epsilon(history, delta=report["delta"]), rel=1e-9)
    assert 0.99 <= report["epsilon"] <= 1.0  # the whole target (to sigma's tolerance), to DP-SGD and its curve


def test_finding4_every_output_agrees_on_each_terms_claim(tmp_path, caplog):
    """privacy.json said 'claimed: true' while coefficients.csv had every interval blank. Now one table
    per run: coefficients.csv, privacy.json (its table and its summary), model.pt (load_model) and the
    console agree on each term's claim and reason."""
    caplog.set_level(logging.INFO, logger="dptrain")
    _survey(tmp_path / "s.csv", 25_000, seed=7, region=True)
    run = _run(tmp_path / "run", ["experiment=logit", *SURVEY, f"data.path={tmp_path}/s.csv",
                                  "++data.categorical={region: [a, b, c, d]}", "privacy.target_epsilon=1"])
    csv = pd.read_csv(run / "coefficients.csv").set_index("term")
    est = json.loads((run / "privacy.json").read_text())["estimator"]
    inside = pd.DataFrame(est["coefficients_table"]).set_index("term")
    loaded = load_model(run).coefficients()
    for other in (inside, loaded):
        assert other.claimed.astype(bool).tolist() == csv.claimed.tolist()
        assert other.reason.tolist() == csv.reason.tolist()
    check = est["validity_check"]
    assert check["terms_claimed"] == int(csv.claimed.sum()) and check["claimed"] == bool(csv.claimed.any())
    assert csv.loc[~csv.claimed, "std_error"].isna().all() and csv.loc[csv.claimed, "std_error"].notna().all()
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("coefficients:")][0]
    n = int(csv.claimed.sum())
    assert (n == len(csv) and "intervals CLAIMED ->" in line) or f"intervals CLAIMED for {n}, NOT for" in line or (
        n == 0 and "NOT CLAIMED" in line), line
    text = (run / "privacy.txt").read_text()
    assert f"{check['terms_claimed']} of {check['terms']} terms claimed" in text or "every term's interval" in text


def test_finding5_a_non_private_run_is_the_exact_glm_with_aliased_terms_marked(tmp_path):
    """experiment=logit_nonprivate: a RuntimeWarning, 'intervals CLAIMED' with SEs of 667,304 on a
    collinear design, 'privacy noise included' with privacy off, and test accuracy 0.31-0.83 over three
    runs (an unstable SGD fit). Now: statsmodels' GLM to 1e-6, described as NON-PRIVATE, a second coding
    of a variable marked aliased (NA), and the same model in every run."""
    rng = np.random.default_rng(11)
    n = 6000
    df = pd.DataFrame({"age": rng.uniform(20, 70, n), "region": rng.choice(list("abc"), n)})
    df["region_code"] = df.region.map({"a": 1, "b": 2, "c": 3})  # a second coding: aliased given region
    eta = -2 + 0.04 * df.age + df.region.map({"a": 0.0, "b": 0.5, "c": -0.4})
    df["y"] = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
    df.to_csv(tmp_path / "t.csv", index=False)
    over = ["experiment=logit_nonprivate", "data=table", f"data.path={tmp_path}/t.csv", "data.target=y",
            "data.positive=1", "data.negative=0", "++data.categorical={region: [a, b, c]}",
            "++data.numeric={age: {lower: 20, upper: 70}, region_code: {lower: 1, upper: 3}}"]
    tables = [pd.read_csv(_run(tmp_path / f"run{k}", over) / "coefficients.csv").set_index("term") for k in (0, 1)]
    table = tables[0]
    pd.testing.assert_frame_equal(tables[0], tables[1])  # no noise, no optimiser's luck: one answer
    assert table.method.str.startswith("NON-PRIVATE").all() and "privacy noise" not in " ".join(table.method)
    # the declared order decides which coding goes, as in R: numeric columns come first in the design, so
    # region_code is estimated and the last level of region it determines is aliased (NA)
    # (and the <other> level, without rows, is NA too, as R reports a column of zeros)
    aliased = table.index[table.reason.str.startswith("aliased")].tolist()
    assert aliased == ["region[c] vs a", "region[<other>] vs a"] and table.loc[aliased, "estimate"].isna().all()
    assert not table.loc[aliased, "claimed"].any() and table.drop(index=aliased).claimed.all()
    from omegaconf import OmegaConf

    from dptrain.data import schema_from_config
    from dptrain.data.split import split_scores

    cfg = OmegaConf.load(tmp_path / "run0" / ".hydra" / "resolved_config.yaml")
    tr = df[split_scores(df, schema_from_config(cfg.data), seed=0) >= 0.25]
    x = sm.add_constant(pd.get_dummies(tr[["age", "region_code", "region"]], drop_first=True, dtype=float))
    glm = sm.GLM(tr.y, x.drop(columns="region_c"), family=sm.families.Binomial()).fit()
    names = {"const": "(Intercept)", "region_b": "region[b] vs a"}
    for term, value in glm.params.rename(names).items():
        assert table.loc[term, "estimate"] == pytest.approx(value, rel=1e-6)
        assert table.loc[term, "std_error"] == pytest.approx(glm.bse.rename(names)[term], rel=1e-6)


def test_finding6_results_objects_load_from_every_linear_run(tmp_path):
    """load_model(run).coefficients(), .conf_int() and .summary() failed on every command-line run
    ('not linear': model.pt kept no table). Now they return the run's table for logit, linreg (ssp) and
    multiclass runs, the same numbers as coefficients.csv."""
    _survey(tmp_path / "s.csv", 4000, seed=1)
    _income(tmp_path / "i.csv", 4000, seed=2)
    runs = {"logit": _run(tmp_path / "logit", ["experiment=logit", *SURVEY, f"data.path={tmp_path}/s.csv",
                                               "privacy.target_epsilon=2", "trainer.epochs=2"]),
            "linreg": _run(tmp_path / "linreg", [*INCOME, f"data.path={tmp_path}/i.csv"]),
            "multiclass": _run(tmp_path / "mc", ["experiment=multiclass", "trainer.epochs=1"])}
    for name, run in runs.items():
        model = load_model(run)
        table = model.coefficients()
        csv = pd.read_csv(run / "coefficients.csv").set_index("term")
        assert table.index.tolist() == csv.index.tolist(), name
        np.testing.assert_allclose(table.estimate.to_numpy(), csv.estimate.to_numpy(), rtol=1e-8)  # csv: 10 digits
        ci = model.conf_int()
        assert list(ci.columns) == ["lower", "upper"] and ci.index.tolist() == csv.index.tolist()
        assert csv.index[0] in model.summary() and "guarantee:" in model.summary()
    mlp = _run(tmp_path / "mlp", ["experiment=mlp", "trainer.epochs=0.2"])
    with pytest.raises(Exception, match="not linear"):
        load_model(mlp).coefficients()


def test_finding7_the_console_shows_the_runs_total_and_its_shares(tmp_path, caplog, capsys):
    """privacy.target_epsilon=1 printed 'calibrated noise_multiplier=3.77 for target_epsilon=0.75' and
    the progress bar ended at eps=0.745 while the report said 0.99. Now the calibration line names the
    run's target and the shares as shares of it, and the bar shows the spend against the run's total."""
    caplog.set_level(logging.INFO, logger="dptrain")
    _survey(tmp_path / "s.csv", 25_000, seed=2)
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=logit", *SURVEY, f"data.path={tmp_path}/s.csv",
                                                       "privacy.target_epsilon=1", "trainer.progress=true"])
    cli.run(cfg, run_dir=tmp_path / "run")
    messages = [r.getMessage() for r in caplog.records]
    calibrated = [m for m in messages if m.startswith("calibrated noise_multiplier")]
    assert len(calibrated) == 1 and "for the run's target_epsilon=1 " in calibrated[0], calibrated
    assert "the coefficient intervals 0.25" in calibrated[0] and "target_epsilon=0.75" not in " ".join(messages)
    bar = capsys.readouterr().err
    assert "/1]" in bar and "eps=" in bar  # the spend so far against the run's total
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert 0.99 <= report["epsilon"] <= 1.0


def test_finding7_a_fit_without_residuals_says_so_instead_of_a_ratio_of_1e297():
    """One DPLinearRegression fit printed 'privacy-noise variance / sampling variance = 1.36e+297': a
    term without sampling variance (every residual 0). The check now says that in words."""
    from dptrain.privacy.newton_terms import term_claims

    one = np.ones((1, 1))
    claims = term_claims(np.eye(1), identified=np.array([0]), covariances=(np.zeros((1, 1)), one, one),
                         sd_hessian=0.0, step=None, run_ok=(True, ""))
    assert not claims.claimed[0] and "infinite (no sampling variance" in claims.reasons[0]
    assert "e+" not in claims.reasons[0]
