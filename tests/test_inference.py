"""Coefficient tables and their intervals (dptrain.inference): the original-scale transform
against statsmodels, the t interval's arithmetic and coverage, the partition, the whole run's
epsilon against an independent dp-accounting computation, ssp's sensitivity, noise and coverage,
the run folder, and the refusals."""

from __future__ import annotations

import dataclasses
import json
import math

import dp_accounting
import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from scipy import stats

import dptrain.tasks.cli  # noqa: F401  (registers the config schema)
from dptrain.core.validation import ConfigError
from dptrain.data.encoding import encode_features
from dptrain.data.schema import schema_from_config
from dptrain.inference.coefficients import (
    coefficient_map,
    coefficients,
    encoder_for,
    encoder_from_schema,
    model_coefficients,
    table_terms,
    term_labels,
)
from dptrain.inference.intervals import aggregate_parts
from dptrain.inference.run import check_estimator, check_estimator_size
from dptrain.inference.ssp import calibrate, centre, release, sensitivity, ssp_estimate, target_weight
from dptrain.inference.subsample import part_mechanism, random_parts
from dptrain.privacy.randomness import Randomness, new_seed_file
from dptrain.tasks.plan import training_plan

DECL = {
    "target": "y",
    "numeric": {"age": {"lower": 17, "upper": 90}, "gain": {"lower": 0, "upper": 5000, "transform": "log1p"}},
    "categorical": {"sex": ["F", "M"], "region": ["N", "S", "E"]},
}


def _frame(n: int, rng: np.random.Generator) -> pd.DataFrame:
    return pd.DataFrame({
        "age": rng.uniform(17, 90, n), "gain": rng.uniform(0, 5000, n),
        "sex": rng.choice(["F", "M", "X"], n), "region": rng.choice(["N", "S", "E", "W"], n),
    })


def _statsmodels_terms(params: pd.Series) -> dict[str, float]:
    """statsmodels' names -> ours (region W is our <other> level)."""
    names = {"Intercept": "(Intercept)", "age": "age", "np.log1p(gain)": "log1p(gain)"}
    out = {}
    for k, v in params.items():
        if k.startswith("C("):
            col = k.split(",")[0][2:]
            level = k.split("[T.")[1].rstrip("]")
            ref = DECL["categorical"][col][0]
            level = "<other>" if level in ("X", "W") else level
            out[f"{col}[{level}] vs {ref}"] = v
        else:
            out[names[k]] = v
    return out


def test_original_scale_coefficients_equal_statsmodels_treatment_coded_ols():
    """A least-squares fit on the ENCODED features (no privacy: isolates the transform) mapped to
    the original scale equals statsmodels' OLS on the raw columns with treatment coding against
    the first declared level, to the float32 rounding of the encoded features."""
    rng = np.random.default_rng(0)
    df = _frame(400, rng)
    df["y"] = (0.03 * df.age - 0.4 * np.log1p(df.gain) + 1.5 * (df.sex == "M") - 0.7 * (df.region == "E")
               + rng.normal(0, 1, len(df)))
    schema = schema_from_config(DECL)
    x = encode_features(df, schema).astype(np.float64)
    design = np.concatenate([np.ones((len(df), 1)), x], axis=1)  # over-parametrised: min-norm solution
    theta = np.linalg.lstsq(design, df.y.to_numpy(), rcond=None)[0]
    enc = encoder_from_schema(schema, kind="linear")
    ours = dict(zip(term_labels(enc), coefficients(theta[1:], theta[:1], enc), strict=True))
    raw = df.assign(sex=df.sex.where(df.sex.isin(["F", "M"]), "X"))
    fit = smf.ols("y ~ age + np.log1p(gain) + C(sex, Treatment('F')) + C(region, Treatment('N'))", raw).fit()
    ref = _statsmodels_terms(fit.params)
    assert set(ours) == set(ref)
    for term, value in ref.items():
        assert ours[term] == pytest.approx(value, rel=1e-5, abs=1e-7), term  # the encoder stores float32


