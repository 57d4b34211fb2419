"""The release task end to end: experiment=mos_atlas files, seed files, user tables, bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.tasks import cli

SMALL = ["data.n_cells=120", "release.tail_epsilons=[1,4]"]


TABLE_DOMAIN = "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}"


def _run(overrides: list[str], run_dir: Path) -> float:
    if "data=table" in overrides and not any(o.startswith("release.domain") for o in overrides):
        overrides = [*overrides, TABLE_DOMAIN]  # the PUBLIC domain is required for a table (ranks here)
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return cli.run(cfg, run_dir=run_dir)


def test_mos_atlas_writes_every_file(tmp_path):
    _run(["experiment=mos_atlas", *SMALL], tmp_path)
    ev = tmp_path / "private" / "evaluation"
    for name in ("comparison.csv", "comparison.md", "fig1_local_sensitivity.png", "fig2_ls_vs_n.png",
                 "error_vs_n.png", "downstream_slopes.png", "tail_vs_epsilon.png"):
        assert (ev / name).stat().st_size > 0, name
    # the top level holds only publishable files; everything exact is under private/
    top = {p.name for p in tmp_path.iterdir() if p.is_file()}
    assert top == {"release.csv", "release.json", "FILES.txt"}, top
    manifest = (tmp_path / "FILES.txt").read_text()
    for name in ("release.csv", "release.json", "private/dptrain.log", "private/evaluation/comparison.csv",
                 "private/evaluation/fig1_local_sensitivity.png"):
        assert name in manifest, name
    rel = pd.read_csv(tmp_path / "release.csv")
    assert len(rel) == 120  # every simulated cell (the simulator's design is public)
    assert {"theta_released", "se_released", "n_released", "noise_sd", "released", "reason"} <= set(rel.columns)
    assert not {"theta", "se", "n", "theta_true"} & set(rel.columns)  # never the true values
    released = rel[rel.released]
    assert np.allclose(released.n_released, np.round(released.n_released))
    meta = json.loads((tmp_path / "release.json").read_text())
    assert "NOT differentially private" in meta["privacy"] and "NOT differentially private" in meta["guarantee"]
    assert meta["epsilon"]["theta"] == 1.0 and meta["epsilon"]["total_per_cell"] == 3.0
    assert meta["neighbours"] == "add_remove" and meta["chi"][0]["chi"] > 0
    assert meta["cells"]["listed"] == 120 and meta["cells"]["released"] == int(rel.released.sum())
    assert sum(meta["cells"]["not_released"].values()) == int((~rel.released).sum())
    assert "CSPRNG" in meta["randomness"]
    assert all(r for r in rel.loc[~rel.released, "reason"])  # every unreleased cell says why
    comp = pd.read_csv(ev / "comparison.csv")
    methods = set(comp.method)
    assert {"mos", "suppression_5", "suppression_10", "suppression_20", "ss_laplace", "noisy_stats",
            "theil_sen", "theil_sen_wide", "dp_gd", "dp_sgd"} <= methods
    assert set(comp.band) >= {"all", "[1,20)"}
    assert "NOT differentially private" in (ev / "comparison.md").read_text()


def test_noise_seed_file_reproduces_and_default_is_fresh(tmp_path):
    """Default: two identical commands draw different noise. Opt-in: the same secret file and
    settings reproduce the release; other settings get another stream; no output holds the secret."""
    from dptrain.privacy.randomness import new_seed_file

    key = new_seed_file(tmp_path / "noise.key")
    secret = key.read_text().strip()
    args = ["experiment=mos_atlas", *SMALL, "release.private_evaluation=false"]
    _run(args, tmp_path / "fresh1")
    _run(args, tmp_path / "fresh2")
    _run([*args, f"privacy.noise_seed_file={key}"], tmp_path / "a")
    _run([*args, f"privacy.noise_seed_file={key}"], tmp_path / "b")
    _run([*args, f"privacy.noise_seed_file={key}", "release.min_n=4"], tmp_path / "c")
    f1, f2, a, b, c = (pd.read_csv(tmp_path / p / "release.csv") for p in ("fresh1", "fresh2", "a", "b", "c"))
    both = f1.released & f2.released
    assert both.sum() > 50 and (f1.theta_released[both] != f2.theta_released[both]).mean() > 0.9
    pd.testing.assert_frame_equal(a, b)
    both = a.released & c.released
    assert (a.theta_released[both] != c.theta_released[both]).mean() > 0.9  # another run: another stream
    meta = json.loads((tmp_path / "a" / "release.json").read_text())
    assert "REPRODUCIBLE" in meta["randomness"] and "REMOVE the noise" in meta["randomness"]
    for run in ("a", "b", "c"):
        for p in (tmp_path / run).rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes(), p


def test_noise_seed_file_inside_run_folder_refused(tmp_path, capsys):
    from dptrain.privacy.randomness import new_seed_file

    run = tmp_path / "run"
    run.mkdir()
    key = new_seed_file(run / "noise.key")
    with pytest.raises(SystemExit) as exc:
        _run(["experiment=mos_atlas", *SMALL, f"privacy.noise_seed_file={key}"], run)
    assert exc.value.code == 2
    assert "privacy.noise_seed_file" in capsys.readouterr().err
    assert not (run / "release.csv").exists()


def test_min_n_rule_and_chi_by_group(tmp_path):
    _run(["experiment=mos_atlas", *SMALL, "release.private_evaluation=false",
          "release.min_n=10", "release.chi_by=[state]"], tmp_path)
    rel = pd.read_csv(tmp_path / "release.csv")
    meta = json.loads((tmp_path / "release.json").read_text())
    assert len(meta["chi"]) > 1 and all("group" in c for c in meta["chi"])
    assert rel.groupby("group").chi.nunique().max() == 1
    assert "N < release.min_n = 10" in set(rel.reason)
    assert not (tmp_path / "private" / "evaluation").exists()


def test_user_table_release(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    df = pd.DataFrame({"county": rng.integers(0, 30, n), "sex": rng.choice(["F", "M"], n),
                       "parent_rank": rng.random(n)})
    df["kid_rank"] = np.clip(0.3 + 0.4 * df.parent_rank + 0.15 * rng.standard_normal(n), 0, 1)
    df.to_stata(tmp_path / "micro.dta", write_index=False)
    _run(["task=release", "data=table", f"data.path={tmp_path / 'micro.dta'}", "release.x=parent_rank",
          "release.y=kid_rank", "release.cells=[county,sex]", "release.statistic=slope",
          f"release.cell_values={{county: {list(range(31))}, sex: [F, M]}}",
          "release.neighbors=add", "release.noise=normal"], tmp_path)
    rel = pd.read_csv(tmp_path / "release.csv")
    assert len(rel) == 62 and {"county", "sex"} <= set(rel.columns)  # county 30 is declared, has no rows
    assert set(rel.loc[rel.county == 30, "released"]) == {False}
    meta = json.loads((tmp_path / "release.json").read_text())
    assert meta["statistic"] == "slope" and meta["neighbours"] == "add" and meta["noise"] == "normal"
    assert not (tmp_path / "private" / "evaluation").exists()  # real data: no private evaluation by default
    assert not list(tmp_path.rglob("*.png")) and not list(tmp_path.rglob("comparison*"))


@pytest.mark.parametrize("extra,needle", [
    (["release.epsilon_per_statistic=0"], "release.epsilon_per_statistic"),
    (["release.epsilon_per_statistic=-1"], "release.epsilon_per_statistic"),
    (["release.x=nope"], "release.x"),
    (["release.cells=[nope]"], "release.cells"),
    (["release.min_n=1"], "release.min_n"),
    (["release.domain.x_hi=-1"], "release.domain.x"),
    (["release.statistic=p50"], "release.statistic"),
    (["release.method=nope"], "release.method='nope' is not allowed: must be one of mos, dp_mos, suppression_5"),
])
def test_bad_release_input_refused_by_name(extra, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _run(["experiment=mos_atlas", *SMALL, *extra], tmp_path)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "release.csv").exists()


def test_bad_rows_are_left_out_by_rule_and_counted(tmp_path, capsys, caplog):
    """Issue 44: rows outside release.domain with release.clip=false, and x entries that are no
    numbers, refused the table (a refusal that tells a table with one such row from its neighbour);
    a table whose listed cells have too few rows was refused too. Each now runs: the rows are left
    out by the stated rule, counted privately, and the cells without enough rows are not released."""
    outside = pd.DataFrame({"cell": [1, 2] * 10, "x": np.linspace(0, 2, 20), "y": 0.5})
    outside.to_csv(tmp_path / "out.csv", index=False)
    text = pd.DataFrame({"cell": [1, 2] * 10, "x": ["a"] * 20, "y": 0.5})
    text.to_csv(tmp_path / "text.csv", index=False)
    empty = tmp_path / "empty.csv"
    empty.write_text("cell,x,y\n")
    caplog.set_level(logging.INFO, logger="dptrain")
    cases = [("out.csv", ["release.clip=false"], {"domain": {"outside (release.clip=false)": 10}}, 10),
             ("text.csv", [], {"x": {"missing_or_not_a_number": 20}}, 20), ("empty.csv", [], {}, 0)]
    for name, extra, left, n_left in cases:
        run = tmp_path / "run" / name
        _run(["task=release", "data=table", f"data.path={tmp_path / name}", "release.cell_values={cell: [1, 2]}",
              *extra], run)
        released = pd.read_csv(run / "release.csv")
        assert len(released) == 2, name  # every listed cell, released or not
        rows = json.loads((run / "private" / "data_diagnostics.json").read_text())["rows"]
        assert rows["left_out"] == n_left and all(rows["left_out_by"][k] == v for k, v in left.items()), (name, rows)
        public = (run / "release.csv").read_text() + (run / "release.json").read_text()
        assert "not_listed_or_missing" not in public and "rows read" not in public
    assert "20 rows read, 0 used, 20 left out" in caplog.text and "dptrain check" in caplog.text
    with pytest.raises(SystemExit):  # data.nonfinite=error: the user's choice of a refusal
        _run(["task=release", "data=table", f"data.path={tmp_path / 'text.csv'}", "data.nonfinite=error",
              "release.cell_values={cell: [1, 2]}"], tmp_path / "run" / "strict")
    assert "non-numeric" in capsys.readouterr().err
    assert not (tmp_path / "run" / "strict" / "release.csv").exists()


def test_custom_statistic_through_the_cli(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="dptrain")
    (tmp_path / "userstats.py").write_text(
        "import numpy as np\n\ndef mean_y(x, y):\n    return float(np.mean(y))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _run(["experiment=mos_atlas", "data.n_cells=30", "release.statistic=custom",
          "release.stat_fn=userstats:mean_y", "release.private_evaluation=false"], tmp_path / "out")
    rel = pd.read_csv(tmp_path / "out" / "release.csv")
    meta = json.loads((tmp_path / "out" / "release.json").read_text())
    assert "NOT differentially private" in meta["privacy"] and meta["stat_fn"] == "userstats:mean_y"
    assert len(rel) == 30 and (tmp_path / "out" / "FILES.txt").exists()
    # issue 46: the first line gives the total (theta and N, no SE: 2 x release.epsilon_per_statistic), release.json's
    first = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("release"))
    assert first.startswith("release: epsilon 2, delta 0 in all (conditional on chi: NOT differentially private)")
    assert meta["total"]["epsilon"] == 2.0
    # the mean of y in [0, 1] moves by at most 1/(n+1) (add) or 1/(n-1) (remove): N LS <= n/(n-1) <= 1.5
    assert rel.chi.dropna().max() <= 1.5 + 1e-9
    with pytest.raises(SystemExit):
        _run(["experiment=mos_atlas", "data.n_cells=30", "release.statistic=custom"], tmp_path / "bad")
