"""scripts/person_level_study.py (issue 47's study, experiments/person_level/): the example-level
runs' calibration to a person-level epsilon is privacy/group.py's group level, and the study's
quick mode writes its outputs: the membership attack's power on a person-level run is within the
DP bound of its (eps, delta) per person while the same attack on an example-level run breaks the
bound of its per-row (eps, delta)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dptrain.privacy.accounting import rdp_curve, rdp_to_epsilon
from dptrain.privacy.events import poisson_gaussian
from dptrain.privacy.group import approx_dp_group, group_level, rdp_group_epsilon

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "person_level_study.py"


def _load():
    spec = importlib.util.spec_from_file_location("person_level_study_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


st = _load()


@pytest.mark.parametrize("k, target", [(5, 2.0), (20, 1.0), (20, 4.0)])
def test_example_level_run_calibrated_to_its_group_level_for_k_rows(k, target):
    """The (sigma, per-row delta) the study gives an example-level run: privacy/group.py's level of
    that run for k rows is (at most target, at most 1e-6) and tight (a 1% smaller sigma, or a 1%
    larger per-row delta, misses it)."""
    q, steps = 0.03, 100
    sigma, d = st.calibrate_group(target, q, steps, k)
    history = ((poisson_gaussian(sample_rate=q, noise_multiplier=sigma), steps),)
    e = rdp_to_epsilon(rdp_curve(history), d)
    level = group_level(e, d, k, history)
    assert level == {key: st.group_of_run(sigma, q, steps, k, d)[key] for key in level}
    assert target / 1.01 < level["epsilon"] <= target
    assert level["delta"] == pytest.approx(st.PERSON_DELTA, rel=1e-6) and level["delta"] <= st.PERSON_DELTA
    assert level["delta"] == approx_dp_group(e, d, k)[1]  # the (k e, k e^((k-1) e) d) rule's delta
    assert st.group_of_run(sigma / 1.01, q, steps, k, d)["epsilon"] > target
    e_up = rdp_to_epsilon(rdp_curve(history), d * 1.01)
    assert approx_dp_group(e_up, d * 1.01, k)[1] > st.PERSON_DELTA
    # the tighter of the two rules, at the same delta
    assert level["epsilon"] == min(k * e, rdp_group_epsilon(rdp_curve(history), level["delta"], k))


def test_clopper_pearson_bounds():
    lo, hi = st.clopper_pearson(10, 100)
    ref = stats.binomtest(10, 100).proportion_ci(confidence_level=0.98, method="exact")  # two-sided 98%
    assert (lo, hi) == (pytest.approx(ref.low, rel=1e-9), pytest.approx(ref.high, rel=1e-9))
    assert st.clopper_pearson(0, 50)[0] == 0.0 and st.clopper_pearson(50, 50)[1] == 1.0


def test_quick_study_writes_its_outputs_and_holds(tmp_path):
    """``--quick`` (about 10 s): the figure, results.csv, attack.csv and summary.md written; every
    check OK; the example-level run's person epsilon in results.csv equals its own report's
    group_privacy level (privacy/group.py, computed by the run) for k rows; the person-level runs'
    epsilon is per person. The attack (150 in and 150 out trainings each, nominal eps 2): its power
    on the person-level run is within e^eps FPR + delta at FPR 0.01-0.2 (Clopper-Pearson 99%) for
    both statistics; on the example-level run at the same per-ROW eps it breaks that bound (the
    per-row number says nothing about a person with 20 rows: the check is not vacuous), and stays
    within its group level at 20 rows (delta 1: vacuous)."""
    assert st.main(["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]) == 0
    png = (tmp_path / "person_level.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    res = pd.read_csv(tmp_path / "results.csv")
    assert set(res["guarantee"]) == {"person-level", "example-level, group level", "example-level, per-row epsilon",
                                     "non-private"}
    for r in res[res["guarantee"] == "example-level, group level"].itertuples():
        report = json.loads((tmp_path / "runs" / f"example_k{int(r.k)}_e{r.target_person_epsilon}_s{r.seed}"
                             / "privacy.json").read_text())
        level = next(lv for lv in report["group_privacy"]["levels"] if lv["k"] == r.k)
        assert r.person_epsilon == pytest.approx(level["epsilon"], rel=1e-9)
        assert r.person_delta == pytest.approx(level["delta"], rel=1e-9) and r.person_delta <= st.PERSON_DELTA
        assert r.person_epsilon <= r.target_person_epsilon
    runs = res[res["guarantee"] == "person-level"]
    assert (runs["N"] < res.loc[res["guarantee"] == "non-private", "N"].max()).all()  # N counts persons
    assert np.allclose(runs["person_epsilon"], runs["target_person_epsilon"], rtol=1e-2)
    att = pd.read_csv(tmp_path / "attack.csv")
    person = att[att["run"] == "person-level"]
    assert person["within"].all() and set(person["statistic"]) == {"coefficient", "loss"}
    assert len(person) == 2 * len(st.FPRS)
    row = att[(att["run"] == "example-level") & att["bound_of"].str.startswith("per-row")]
    for stat in ("coefficient", "loss"):
        r = row[row["statistic"] == stat]
        assert not r["within"].all()
        at5 = r[r["fpr_target"] == 0.05].iloc[0]
        assert at5["tpr"] > 0.9 > at5["bound"]  # power 0.9+ against a per-row bound of about 0.39
    group = att[(att["run"] == "example-level") & att["bound_of"].str.startswith("group")]
    assert group["within"].all() and (group["delta"] == 1.0).all()
    text = (tmp_path / "summary.md").read_text()
    assert "OK person-level power within its bound" in text and "FAIL" not in text
    assert math.isfinite(res["test_acc"].min()) and res["test_acc"].min() > 0.6