def test_target_scale_and_log1p_labels():
    """Linear regression on a target scaled to [0, 1] by (lo, hi): every coefficient times
    (hi - lo), the intercept plus lo; the predictions on raw values agree with the model's."""
    schema = schema_from_config(DECL)
    enc = encoder_from_schema(schema, kind="linear", target_scale=(-10.0, 30.0))
    rng = np.random.default_rng(1)
    df = _frame(50, rng)
    w, b = rng.normal(size=enc.n_features), 0.3
    scaled = encode_features(df, schema).astype(np.float64) @ w + b
    t = dict(zip(term_labels(enc), coefficients(w, np.array([b]), enc), strict=True))
    pred = (t["(Intercept)"] + t["age"] * df.age + t["log1p(gain)"] * np.log1p(df.gain)
            + np.where(df.sex == "M", t["sex[M] vs F"], 0) + np.where(df.sex == "X", t["sex[<other>] vs F"], 0)
            + np.select([df.region == "S", df.region == "E", df.region == "W"],
                        [t["region[S] vs N"], t["region[E] vs N"], t["region[<other>] vs N"]], 0))
    np.testing.assert_allclose(pred, -10 + 40 * scaled, rtol=1e-5, atol=1e-4)  # float32 features
    assert "log1p(gain)" in term_labels(enc)


def test_multinomial_terms_are_contrasts_against_the_first_class():
    """Class k vs class 0: invariant to adding one vector to every class (the over-parametrised
    softmax), and equal to the map of the difference of the two classes' parameters."""
    schema = schema_from_config(DECL)
    enc = encoder_from_schema(schema, kind="multinomial", classes=["a", "b", "c"])
    rng = np.random.default_rng(2)
    w, b = rng.normal(size=(3, enc.n_features)), rng.normal(size=3)
    got = coefficients(w, b, enc)
    shifted = coefficients(w + rng.normal(size=enc.n_features), b + 5.0, enc)
    np.testing.assert_allclose(got, shifted, atol=1e-10)
    m = coefficient_map(enc)
    want = np.concatenate([m @ np.r_[b[k] - b[0], w[k] - w[0]] for k in (1, 2)])
    np.testing.assert_allclose(got, want, atol=1e-12)
    terms = table_terms(enc, 3)
    assert len(terms) == len(got) and terms[0] == "b vs a: (Intercept)" and terms[-1].startswith("c vs a: ")


def test_aggregate_parts_closed_form():
    """mean, SE = sd/sqrt(K) with ddof 1, mean +- t_{K-1, 0.975} SE."""
    iv = aggregate_parts(np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 10.0], [4.0, 10.0]]), level=0.95)
    se = math.sqrt(5 / 3) / 2  # sd of 1..4 is sqrt(5/3)
    t = 3.182446305284263  # t_{3, 0.975}
    np.testing.assert_allclose(iv.estimate, [2.5, 10.0])
    np.testing.assert_allclose(iv.std_error, [se, 0.0])
    np.testing.assert_allclose(iv.lower, [2.5 - t * se, 10.0])
    np.testing.assert_allclose(iv.upper, [2.5 + t * se, 10.0])
    assert float(stats.t.ppf(0.975, 3)) == pytest.approx(t, rel=1e-12)


def test_subsample_interval_covers_at_its_level():
    """Statistical: the t interval over K normal part estimates covers their mean in 95% of 4,000
    replications (binomial sd 0.0034; tolerance 4 sd), K = 5 and 20, skewed sd per term."""
    rng = np.random.default_rng(3)
    for k in (5, 20):
        draws = rng.normal(1.5, [0.1, 3.0], size=(4000, k, 2))
        iv = aggregate_parts(draws.transpose(1, 0, 2).reshape(k, -1))  # each (replication, term) a column
        cover = ((iv.lower <= 1.5) & (1.5 <= iv.upper)).reshape(4000, 2).mean(axis=0)
        assert np.all(np.abs(cover - 0.95) < 4 * math.sqrt(0.95 * 0.05 / 4000)), (k, cover)


