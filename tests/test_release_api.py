"""The Python API: fit_cells -> local sensitivity -> release, results with read-only properties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from dptrain.core.validation import ConfigError
from dptrain.release.api import CellEstimates, Release, fit_cells


def _frame(seed=0, n_cells=12):
    rng = np.random.default_rng(seed)
    n = rng.integers(8, 40, n_cells)
    cell = np.repeat(np.arange(n_cells), n)
    x = rng.random(cell.size)
    y = np.clip(0.2 + 0.5 * x + 0.1 * rng.standard_normal(cell.size), 0, 1)
    return pd.DataFrame({"cell": cell, "x": x, "y": y})


def _keys(n_cells):
    """The PUBLIC list of the cells of :func:`_frame` (the API refuses cells observed in the rows)."""
    return pd.DataFrame({"cell": np.arange(n_cells)})


def test_fit_and_release_round_trip():
    df = _frame()
    est = fit_cells(df, x="x", y="y", cells=["cell"], cell_keys=_keys(12))
    assert isinstance(est, CellEstimates)
    for g in range(3):
        sub = df[df.cell == est.keys.cell[g]]
        slope, icpt = np.polyfit(sub.x, sub.y, 1)
        assert est.theta("p25")[g] == pytest.approx(icpt + 0.25 * slope, rel=1e-9)
    priv = est.to_frame("slope")
    assert list(priv.columns) == ["cell", "n", "theta", "se"]
    rel = est.release(statistic="p25", epsilon=2.0, seed=0)
    assert isinstance(rel, Release) and "NOT differentially private" in rel.privacy
    out = rel.to_frame()
    out.loc[0, "theta_released"] = -99  # a copy: the release itself is unchanged
    assert rel.frame.loc[0, "theta_released"] != -99
    with pytest.raises(dataclasses.FrozenInstanceError):
        rel.frame = out
    ls = est.local_sensitivity(statistic="p25")
    assert np.all(ls.ls[np.isfinite(ls.ls)] > 0)


def test_custom_statistic_by_brute_force_matches_closed_form():
    df = _frame(seed=1, n_cells=5)
    est = fit_cells(df, x="x", y="y", cells=["cell"], cell_keys=_keys(5))

    def slope(x, y):
        return np.polyfit(x, y, 1)[0]

    rel = est.release_custom(slope, epsilon=1.0, seed=0, grid=41)
    frame = rel.to_frame()
    closed = est.local_sensitivity(statistic="slope").ls
    chi_closed = float(np.max(est.n * closed))
    # the grid sup is a lower bound of the exact sup, close to it
    assert frame.chi.iloc[0] <= chi_closed * (1 + 1e-9)
    assert frame.chi.iloc[0] >= chi_closed * 0.97
    assert np.allclose(frame.noise_sd, np.sqrt(2) * frame.chi / (1.0 * est.n), rtol=1e-4)
    assert rel.epsilon["total_per_cell"] == 2.0
    assert "brute-force" in rel.info["sensitivity"]


def test_fit_cells_with_public_cell_keys():
    """With ``cell_keys`` the list of cells is the caller's public list: a listed cell without
    rows stays (0 rows), rows of unlisted cells are left out; without it (and without a private
    selection) the command line's refusal is raised (tests/test_api_guarantee.py)."""
    df = _frame(seed=2, n_cells=4)
    keys = pd.DataFrame({"cell": [0, 1, 2, 7]})
    est = fit_cells(df, x="x", y="y", cells=["cell"], cell_keys=keys)
    assert list(est.keys.cell) == [0, 1, 2, 7]
    assert est.n[3] == 0 and list(est.n[:3]) == [int((df.cell == g).sum()) for g in range(3)]
    rel = est.release(statistic="p25", epsilon=1.0, seed=1)
    assert rel.frame.reason.iloc[3] == "n < 3" and "declared" in rel.info["cells_source"]
    with pytest.raises(ConfigError, match="release.cell_values=null and release.cell_keys_file=null"):
        fit_cells(df, x="x", y="y", cells=["cell"])
    assert "1" not in rel.info["rng"]  # the seed is not echoed
