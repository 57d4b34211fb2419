"""Issue 47, part B: TopDown and synthesis per unit of privacy. TopDown: a unit of at most k persons
moves each level's vectors by at most k in L2 (recomputed), every sigma is k times the one-person
one and the drawn noise has that spread; synthesis: every stage's sensitivity is k, so the run
spends rho / k^2 per row and reports k^2 times it per unit (its stages' sigmas recomputed)."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
from hydra import compose, initialize_config_module
from test_units_release import A_LEVELS, B_LEVELS, _attach_units, _groups, _panel

from dptrain.data.geography import simulate_geography
from dptrain.release.tables import topdown as td
from dptrain.release.zcdp import gaussian_rho
from dptrain.tasks import cli
from dptrain.tasks import synthesize as synthesize_task


def _compose_run(overrides: list[str], run_dir):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    cli.run(cfg, run_dir=run_dir)
    return json.loads((run_dir / "privacy.json").read_text())


def test_a_household_of_k_persons_moves_each_level_by_at_most_k_in_l2():
    """Recomputed on the simulated geography: k persons added to one tract (all in one cell, or in
    k distinct cells) change every level's whole (units x cells) matrix by k, resp. sqrt(k), in L2."""
    geo = simulate_geography(0, states=2, counties=6, population=20_000)
    k, tract = 4, 3
    allowed = np.flatnonzero(~geo.hierarchy.structural_zeros)
    for cells, expected in ((np.full(k, allowed[0]), k), (allowed[:k], math.sqrt(k))):
        added = np.zeros_like(geo.counts[-1])
        np.add.at(added, (np.full(k, tract), cells), 1)
        for level, moved in zip(geo.levels, geo.hierarchy.roll_up(added)):
            assert np.sqrt((moved.astype(float) ** 2).sum()) == pytest.approx(expected), level


def test_topdown_measurements_scale_sigma_by_the_sensitivity_and_draw_that_noise():
    geo = simulate_geography(0, states=2, counties=40, population=200_000)
    one = td.measure(geo, 0.5, shares=(1, 1, 1, 1), invariants="none")
    three = td.measure(geo, 0.5, shares=(1, 1, 1, 1), invariants="none", sensitivity=3)
    assert np.allclose(three.sigmas, 3 * np.asarray(one.sigmas)) and three.rho == pytest.approx(0.5) == one.rho
    allowed = ~geo.hierarchy.structural_zeros
    noise = (three.noisy[-1] - geo.counts[-1])[:, allowed].astype(float).ravel()
    sigma = three.sigmas[-1]
    assert noise.size > 2000 and abs(noise.std() - sigma) < 5 * sigma / math.sqrt(2 * noise.size)
    with pytest.raises(Exception, match="sensitivity"):
        td.measure(geo, 0.5, sensitivity=0.5)


def test_topdown_task_reports_the_unit_and_k_times_the_sigmas(tmp_path):
    base = ["experiment=topdown_sim", "topdown.counties=40", "topdown.population=200000"]
    one = _compose_run(base, tmp_path / "one")
    three = _compose_run([*base, "topdown.max_persons_per_unit=3"], tmp_path / "three")
    assert [lv["sigma"] for lv in three["levels"]] == pytest.approx([3 * lv["sigma"] for lv in one["levels"]])
    assert [lv["rho"] for lv in three["levels"]] == pytest.approx([lv["rho"] for lv in one["levels"]])
    for lv in three["levels"]:  # recomputed: rho = Delta_2^2 / (2 sigma^2) with Delta_2 = 3
        assert lv["l2_sensitivity"] == 3 and lv["rho"] == pytest.approx(9 / (2 * lv["sigma"] ** 2))
    assert three["epsilon"] == pytest.approx(one["epsilon"])
    assert three["unit_of_privacy"]["max_rows_per_unit"] == 3 and "at most 3 persons" in three["guarantee"]
    assert one["unit_of_privacy"]["l2_sensitivity"] == 1 and "group privacy" in one["unit_of_privacy"]["note"]


def test_topdown_refuses_a_bad_unit_size(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _compose_run(["experiment=topdown_sim", "topdown.max_persons_per_unit=0"], tmp_path / "run")
    assert "topdown.max_persons_per_unit" in capsys.readouterr().err


def test_synthesis_per_unit_spends_rho_over_k_squared_per_row(tmp_path, monkeypatch):
    """MST on a panel with data.privacy_unit=person, k = 3: the stages' rho (per row) sum to
    rho / 9, the report's rho is 9 times that (= the budget's rho), its epsilon dp-accounting's; the
    1-way stage's sigma is recomputed as k sqrt(d / (2 rho / 3)); synthetic.csv has no unit column;
    the dropped rows are counted in private/units.json only."""
    k = 3
    path, df = _panel(tmp_path, k_max=8, n_units=400)
    df = _attach_units(monkeypatch, synthesize_task, df)
    report = _compose_run(["task=synthesize", "data=table", f"data.path={path}", "data.target=y",
                           f"++data.numeric={{rid: {{lower: 0, upper: {len(df)}}}}}",
                           f"++data.categorical={{a: [{', '.join(A_LEVELS)}], b: [{', '.join(B_LEVELS)}]}}",
                           "data.privacy_unit=person", f"privacy.max_rows_per_unit={k}", "privacy.epsilon=2"],
                          tmp_path / "run")
    rho = gaussian_rho(2.0, 1e-6)
    per_row = sum(s["rho"] for s in report["stages"])
    assert per_row == pytest.approx(rho / k**2) and report["rho"] == pytest.approx(rho)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(report["rho"]))
    assert report["epsilon"] == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9) and report["epsilon"] <= 2.0 + 1e-9
    d = 4  # rid, a, b and the target
    assert report["stages"][0]["sigma"] == pytest.approx(k * math.sqrt(d / (2 * rho / 3)))
    unit = report["unit_of_privacy"]
    assert unit["column"] == "person" and unit["measurement_l2_sensitivity"] == k and "person" in report["neighbours"]
    synthetic = (tmp_path / "run" / "synthetic.csv").read_text().splitlines()[0]
    assert "person" not in synthetic
    private = json.loads((tmp_path / "run" / "private" / "units.json").read_text())
    assert private["rows_dropped"] == int(np.maximum(_groups(df).size() - k, 0).sum())


def test_lodes_states_its_units_of_privacy(tmp_path):
    """ER-EE's worker side: the simulated jobs carry no worker id, so the report says a job is the
    worker unit and a worker with m jobs is covered only by group privacy at m."""
    report = _compose_run(["experiment=lodes_sim", "lodes.establishments=2000"], tmp_path / "run")
    unit = report["unit_of_privacy"]
    assert "one job" in unit["worker"] and "group privacy at m" in unit["worker"]
    assert "one establishment" in unit["employer"]