def test_parts_are_random_subsamples_even_of_a_table_of_few_distinct_rows(tmp_path):
    """Issue 31: a survey-like table has few distinct rows (here 32: 16 education levels x married).
    A partition keyed by content put identical rows in one part (parts all married or all not);
    each row's part is now an independent uniform draw from the run's secret randomness, so every
    part's make-up matches the table's, and the sizes are balanced."""
    rng = np.random.default_rng(4)
    educ = rng.integers(1, 17, size=20000)
    married = (rng.uniform(size=20000) < 1 / (1 + np.exp(-(-1.2 + 0.14 * educ)))).astype(np.float32)
    assert len({(e, m) for e, m in zip(educ, married)}) <= 32
    parts = random_parts(20000, parts=10, randomness=Randomness.fresh())
    counts = np.bincount(parts, minlength=10)
    assert stats.chisquare(counts).pvalue > 1e-4
    share = np.array([married[parts == k].mean() for k in range(10)])
    # each part's married share within 4.5 binomial SEs of the whole table's
    se = np.sqrt(married.mean() * (1 - married.mean()) / counts)
    assert np.all(np.abs(share - married.mean()) < 4.5 * se), share
    table = np.array([[np.mean(educ[parts == k] == e) for e in range(1, 17)] for k in range(10)])
    assert stats.chi2_contingency(table * counts[:, None]).pvalue > 1e-4  # education mix the same in every part
    # two fresh runs: two partitions; one seed file on the same rows: the same partition
    assert not np.array_equal(random_parts(20000, parts=10, randomness=Randomness.fresh()), parts)
    key = new_seed_file(tmp_path / "key")
    a = Randomness.from_seed_file(key, run_label="t").for_data("rows")
    b = Randomness.from_seed_file(key, run_label="t").for_data("rows")
    np.testing.assert_array_equal(random_parts(100, parts=3, randomness=a), random_parts(100, parts=3, randomness=b))


def test_a_part_fit_on_a_table_of_few_distinct_rows_estimates_the_whole_tables_slope():
    """The cause found in issue 31: with content-keyed parts, non-private fits of the parts gave
    26.8, -0.25 and 0.26 for a slope of 0.14. With random parts every part's non-private logistic
    fit is close to the whole table's."""
    rng = np.random.default_rng(5)
    educ = rng.integers(1, 17, size=25000).astype(float)
    married = (rng.uniform(size=25000) < 1 / (1 + np.exp(-(-1.2 + 0.14 * educ)))).astype(float)
    parts = random_parts(25000, parts=3, randomness=Randomness.fresh())
    whole = sm.Logit(married, sm.add_constant(educ)).fit(disp=0).params[1]
    for k in range(3):
        rows = parts == k
        slope = sm.Logit(married[rows], sm.add_constant(educ[rows])).fit(disp=0).params[1]
        assert abs(slope - whole) < 0.03, (k, slope, whole)


def _compose(overrides, *more):
    """The checked-config object of each list of overrides (one Hydra initialisation)."""
    base = ["experiment=logit", "data=synthetic", "trainer.progress=false", "trainer.baseline=false"]
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        out = [OmegaConf.to_object(compose(config_name="config", overrides=[*base, *o])) for o in (overrides, *more)]
    return out[0] if not more else out


def _run(tmp_path, overrides):
    from dptrain.tasks.train import run_task

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=logit", "data=synthetic", "trainer.progress=false", "trainer.baseline=false",
            "logger.tensorboard=false", *overrides])
    run_task(cfg, run_dir=tmp_path)
    return json.loads((tmp_path / "privacy.json").read_text())


def _n_train(n_rows: int) -> int:
    """The public N of data=synthetic with n_rows (the hash split's training rows)."""
    from dptrain.data import load_dataset

    return load_dataset(_compose([f"data.n_rows={n_rows}"]).data, seed=0).n_train


