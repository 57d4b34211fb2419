"""Issue 44: no refusal may depend on one row. For every task that reads a user's table (train, tune,
audit, predict, release, tabulate, synthesize; topdown and lodes read simulators only), a table
and the same table without one row run alike: the table's only positive row, and the only row of a
declared category. Before, a table with exactly one positive row was released and the same table
without it refused (exit 2, no folder): whether a release happened told the neighbours apart with
probability 1. Each pair below runs both tables through the command line and compares outcomes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.tasks import cli

SCHEMA = ["data=table", "data.target=y", "data.positive=yes", "data.negative=no",
          "++data.numeric={x: {lower: 0, upper: 1}}", "++data.categorical={c: [u, v, w]}"]
QUICK = ["trainer.epochs=1", "trainer.batch_size=20", "trainer.progress=false"]
#: per task: the settings of a small run, and the file that says it ran
TASKS = {
    "train": (["experiment=logit", *QUICK, "trainer.baseline=true", "estimator.interval_share=0.25"], "privacy.json"),
    "tune": (["task=tune", "experiment=logit", "tune=lr_clip", "tune.mean=2", "privacy.target_epsilon=1", *QUICK],
             "privacy.json"),
    "audit": (["experiment=audit_logit", "audit.canaries=40", *QUICK], "audit.json"),
    "tabulate": (["task=tabulate", "tabulate.marginals=2", "tabulate.bins=4"], "privacy.json"),
    "synthesize": (["task=synthesize", "synthesize.bins=4"], "synthetic.csv"),
}


def _table(n: int = 120, seed: int = 0) -> pd.DataFrame:
    """Rows with both classes and the categories u, v (w is declared; the cases below plant it)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n).round(4)
    return pd.DataFrame({"x": x, "c": rng.choice(["u", "v"], n), "y": np.where(x + rng.normal(0, 0.3, n) > 0.5,
                                                                            "yes", "no")})


def _pair(case: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(a table with the row, the same table without it): ``positive``: the table's ONLY row of
    the positive label; ``category``: the only row of the declared category w."""
    df = _table()
    if case == "positive":
        df["y"] = "no"
        df.loc[7, "y"] = "yes"
    else:
        df.loc[7, "c"] = "w"
    return df, df.drop(index=7).reset_index(drop=True)


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _outcome(overrides: list[str], run: Path, capsys) -> str:
    """'ran' or 'refused <status>: <message>' of one command-line run."""
    try:
        cli.run(_compose(overrides), run_dir=run)
    except SystemExit as stop:
        return f"refused {stop.code}: {capsys.readouterr().err.strip()}"
    return "ran"


@pytest.mark.parametrize("case", ["positive", "category"])
@pytest.mark.parametrize("task", list(TASKS))
def test_a_table_and_its_neighbour_without_one_row_run_alike(task, case, tmp_path, capsys):
    settings, marker = TASKS[task]
    outcomes = []
    for name, df in zip(("with", "without"), _pair(case)):
        path = tmp_path / f"{name}.csv"
        df.to_csv(path, index=False)
        outcomes.append(_outcome([*settings, *SCHEMA, f"data.path={path}"], tmp_path / name, capsys))
        if outcomes[-1] == "ran":
            assert (tmp_path / name / marker).is_file(), (task, case, name)
    assert outcomes == ["ran", "ran"], outcomes


@pytest.mark.parametrize("case", ["positive", "category"])
def test_predict_scores_a_table_and_its_neighbour_alike(case, tmp_path, capsys):
    """task=predict reads a table of rows to score (the target is not read): the pair scores alike,
    every other row's prediction unchanged (one prediction per input row)."""
    base = tmp_path / "base.csv"
    _table(seed=1).to_csv(base, index=False)
    model = tmp_path / "model"
    assert _outcome(["experiment=logit", *QUICK, *SCHEMA, f"data.path={base}"], model, capsys) == "ran"
    frames = []
    for name, df in zip(("with", "without"), _pair(case)):
        path = tmp_path / f"{name}.csv"
        df.drop(columns="y").to_csv(path, index=False)
        out = tmp_path / f"predict_{name}"
        assert _outcome(["task=predict", f"run={model}", f"data.path={path}"], out, capsys) == "ran"
        frames.append(pd.read_csv(out / "private" / "predictions.csv"))
    assert len(frames[0]) == len(frames[1]) + 1
    pd.testing.assert_frame_equal(frames[0].drop(index=7).reset_index(drop=True), frames[1])


@pytest.mark.parametrize("case", ["only row of a cell", "the row that makes a cell estimable"])
def test_release_of_a_table_and_its_neighbour_runs_alike(case, tmp_path, capsys):
    """task=release reads x, y and the cell columns of a table: a declared cell's only row, and the
    one row that gave the only estimable cell its release.min_n rows (the run refused the table
    without it before issue 44: 'no listed cell has at least 3 rows')."""
    rng = np.random.default_rng(2)
    if case == "only row of a cell":
        df = pd.DataFrame({"cell": rng.choice([1, 2], 60), "x": rng.uniform(0, 1, 60), "y": rng.uniform(0, 1, 60)})
        df.loc[7, "cell"] = 3
    else:  # cell 1 has exactly release.min_n = 3 rows (one of them row 7), cell 2 two, cell 3 none; 9 is not listed
        cells = [9, 1, 2, 9, 1, 2, 9, 1, 9]
        df = pd.DataFrame({"cell": cells, "x": rng.uniform(0, 1, 9), "y": rng.uniform(0, 1, 9)})
    released = []
    for name, table in zip(("with", "without"), (df, df.drop(index=7).reset_index(drop=True))):
        path = tmp_path / f"{name}.csv"
        table.to_csv(path, index=False)
        run = tmp_path / name
        outcome = _outcome(["task=release", "data=table", f"data.path={path}", "release.x=x", "release.y=y",
                            "release.cells=[cell]", "release.cell_values={cell: [1, 2, 3]}", "release.min_n=3",
                            "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}",
                            "release.method=ss_laplace", "release.epsilon_per_statistic=4",
                            "release.private_evaluation=false"],
                           run, capsys)
        assert outcome == "ran", (name, outcome)
        released.append(pd.read_csv(run / "release.csv"))
        assert json.loads((run / "release.json").read_text())["method"] == "ss_laplace"
    assert [len(r) for r in released] == [3, 3]  # every declared cell, released or not
