"""The release-method registry: a toy method defined in this file is registered, selected with
``release.method=toy`` through the real config composition, run end to end by the release task's
entry point, and unregistered; unknown names are refused with the registered names listed.

This is the recipe of docs/release.md ("A new release method") in test form.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.core.errors import DPTrainError
from dptrain.core.neighbours import Neighbours
from dptrain.release.methods import RELEASE_METHODS, MethodResult, ReleaseMethod
from dptrain.release.methods.common import method_meta, reasons, result_frame
from dptrain.release.noise import add_noise, calibrate
from dptrain.tasks.registry import register_configs
from dptrain.tasks.release import run_task

SMALL = ["experiment=mos_atlas", "data.n_cells=60"]


class NoisyMeanY(ReleaseMethod):
    """Toy: per cell, (sum y + Laplace) / (N + Laplace), epsilon/2 each: epsilon-DP under
    add/remove (one row moves sum y by at most max|y| and N by 1)."""

    neighbours = Neighbours.ADD_REMOVE

    def run(self, est, *, epsilon, rng, config):
        cells, d = est.cells, est.cells.domain
        t_sum, step = calibrate(max(abs(d.y_lo), abs(d.y_hi)), epsilon / 2)
        noisy_sum = add_noise(cells.sy, t_sum, kind="laplace", rng=rng, step=step)
        noisy_n = add_noise(cells.n, 2.0 / epsilon, kind="laplace", rng=rng, step=1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            theta = noisy_sum / noisy_n
        frame = result_frame(reasons(cells.n_cells, [(noisy_n < 1, "noisy N < 1")]), theta, np.nan)
        meta = method_meta("noisy_mean_y", config.statistic, self.neighbours.value, epsilon, 0.0,
                           split="epsilon/2 to sum y, epsilon/2 to N", guarantee="epsilon-DP (pure), add/remove",
                           reference="a toy of tests/test_release_methods.py")
        return MethodResult(frame, meta)


class ReplaceOneToy(NoisyMeanY):
    """The same mechanism declared replace-one: the runner must run it at 2 epsilon."""

    neighbours = Neighbours.REPLACE_ONE


def _compose(overrides: list[str]):
    register_configs()  # the task schemas the config files extend (the CLI does this on import)
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture
def toy():
    RELEASE_METHODS.register("toy", NoisyMeanY())
    RELEASE_METHODS.register("toy_replace_one", ReplaceOneToy())
    try:
        yield
    finally:
        RELEASE_METHODS.unregister("toy")
        RELEASE_METHODS.unregister("toy_replace_one")


def test_toy_method_registered_selected_and_run_end_to_end(tmp_path, toy):
    objective = run_task(_compose([*SMALL, "release.method=toy", "release.private_evaluation=false"]),
                         run_dir=tmp_path)
    assert math.isnan(objective)  # no private evaluation: nothing exact leaves the run
    rel = pd.read_csv(tmp_path / "release.csv")
    meta = json.loads((tmp_path / "release.json").read_text())
    assert len(rel) == 60 and {"cell", "released", "reason", "theta_released"} <= set(rel.columns)
    assert rel.released.sum() > 30 and 0 < rel.loc[rel.released, "theta_released"].median() < 1  # y in [0, 1]
    assert meta["method"] == "toy" and meta["neighbours"] == "add_remove"
    assert meta["epsilon"] == 1.0 and meta["delta"] == 0.0 and "epsilon_add_remove_comparison" not in meta
    assert meta["guarantee"].startswith("epsilon-DP (pure), add/remove, at epsilon 1")
    assert meta["cells"]["listed"] == 60 and meta["cells"]["released"] == int(rel.released.sum())
    assert "release.json" in (tmp_path / "FILES.txt").read_text()


def test_epsilon_normalisation_is_generic(tmp_path, toy):
    """A replace-one method runs at 2 epsilon by its declaration alone, and says so."""
    run_task(_compose([*SMALL, "release.method=toy_replace_one", "release.epsilon_per_statistic=0.5",
                       "release.private_evaluation=false"]), run_dir=tmp_path)
    meta = json.loads((tmp_path / "release.json").read_text())
    assert meta["neighbours"] == "replace_one" and meta["epsilon"] == 1.0
    assert meta["epsilon_add_remove_comparison"] == 0.5 and meta["details"]["epsilon"] == 1.0


def test_toy_method_joins_the_private_evaluation(tmp_path, toy):
    """The evaluation compares every registered method: the toy too, with no code naming it."""
    rmse = run_task(_compose([*SMALL, "release.method=toy", "release.tail_epsilons=[1]"]), run_dir=tmp_path)
    comp = pd.read_csv(tmp_path / "private" / "evaluation" / "comparison.csv")
    assert list(dict.fromkeys(comp.method))[:2] == ["mos", "toy"]  # MOS first, then the released method
    assert {"toy", "toy_replace_one", "ss_laplace", "dp_sgd"} <= set(comp.method)
    md = (tmp_path / "private" / "evaluation" / "comparison.md").read_text()
    assert "toy (add_remove, epsilon 1)" in md and "toy_replace_one (replace_one, epsilon 2)" in md
    assert rmse == pytest.approx(float(comp.query("method == 'toy' and band == 'all'").rmse_truth.iloc[0]))


def test_unknown_method_refused_with_the_registered_names(tmp_path, toy):
    with pytest.raises(DPTrainError) as err:
        run_task(_compose([*SMALL, "release.method=nope"]), run_dir=tmp_path)
    msg = str(err.value)
    assert "release.method='nope' is not allowed" in msg
    assert all(name in msg for name in RELEASE_METHODS.names()) and "toy" in msg
    assert not (tmp_path / "release.csv").exists()


def test_unregistered_toy_is_refused_again(tmp_path):
    assert "toy" not in RELEASE_METHODS
    with pytest.raises(DPTrainError, match="release.method='toy'"):
        run_task(_compose([*SMALL, "release.method=toy"]), run_dir=tmp_path)


def test_builtin_methods_declare_their_relation_and_guarantee():
    declared = {name: (RELEASE_METHODS.get(name).neighbours, RELEASE_METHODS.get(name).has_guarantee)
                for name in RELEASE_METHODS}
    assert declared == {
        "mos": (Neighbours.ADD_REMOVE, False),  # the default; release.neighbors=add changes it
        "suppression_5": (None, False), "suppression_10": (None, False), "suppression_20": (None, False),
        "ss_laplace": (Neighbours.ADD_REMOVE, True), "noisy_stats": (Neighbours.REPLACE_ONE, True),
        "theil_sen": (Neighbours.REPLACE_ONE, True), "theil_sen_wide": (Neighbours.REPLACE_ONE, True),
        "dp_gd": (Neighbours.ADD_REMOVE, True), "dp_sgd": (Neighbours.ADD_REMOVE, True),
        "dp_mos": (Neighbours.ADD_REMOVE, True),
    }