def test_whole_run_epsilon_is_one_parts_epsilon_by_independent_dp_accounting(tmp_path):
    """subsample_aggregate: privacy.json's epsilon (estimate AND interval) equals dp-accounting's
    epsilon of ONE part's steps, built here from the public N, K, B and epochs: q = B_part /
    N_part with N_part = floor(N/K), B_part = round(B N_part / N)."""
    report = _run(tmp_path, ["data.n_rows=4000", "estimator=subsample_aggregate", "estimator.parts=4",
                             "estimator.min_part_rows=200",
                             "trainer.epochs=1", "trainer.batch_size=256", "privacy.noise_multiplier=1.1"])
    n = _n_train(4000)  # the public N, computed independently
    n_part = report["dataset_size"]
    assert n_part == n // 4
    b_part = round(256 / n * n_part)
    assert report["expected_batch_size"] == b_part
    q, steps = b_part / n_part, round(1 / (b_part / n_part))
    assert report["steps"] == steps
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.1)), steps)
    assert report["epsilon"] == pytest.approx(acc.get_epsilon(report["delta"]), rel=1e-9)
    assert 0 < report["epsilons"]["pld"] <= report["epsilon"]  # the tight accountant of the same events
    est = report["estimator"]
    assert est["name"] == "subsample_aggregate" and est["parts"] == 4
    assert report["guarantee"].startswith(f"({report['epsilon']:.4g}, ") and "parallel composition" in est["guarantee"]
    table = pd.read_csv(tmp_path / "coefficients.csv")
    assert list(table.columns) == ["term", "estimate", "std_error", "ci_lower", "ci_upper", "claimed", "reason",
                                   "method"]
    # 1,000 rows per part at this epsilon: NOT claimed, so no interval is published (issue 42: the table
    # held intervals nobody vouched for)
    assert not table.claimed.any() and table.std_error.isna().all() and table.ci_lower.isna().all()
    # the published estimates are the original-scale coefficients of the published (averaged) model
    from dptrain.tasks.predict import load_model

    layer = load_model(tmp_path).module[0]
    enc = encoder_from_schema(schema_from_config({"target": "y", "numeric": {
        f"x{i}": {"lower": -1, "upper": 1} for i in range(10)}}))
    np.testing.assert_allclose(table.estimate, coefficients(layer.weight.detach().numpy(),
                                                            layer.bias.detach().numpy(), enc), rtol=1e-6, atol=1e-7)
    assert "coefficients.csv" in report["files"]["publishable"]
    assert "coefficients.csv" in (tmp_path / "FILES.txt").read_text()
    assert "95% lower" in (tmp_path / "privacy.txt").read_text()
    check = est["validity_check"]  # 1,000 rows per part at this epsilon (< 2): not claimed, and said
    assert not check["claimed"] and check["value"] == pytest.approx(n_part * report["epsilon"])
    assert "this run: NOT CLAIMED" in (tmp_path / "privacy.txt").read_text()
    # the parts are fitted without a checkpoint: FILES.txt lists only what the folder holds
    assert not (tmp_path / "private" / "checkpoint.pt").exists()
    assert "checkpoint.pt" not in (tmp_path / "FILES.txt").read_text()
    assert "private/checkpoint.pt" not in report["files"]["private"]


def test_multinomial_subsample_aggregate_end_to_end(tmp_path):
    """experiment=multiclass with estimator=subsample_aggregate: one block of terms per class
    against the first (Wife), each with an interval around its estimate; the estimates are the
    coefficients of the published (averaged) model; the run's validity check is reported."""
    from dptrain.tasks.predict import load_model
    from dptrain.tasks.train import run_task

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=multiclass", "estimator=subsample_aggregate", "estimator.parts=4", "trainer.epochs=1",
            "trainer.progress=false", "trainer.baseline=false", "logger.tensorboard=false"])
    run_task(cfg, run_dir=tmp_path)
    report = json.loads((tmp_path / "privacy.json").read_text())
    table = pd.read_csv(tmp_path / "coefficients.csv")
    classes = ["Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"]
    prefixes = table.term.str.split(": ").str[0]
    assert list(dict.fromkeys(prefixes)) == [f"{c} vs Wife" for c in classes]
    check = report["estimator"]["validity_check"]
    if check["claimed"]:
        assert (table.ci_lower < table.estimate).all() and (table.estimate < table.ci_upper).all()
    else:  # an interval the run does not claim is not published
        assert table.ci_lower.isna().all() and not table.claimed.any()
    assert table.method.str.contains("mean of 4 part estimates").all()
    enc = encoder_for(training_plan(OmegaConf.to_object(cfg)))
    np.testing.assert_allclose(table.estimate, model_coefficients(load_model(tmp_path).module, enc).ravel(),
                               rtol=1e-5, atol=1e-6)
    check = report["estimator"]["validity_check"]
    assert check["value"] == pytest.approx(report["dataset_size"] * report["epsilon"])
    assert check["claimed"] == (check["value"] >= 8000)


