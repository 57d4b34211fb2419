"""task=topdown (experiment=topdown_sim, issue 33): the released tables are consistent nonnegative
integers with exact state totals and structural zeros; the report's epsilon is recomputed from
its per-level rho; the evaluation against the simulated truth stays under private/."""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.data.geography import simulate_geography
from dptrain.tasks import cli


def test_topdown_sim_releases_consistent_tables_and_states_its_epsilon(tmp_path):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=topdown_sim", "topdown.counties=60",
                                                         "topdown.population=300000"])
    run = tmp_path / "run"
    cli.run(cfg, run_dir=run)
    report = json.loads((run / "privacy.json").read_text())
    geo = simulate_geography(0, states=4, counties=60, population=300000)
    tables = {lv: pd.read_csv(run / "tables" / f"{lv}.csv").set_index("unit") for lv in geo.levels}
    for lv, below in zip(geo.levels[:-1], geo.levels[1:]):
        child = tables[below].to_numpy()
        parent = tables[lv].to_numpy()
        parents = np.asarray(geo.hierarchy.parents[geo.levels.index(below)])
        summed = np.zeros_like(parent)
        np.add.at(summed, parents, child)
        assert np.array_equal(summed, parent), (lv, below)  # children sum to their parent, cell by cell
    for lv in geo.levels:
        t = tables[lv].to_numpy()
        assert t.dtype.kind == "i" and t.min() >= 0 and (t[:, geo.hierarchy.structural_zeros] == 0).all()
    assert np.array_equal(tables["state"].to_numpy().sum(axis=1), geo.population(1))  # the invariant, exact
    rho = sum(lv["rho"] for lv in report["levels"])
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(rho))
    assert acc.get_epsilon(1e-6) == pytest.approx(report["epsilon"], rel=1e-9) and report["epsilon"] <= 5.0
    evaluation = pd.read_csv(run / "private" / "evaluation.csv")
    assert set(evaluation.method) == {"topdown", "bottom_up", "no_post_processing"}
    assert "private/evaluation.csv" in (run / "FILES.txt").read_text().split("PRIVATE")[1]
