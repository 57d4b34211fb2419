"""Issue 46, item 4: ``release.epsilon`` was per statistic while its name said otherwise
(``release.method=dp_mos release.epsilon=4`` released at epsilon 12 in all). The setting is now
``release.epsilon_per_statistic``; the old key is refused by name, pointing to the new one; the
console's first line of a release gives the release's TOTAL epsilon and delta for the chosen
method, the total release.json states."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from test_release_methods import NoisyMeanY  # the toy method of the recipe

from dptrain.core.errors import DPTrainError
from dptrain.core.neighbours import Neighbours
from dptrain.release.methods import RELEASE_METHODS
from dptrain.settings.command_line import renamed_settings
from dptrain.settings.release import ReleaseRunConfig
from dptrain.tasks import cli
from dptrain.tasks.registry import check_known_keys, register_configs
from dptrain.tasks.release import run_task

SMALL = ["experiment=mos_atlas", "data.n_cells=80", "release.private_evaluation=false"]  # dp_mos: >= 68 cells
TOTAL = re.compile(r"^release: epsilon ([0-9.e+-]+), delta ([0-9.e+-]+) in all")


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


# ---------------------------------------------------------------- the old name is refused by name
@pytest.mark.parametrize("argv", [
    ["experiment=mos_atlas", "release.epsilon=4"],
    ["-m", "experiment=mos_atlas", "release.epsilon=4,8"],
])
def test_the_old_key_is_refused_with_the_new_name(argv, capsys):
    """Written key=value, Hydra cannot compose it: the command line's check names the new key."""
    with pytest.raises(SystemExit) as stop:
        cli.check_composition(argv)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.count("\n") == 0, err
    assert err.startswith("dptrain: error: release.epsilon=4 is refused: the setting was renamed "
                          "release.epsilon_per_statistic (it is the epsilon of EACH released statistic"), err
    assert "Write release.epsilon_per_statistic=4 instead" in err and "console's first line" in err


@pytest.mark.parametrize("override", ["+release.epsilon=4", "++release.epsilon=4"])
def test_the_old_key_added_with_plus_is_refused_too(override):
    """Added with + or ++, Hydra composes it: the schema check refuses it by name."""
    with pytest.raises(DPTrainError, match=r"^release\.epsilon=4 is refused: the setting was renamed "
                                           r"release\.epsilon_per_statistic \(it is the epsilon of EACH"):
        check_known_keys(_compose(["experiment=mos_atlas", override]))


def test_the_old_key_in_a_config_file_is_refused_too():
    """A config read from a file whose release section holds the old key (a user's own preset,
    release: {epsilon: 2}): the schema check refuses it by name too."""
    plain = OmegaConf.to_container(_compose(["experiment=mos_atlas"]))
    plain["release"]["epsilon"] = 2
    cfg = OmegaConf.create(plain)
    with pytest.raises(DPTrainError, match=r"release\.epsilon=2 is refused: the setting was renamed "
                                           r"release\.epsilon_per_statistic"):
        check_known_keys(cfg)
    assert renamed_settings(ReleaseRunConfig) == {
        "release.epsilon": ("release.epsilon_per_statistic", ReleaseRunConfig().release.RENAMED["epsilon"][1])}


def test_the_old_key_from_the_command_line_exits_2_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "dptrain", "experiment=mos_atlas", "release.method=dp_mos",
                          "release.epsilon=4", f"hydra.run.dir={run_dir}"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert "release.epsilon_per_statistic" in res.stderr and not run_dir.exists()


# ---------------------------------------------------------------- the first line gives the total
def _first_line(caplog) -> str:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("release")]
    assert lines and lines[-1].startswith("release written"), lines
    return lines[0]


def _total(tmp_path) -> dict:
    return json.loads((tmp_path / "release.json").read_text())["total"]


CASES = [  # (method, extra overrides, the total epsilon and delta at release.epsilon_per_statistic=2)
    ("dp_mos", [], (6.0, 1e-6)),
    ("dp_mos", ["release.dp_mos_split={n: 0.5, se: 0.5, chi: 0.5, test: 1.0, theta: 1.0}", "release.delta=1e-5"],
     (7.0, 1e-5)),
    ("mos", [], (6.0, 0.0)),
    ("ss_laplace", [], (2.0, 0.0)),
    ("noisy_stats", [], (4.0, 0.0)),  # replace-one: run at 2 x 2
    ("noisy_stats", ["release.statistic=slope"], (4.0 * 2 / 3, 0.0)),  # no intercept drawn
    ("theil_sen", ["release.theil_sen_variant=matchings", "release.theil_sen_k=3"], (4.0, 0.0)),
    ("dp_gd", [], (2.0, 1e-6)),
    ("suppression_10", [], (None, None)),
]