def test_dpsgd_table_has_no_interval_and_mlp_has_no_table(tmp_path):
    report = _run(tmp_path / "a", ["data.n_rows=2000", "trainer.epochs=1", "estimator.interval_share=0"])
    table = pd.read_csv(tmp_path / "a" / "coefficients.csv")
    assert table.std_error.isna().all() and table.ci_lower.isna().all()
    assert table.method.str.contains("no interval").all()
    assert report["estimator"]["intervals"].startswith("none computed")
    assert table.term.tolist() == ["(Intercept)"] + [f"x{i}" for i in range(10)]
    assert "private/checkpoint.pt" in report["files"]["private"]  # dpsgd writes one and lists it
    assert "private/checkpoint.pt" in (tmp_path / "a" / "FILES.txt").read_text()
    report = _run(tmp_path / "b", ["data.n_rows=2000", "trainer.epochs=1", "model=mlp"])
    assert not (tmp_path / "b" / "coefficients.csv").exists()
    assert "coefficients.csv" not in report["files"]["publishable"]


def test_dpsgd_estimator_trains_exactly_like_fit(tmp_path):
    """estimator=dpsgd (the default) is dptrain.training.fit.fit, unchanged: same secret seed file and
    settings -> bit-for-bit the same weights."""
    from dptrain.data import load_dataset
    from dptrain.inference.run import run_estimator
    from dptrain.privacy.randomness import Randomness, new_seed_file
    from dptrain.runfolder.tracking import Tracker
    from dptrain.settings.train import validate_against_size
    from dptrain.tasks.registry import validate
    from dptrain.training.fit import LaunchConfig, fit, mechanism_for

    key = new_seed_file(tmp_path / "secret.key")
    cfg = _compose(["data.n_rows=1000", "trainer.epochs=1", "trainer.batch_size=100"])
    validate(cfg)
    data = load_dataset(cfg.data, seed=0)
    delta = validate_against_size(cfg, data.n_train)
    out = []
    for how in ("fit", "estimator"):
        launch = LaunchConfig(randomness=Randomness.from_seed_file(key, run_label="x"))
        tracker = Tracker(tmp_path / how, tensorboard=False)
        if how == "fit":
            plan = training_plan(cfg)
            res = fit(plan, data, mechanism=mechanism_for(plan, dataset_size=data.n_train, delta=delta),
                      tracker=tracker, launch=launch)
        else:
            res = run_estimator(training_plan(cfg), data, delta=delta, tracker=tracker, launch=launch)
        out.append(torch.cat([p.detach().flatten() for p in res.model.parameters()]))
    assert torch.equal(out[0], out[1])


def _upper_norms(c: np.ndarray) -> np.ndarray:
    """Per row c: the L2 norm of the upper triangle (diagonal included) of c c', entry by entry."""
    iu = np.triu_indices(c.shape[1])
    return np.sqrt(((c[:, :, None] * c[:, None, :])[:, iu[0], iu[1]] ** 2).sum(axis=1))


