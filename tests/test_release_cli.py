"""The release task end to end: experiment=mos_atlas files, sweeps, user tables, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain import cli

SMALL = ["data.n_cells=120", "release.tail_epsilons=[1,4]"]


def _run(overrides: list[str], run_dir: Path) -> float:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return cli.run(cfg, run_dir=run_dir)


def test_mos_atlas_writes_every_file(tmp_path):
    _run(["experiment=mos_atlas", *SMALL], tmp_path)
    for name in ("release.csv", "release.json", "comparison.csv", "comparison.md", "fig1_local_sensitivity.png",
                 "fig2_ls_vs_n.png", "error_vs_n.png", "downstream_slopes.png", "tail_vs_epsilon.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rel = pd.read_csv(tmp_path / "release.csv")
    assert len(rel) == 120
    assert {"theta_released", "se_released", "n_released", "noise_sd", "released", "reason"} <= set(rel.columns)
    assert not {"theta", "se", "n", "theta_true"} & set(rel.columns)  # never the true values
    released = rel[rel.released]
    assert np.allclose(released.n_released, np.round(released.n_released))
    meta = json.loads((tmp_path / "release.json").read_text())
    assert "NOT differentially private" in meta["privacy"]
    assert meta["epsilon"]["theta"] == 1.0 and meta["epsilon"]["total_per_cell"] == 3.0
    assert meta["neighbours"] == "add_remove" and meta["chi"][0]["chi"] > 0
    assert sum(meta["cells_not_released"].values()) == int((~rel.released).sum())
    assert all(r for r in rel.loc[~rel.released, "reason"])  # every unreleased cell says why
    comp = pd.read_csv(tmp_path / "comparison.csv")
    methods = set(comp.method)
    assert {"mos", "suppression_5", "suppression_10", "suppression_20", "ss_laplace", "noisy_stats",
            "theil_sen", "theil_sen_wide", "dp_gd", "dp_sgd"} <= methods
    assert set(comp.band) >= {"all", "[1,20)"}
    assert "NOT differentially private" in (tmp_path / "comparison.md").read_text()


def test_seeded_release_is_reproducible_and_seed_changes_noise(tmp_path):
    args = ["experiment=mos_atlas", *SMALL, "release.compare=false", "release.figures=false"]
    _run(args, tmp_path / "a")
    _run(args, tmp_path / "b")
    _run([*args, "release.seed=1"], tmp_path / "c")  # same data (seed=0), other noise seed
    a, b, c = (pd.read_csv(tmp_path / p / "release.csv") for p in ("a", "b", "c"))
    pd.testing.assert_frame_equal(a, b)
    both = a.released & c.released
    assert both.sum() > 50 and (a.theta_released[both] != c.theta_released[both]).mean() > 0.9
    assert np.allclose(a.noise_sd[both], c.noise_sd[both])  # same chi, same scale
    meta = json.loads((tmp_path / "a" / "release.json").read_text())
    assert "seed=0" in meta["randomness"]


def test_min_n_rule_and_chi_by_group(tmp_path):
    _run(["experiment=mos_atlas", *SMALL, "release.compare=false", "release.figures=false",
          "release.min_n=10", "release.chi_by=[state]"], tmp_path)
    rel = pd.read_csv(tmp_path / "release.csv")
    meta = json.loads((tmp_path / "release.json").read_text())
    assert len(meta["chi"]) > 1 and all("group" in c for c in meta["chi"])
    assert rel.groupby("group").chi.nunique().max() == 1
    assert "N < release.min_n = 10" in set(rel.reason)


def test_user_table_release(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    df = pd.DataFrame({"county": rng.integers(0, 30, n), "sex": rng.choice(["F", "M"], n),
                       "parent_rank": rng.random(n)})
    df["kid_rank"] = np.clip(0.3 + 0.4 * df.parent_rank + 0.15 * rng.standard_normal(n), 0, 1)
    df.to_stata(tmp_path / "micro.dta", write_index=False)
    _run(["task=release", "data=table", f"data.path={tmp_path / 'micro.dta'}", "release.x=parent_rank",
          "release.y=kid_rank", "release.cells=[county,sex]", "release.statistic=slope", "release.seed=3",
          "release.neighbors=add", "release.noise=normal", "release.compare=false", "release.figures=false"],
         tmp_path)
    rel = pd.read_csv(tmp_path / "release.csv")
    assert len(rel) == 60 and {"county", "sex"} <= set(rel.columns)
    meta = json.loads((tmp_path / "release.json").read_text())
    assert meta["statistic"] == "slope" and meta["neighbours"] == "add" and meta["noise"] == "normal"


@pytest.mark.parametrize("extra,needle", [
    (["release.epsilon=0"], "release.epsilon"),
    (["release.epsilon=-1"], "release.epsilon"),
    (["release.x=nope"], "release.x"),
    (["release.cells=[nope]"], "release.cells"),
    (["release.min_n=1"], "release.min_n"),
    (["release.domain.x_hi=-1"], "release.domain.x"),
    (["release.statistic=p50"], "release.statistic"),
])
def test_bad_release_input_refused_by_name(extra, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _run(["experiment=mos_atlas", *SMALL, *extra], tmp_path)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "release.csv").exists()


def test_bad_tables_refused(tmp_path, capsys):
    one_cell = pd.DataFrame({"cell": [1] * 10, "x": np.linspace(0, 1, 10), "y": np.linspace(0, 1, 10)})
    one_cell.to_csv(tmp_path / "one.csv", index=False)
    outside = pd.DataFrame({"cell": [1, 2] * 10, "x": np.linspace(0, 2, 20), "y": 0.5})
    outside.to_csv(tmp_path / "out.csv", index=False)
    empty = tmp_path / "empty.csv"
    empty.write_text("cell,x,y\n")
    cases = [(one_cell, "one.csv", [], "1 cell"), (outside, "out.csv", ["release.clip=false"], "outside the declared domain"),
             (None, "empty.csv", [], "0 rows")]
    for _, name, extra, needle in cases:
        with pytest.raises(SystemExit):
            _run(["task=release", "data=table", f"data.path={tmp_path / name}", "release.compare=false",
                  "release.figures=false", *extra], tmp_path / name)
        err = capsys.readouterr().err
        assert needle in err, (name, err)
        assert not (tmp_path / name / "release.csv").exists()


def test_custom_statistic_through_the_cli(tmp_path, monkeypatch):
    (tmp_path / "userstats.py").write_text(
        "import numpy as np\n\ndef mean_y(x, y):\n    return float(np.mean(y))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _run(["experiment=mos_atlas", "data.n_cells=30", "release.statistic=custom",
          "release.stat_fn=userstats:mean_y"], tmp_path / "out")
    rel = pd.read_csv(tmp_path / "out" / "release.csv")
    meta = json.loads((tmp_path / "out" / "release.json").read_text())
    assert "NOT differentially private" in meta["privacy"] and meta["stat_fn"] == "userstats:mean_y"
    # the mean of y in [0, 1] moves by at most 1/(n+1) (add) or 1/(n-1) (remove): N LS <= n/(n-1) <= 1.5
    assert rel.chi.dropna().max() <= 1.5 + 1e-9
    with pytest.raises(SystemExit):
        _run(["experiment=mos_atlas", "data.n_cells=30", "release.statistic=custom"], tmp_path / "bad")