@pytest.mark.parametrize("method,extra,expected", CASES, ids=[f"{m}{'+' if e else ''}" for m, e, _ in CASES])
def test_the_first_line_gives_the_total_release_json_states(method, extra, expected, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dptrain")
    run_task(_compose([*SMALL, f"release.method={method}", "release.epsilon_per_statistic=2", *extra]),
             run_dir=tmp_path)
    first, total = _first_line(caplog), _total(tmp_path)
    assert f"release.method={method}" in first, first
    if expected[0] is None:
        assert first.startswith("release: no epsilon: NOT differentially private, the released values are EXACT")
        assert total["epsilon"] is None and "release.epsilon_per_statistic is not used" in first
        return
    eps, delta = map(float, TOTAL.match(first).groups())
    assert eps == pytest.approx(expected[0], rel=1e-5) and delta == pytest.approx(expected[1], rel=1e-12)
    assert total["epsilon"] == pytest.approx(expected[0], rel=1e-12)
    assert total["delta"] == pytest.approx(expected[1], rel=1e-12)
    assert "release.epsilon_per_statistic=2" in first
    assert ("NOT differentially private" in first) == (method == "mos")


@pytest.mark.parametrize("method,expected", [
    ("ss_laplace", (2.0 + 0.5, 1e-7)),
    # replace-one: the selection on replace-one footing by group privacy, (2 eps_s, (1 + e^eps_s) delta_s)
    ("noisy_stats", (4.0 + 1.0, (1 + math.exp(0.5)) * 1e-7)),
])
def test_the_first_line_composes_a_private_cell_selection(method, expected, tmp_path, caplog):
    """With release.cell_selection=private the first line's total includes the selection's
    (epsilon, delta), as release.json's total does (basic composition)."""
    caplog.set_level(logging.INFO, logger="dptrain")
    run_task(_compose([*SMALL, f"release.method={method}", "release.epsilon_per_statistic=2",
                       "release.cell_selection=private", "release.selection_epsilon=0.5",
                       "release.selection_delta=1e-7"]), run_dir=tmp_path)
    first, total = _first_line(caplog), _total(tmp_path)
    eps, delta = map(float, TOTAL.match(first).groups())
    assert eps == pytest.approx(expected[0], rel=1e-5) and delta == pytest.approx(expected[1], rel=1e-4)
    assert total["epsilon"] == pytest.approx(expected[0], rel=1e-12)
    assert total["delta"] == pytest.approx(expected[1], rel=1e-12)
    assert "with the private cell selection" in first


def test_a_method_whose_budget_disagrees_with_its_output_is_named(tmp_path, caplog):
    """A plugin method that spends other than its declared budget: release.json states what its
    output satisfies, and the log says the first line's total was not it."""

    class Overspender(NoisyMeanY):
        def budget(self, epsilon, config):
            return epsilon / 2, 0.0

    RELEASE_METHODS.register("overspender", Overspender())
    try:
        caplog.set_level(logging.INFO, logger="dptrain")
        run_task(_compose([*SMALL, "release.method=overspender"]), run_dir=tmp_path)
    finally:
        RELEASE_METHODS.unregister("overspender")
    said = [r.getMessage() for r in caplog.records]
    assert _total(tmp_path)["epsilon"] == 1.0 and Overspender.neighbours is Neighbours.ADD_REMOVE
    assert any("the total on the first line (epsilon 0.5, delta 0.0) is not release.json's (epsilon 1.0" in m
               for m in said), said


def test_the_total_comes_before_any_row_is_read(tmp_path, caplog):
    """On a user's table the first line is the total, before the rows' counts (the data holder's
    line, PRIVATE) and before a refusal of the data: it depends on the settings only."""
    caplog.set_level(logging.INFO, logger="dptrain")
    table = tmp_path / "rows.csv"
    table.write_text("x,y,cell\n" + "".join(f"{(i % 7) / 7},{(i % 5) / 5},{i % 3}\n" for i in range(60))
                     + "oops,0.5,1\n")
    run_task(_compose(["task=release", "data=table", f"data.path={table}", "data.nonfinite=drop",
                       "release.cell_values={cell: [0, 1, 2]}", "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}",
                       "release.method=ss_laplace", "release.epsilon_per_statistic=0.5"]), run_dir=tmp_path / "run")
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("release: epsilon 0.5, delta 0 in all (add_remove neighbours)"), said
    data_line = next(i for i, m in enumerate(said) if m.startswith("release data (PRIVATE counts"))
    cells_line = next(i for i, m in enumerate(said) if m.startswith("release cells: declared"))
    assert 0 < data_line and 0 < cells_line < len(said) - 1

    caplog.clear()
    with pytest.raises(DPTrainError):  # a bad file: refused after the total, which needs no row
        run_task(_compose(["task=release", "data=table", f"data.path={tmp_path / 'missing.csv'}",
                           "release.cell_values={cell: [0, 1, 2]}",
                           "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}"]), run_dir=tmp_path / "run2")
    assert caplog.records[0].getMessage().startswith("release: epsilon 3, delta 0 in all (conditional on chi")