def test_ssp_sensitivity_bounds_every_centred_row_and_is_attained():
    """Delta bounds, entry by entry, the change of the released upper triangle when one centred
    row c = (1, x, y) - m is added, over real rows and every corner of the box; a corner attains it."""
    schema = schema_from_config(DECL)
    enc = encoder_from_schema(schema, kind="linear", target_scale=(0, 1))
    m, k = centre(enc), target_weight(enc)
    # the target enters on [0, k], k from the schema's shape (issue 42: X'y's noise per unit of y is smallest there)
    assert m.tolist() == [0, 0.5, 0.5] + [1 / 3] * 3 + [1 / 4] * 4 + [k / 2] and 2.0 < k < 3.5
    rng = np.random.default_rng(5)
    x = encode_features(_frame(1000, rng), schema).astype(np.float64)
    z = np.concatenate([np.ones((len(x), 1)), x, k * rng.uniform(0, 1, (len(x), 1))], 1)
    assert _upper_norms(z - m).max() <= sensitivity(enc) + 1e-12
    corners = []  # numeric and target at 0 or 1, every level of each block
    for bits in range(8):
        for s_lvl in range(3):
            for r_lvl in range(4):
                row = np.zeros(len(m))
                row[0], row[1], row[2], row[-1] = 1, bits & 1, (bits >> 1) & 1, k * ((bits >> 2) & 1)
                row[3 + s_lvl] = row[6 + r_lvl] = 1
                corners.append(row)
    norms = _upper_norms(np.asarray(corners) - m)
    assert norms.max() == pytest.approx(sensitivity(enc), rel=1e-12)
    # per unit of y, X'y's noise Delta / k is below the uncentred bound ||z||^2 / 2.2
    assert sensitivity(enc) / k < 0.45 * (2 + 2 + 2)
    from dptrain.inference.ssp import _feature_sums

    sq, quart = _feature_sums(enc)
    noise_per_y = [math.sqrt(((sq + w * w / 4) ** 2 + quart + w**4 / 16) / 2) / w for w in (1.0, k, 0.8 * k, 1.25 * k)]
    assert noise_per_y[1] == min(noise_per_y) and noise_per_y[1] < 0.8 * noise_per_y[0]


def test_ssp_without_noise_is_ols_and_its_centring_is_a_reparametrisation():
    """Closed form: with (almost) no noise the estimate is statsmodels' OLS on the raw columns
    (treatment coding), although the release centres every column."""
    schema = schema_from_config(DECL)
    enc = encoder_from_schema(schema, kind="linear", target_scale=(-10.0, 30.0))
    rng = np.random.default_rng(11)
    df = _frame(3000, rng)
    df["y"] = 2 + 0.1 * df.age + 0.8 * np.log1p(df.gain) + (df.sex == "M") * 1.5 + rng.normal(0, 2, len(df))
    fit = ssp_estimate(encode_features(df, schema).astype(np.float64), (df.y.to_numpy() + 10) / 40, enc,
                       noise_multiplier=1e-12, draws=100, rng=np.random.default_rng(0))
    d2 = df.assign(sex=df.sex.where(df.sex.isin(["F", "M"]), "X"), region=df.region.where(
        df.region.isin(["N", "S", "E"]), "W"))
    ols = smf.ols("y ~ age + np.log1p(gain) + C(sex, Treatment('F')) + C(region, Treatment('N'))", d2).fit()
    ref = _statsmodels_terms(ols.params)
    labels = term_labels(enc)
    for term, value in ref.items():
        assert fit.interval.estimate[labels.index(term)] == pytest.approx(value, rel=1e-6, abs=1e-8), term


def test_validity_check_rule():
    """Coverage is claimed when (rows per fit) x epsilon reaches the estimator's threshold (ssp
    2,000; subsample_aggregate 8,000), from public numbers only."""
    from dptrain.inference.run import validity_check

    assert validity_check("ssp", epsilon=1.0, dataset_size=2000)["claimed"]
    assert not validity_check("ssp", epsilon=0.5, dataset_size=2000)["claimed"]
    sa = validity_check("subsample_aggregate", epsilon=4.0, dataset_size=20009, parts=10)
    assert sa["claimed"] and sa["value"] == 8000.0 and "floor(N / K)" in sa["rule"]
    low = validity_check("subsample_aggregate", epsilon=1.0, dataset_size=20000, parts=10)
    assert not low["claimed"] and "NOT claimed" in low["why"] and "fewer parts" in low["why"]
    assert not validity_check("ssp", epsilon=None, dataset_size=10**6)["claimed"]


def test_ssp_noise_scale_and_calibration():
    """The released matrix's noise: symmetric, N(0, (s Delta)^2) per entry on and above the
    diagonal (2,000 draws: sd within 6%); s's epsilon by an independent dp-accounting PLD is at
    the target, and the exact Gaussian delta (Balle & Wang 2018) at that epsilon is <= delta."""
    rng = np.random.default_rng(6)
    noise = np.stack([release(np.zeros((0, 2)), np.zeros(0), noise_std=3.0, rng=rng) for _ in range(200)])
    np.testing.assert_array_equal(noise, np.swapaxes(noise, 1, 2))
    upper = noise[:, np.triu_indices(4)[0], np.triu_indices(4)[1]].ravel()
    assert upper.std() == pytest.approx(3.0, rel=0.06) and abs(upper.mean()) < 4 * 3.0 / math.sqrt(upper.size)
    s = calibrate(target_epsilon=1.0, delta=1e-5, accountant="pld", rtol=1e-3)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(s))
    assert pld.get_epsilon(1e-5) == pytest.approx(1.0, abs=2e-3)
    exact = stats.norm.cdf(0.5 / s - s) - math.e * stats.norm.cdf(-0.5 / s - s)
    assert exact <= 1e-5 * 1.01
    assert calibrate(target_epsilon=1.0, delta=1e-5, accountant="rdp") > s  # RDP is looser, more noise


def test_ssp_interval_covers_the_true_coefficients():
    """Statistical: linear regression, N = 5,000, epsilon 1: the bootstrap interval of each term
    covers the true coefficient in 95% of 250 replications (binomial tolerance: 4 sd)."""
    schema = schema_from_config({"target": "y", "numeric": {"a": {"lower": 0, "upper": 10},
                                                            "b": {"lower": -5, "upper": 5}},
                                 "categorical": {"g": ["p", "q"]}})
    enc = encoder_from_schema(schema, kind="linear", target_scale=(-20.0, 20.0))
    s = calibrate(target_epsilon=1.0, delta=1e-5, accountant="rdp")
    truth = np.array([1.0, 0.5, -0.8, 2.0, 0.0])  # intercept, a, b, g[q], g[<other>]
    rng = np.random.default_rng(7)
    hits, reps = np.zeros(5), 250
    for _ in range(reps):
        n = 5000
        df = pd.DataFrame({"a": rng.uniform(0, 10, n), "b": rng.uniform(-5, 5, n), "g": rng.choice(["p", "q"], n)})
        y = truth[0] + truth[1] * df.a + truth[2] * df.b + truth[3] * (df.g == "q") + rng.normal(0, 2, n)
        fit = ssp_estimate(encode_features(df, schema).astype(np.float64), (np.clip(y, -20, 20) + 20) / 40, enc,
                           noise_multiplier=s, draws=300, rng=rng)
        iv = fit.interval
        hits += (iv.lower <= truth) & (truth <= iv.upper)
    cover = hits[:4] / reps  # g[<other>] has no rows: its estimate is all noise around 0
    assert np.all(np.abs(cover - 0.95) < 4 * math.sqrt(0.95 * 0.05 / reps)), cover


def test_refusals_name_the_setting_value_and_what_is_allowed():
    ssp, parts, one, mlp, bogus = _compose(
        ["estimator=ssp", "privacy.noise_multiplier=null", "privacy.target_epsilon=1"],
        ["estimator=subsample_aggregate", "estimator.parts=20"], ["estimator=subsample_aggregate", "estimator.parts=1"],
        ["estimator=subsample_aggregate", "model=mlp"], ["estimator.name=bogus"])
    with pytest.raises(ConfigError, match=r"estimator='ssp' is not allowed: estimates linear regression only, "
                       r"not objective=binary.*allowed"):
        check_estimator(training_plan(ssp))
    check_estimator(training_plan(parts))
    with pytest.raises(ConfigError, match=r"estimator.parts=20 is not allowed for N = 15000 training rows: each "
                       r"part would have about 750 rows, fewer than estimator.min_part_rows=1000; "
                       r"allowed: estimator.parts <= 15"):
        check_estimator_size(training_plan(parts), 15000)
    check_estimator_size(training_plan(parts), 20000)
    with pytest.raises(ConfigError, match=r"estimator.parts=1 is not allowed: must be an integer in \[2, 1000\]"):
        check_estimator(training_plan(one))
    with pytest.raises(ConfigError, match=r"estimator='subsample_aggregate' is not allowed: needs a linear model"):
        check_estimator(training_plan(mlp))
    with pytest.raises(ConfigError, match=r"estimator.name='bogus' is not allowed: must be one of dpsgd, "
                       r"subsample_aggregate, ssp"):
        check_estimator(training_plan(bogus))


def test_part_mechanism_uses_public_numbers_only():
    from dptrain.privacy.budget import Budget
    from dptrain.training.plan import EstimatorSpec, Loop

    plan = training_plan(_compose(["estimator=subsample_aggregate"]))
    plan = dataclasses.replace(plan, budget=Budget(noise_multiplier=1.0), loop=Loop(epochs=2, batch_size=300),
                               estimator=EstimatorSpec(name="subsample_aggregate", parts=10))
    m = part_mechanism(plan, dataset_size=30_001, delta=1e-6)
    assert (m.dataset_size, m.expected_batch_size) == (3000, 30)
    assert m.planned_steps == 200 and m.noise_multiplier == 1.0


@pytest.mark.slow  # Adult's 108 encoded columns: an eigendecomposition per bootstrap draw
def test_ssp_run_reports_its_gaussian_mechanism(tmp_path):
    """estimator=ssp end to end (Adult, target hours_per_week): privacy.json's epsilon equals an
    independent dp-accounting RDP epsilon of ONE GaussianDpEvent(sigma), at most the target; the
    sensitivity is 2 + 4 numeric + 8 categorical columns; the table has intervals."""
    from dptrain.tasks.train import run_task

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=linreg", "estimator=ssp", "estimator.bootstrap=100", "privacy.noise_multiplier=null",
            "privacy.target_epsilon=1", "trainer.progress=false", "trainer.baseline=false",
            "logger.tensorboard=false"])
    run_task(cfg, run_dir=tmp_path)
    report = json.loads((tmp_path / "privacy.json").read_text())
    sigma = report["noise_multiplier"]
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma))
    assert report["epsilon"] == pytest.approx(acc.get_epsilon(report["delta"]), rel=1e-9)
    assert 0.99 <= report["epsilon"] <= 1.0
    est = report["estimator"]

    delta_s = sensitivity(encoder_for(training_plan(OmegaConf.to_object(cfg))))
    assert est["name"] == "ssp" and est["sensitivity"] == pytest.approx(delta_s) and 2 < delta_s < 14
    assert est["noise_std"] == pytest.approx(delta_s * sigma)
    assert est["validity_check"]["claimed"] and "CLAIMED" in (tmp_path / "privacy.txt").read_text()
    assert "GaussianDpEvent" in report["guarantee"]
    table = pd.read_csv(tmp_path / "coefficients.csv")
    assert (table.std_error > 0).all() and (table.ci_lower <= table.estimate).all()
    assert table.term.iloc[1] == "age" and table.method.str.startswith("ssp").all()


def test_ssp_refuses_a_target_without_public_bounds():
    from dptrain.inference.ssp import ssp_config_check

    enc = encoder_from_schema(schema_from_config(DECL), kind="linear")
    with pytest.raises(ConfigError, match=r"estimator=ssp is not allowed without data.target_bounds.*allowed"):
        ssp_config_check(enc)
