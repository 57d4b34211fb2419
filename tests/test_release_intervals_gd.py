"""95% intervals of dp_gd and dp_sgd (issue 18; dptrain/release/methods/_gd_interval.py): coverage of
the TRUE cell parameter per size band on simulated cells, finite positive widths, the budget split,
and that the interval is a function of released values and public settings only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_release_intervals import BANDS, _cells, _coverage

from dptrain.release.methods._gd_interval import design_stats, gd_interval
from dptrain.release.methods.dp_gd import DPGDConfig, dp_gradient_descent
from dptrain.release.methods.dp_sgd import DPSGDConfig, dp_sgd_engine


def _check_bands(cov: dict, label, low: float = 0.92, high: float = 0.995) -> None:
    """Valid in every band; the p25 interval is conservative (the Syy floor and the range of the mean
    of u), measured 0.96-0.99 per band, hence the upper bound 0.995 rather than 0.98."""
    assert all(low <= cov[b] <= high for b in BANDS), (label, cov)
    assert low + 0.015 <= cov["all"] <= high - 0.005, (label, cov)


@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_dp_gd_interval_coverage(eps):
    """300 cells per band (SD of a band's coverage 0.013): coverage of the truth in every band."""
    cells, n = _cells(300, seed=41)
    for stat in ("p25", "slope"):
        df, meta = dp_gradient_descent(cells, statistic=stat, epsilon=eps, delta=1e-5, rng=np.random.default_rng(42))
        assert df.released.mean() > 0.98  # n~ < 3 (not released) is rare at N >= 50
        _check_bands(_coverage(df, stat, n), (eps, stat))
        assert meta["interval"].startswith("theta~ -/+")


def test_dp_gd_interval_narrows_with_epsilon_and_n():
    cells, n = _cells(60, seed=43)
    width = {}
    for eps in (1.0, 8.0):
        df, _ = dp_gradient_descent(cells, statistic="p25", epsilon=eps, delta=1e-5, rng=np.random.default_rng(44))
        w = (df.ci_high - df.ci_low).to_numpy()
        width[eps] = [np.median(w[n == b]) for b in BANDS]
    assert all(w8 < w1 for w1, w8 in zip(width[1.0], width[8.0])), width
    assert width[8.0][0] > width[8.0][1] > width[8.0][2], width


def test_budget_split_is_stated_and_sums_to_epsilon():
    cells, _ = _cells(3, seed=45)
    for fn, cfg in ((dp_gradient_descent, DPGDConfig(iterations=20)), (dp_sgd_engine, DPSGDConfig(steps=8))):
        _, meta = fn(cells, statistic="p25", epsilon=2.0, delta=1e-5, rng=np.random.default_rng(46), config=cfg)
        assert meta["epsilon_count"] == pytest.approx(0.2) and meta["epsilon_interval"] == pytest.approx(0.3)
        assert meta["epsilon_gradient"] <= 1.5 + 1e-6
        assert "0.15 epsilon to the interval" in meta["epsilon_split"]


def test_interval_fraction_zero_is_the_old_release():
    """interval_fraction = 0: no interval (NaN, 'none: ...'), the whole rest of epsilon to the steps."""
    cells, _ = _cells(3, seed=47)
    for fn, cfg in ((dp_gradient_descent, DPGDConfig(iterations=20, interval_fraction=0.0)),
                    (dp_sgd_engine, DPSGDConfig(steps=8, interval_fraction=0.0))):
        df, meta = fn(cells, statistic="slope", epsilon=2.0, delta=1e-5, rng=np.random.default_rng(48), config=cfg)
        assert df.ci_low.isna().all() and df.ci_high.isna().all()
        assert meta["interval"].startswith("none: ") and meta["epsilon_interval"] == 0.0


@pytest.mark.parametrize("stat", ["p25", "slope"])
def test_interval_uses_released_values_only(stat):
    """gd_interval sees the released (a, b), n~, the noisy design statistics and public settings:
    other private rows with the same released values give the same interval; the design draws come
    after theta's, so theta is unchanged by the interval's noise stream."""
    cells, _ = _cells(10, seed=49)
    rng = np.random.default_rng(50)
    stats = design_stats(cells, 0.5, rng)
    W = np.column_stack([np.full(cells.n_cells, 0.45), np.full(cells.n_cells, 0.3)])
    n_noisy = cells.n.astype(float) + 2.0
    rec = {"lr": 0.5, "steps": 100, "grad_sd": 10.0, "batch_rate": 1.0}
    other = dataclasses.replace(cells, x=cells.x[::-1].copy(), y=1.0 - cells.y, sxx=cells.sxx * 0.5, syy=cells.syy * 2)
    a = gd_interval(W, n_noisy, stats, cells, statistic=stat, recursion=rec)
    b = gd_interval(W, n_noisy, stats, other, statistic=stat, recursion=rec)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert np.all(np.isfinite(a[0])) and np.all(a[1] - a[0] > 0)


def test_dp_sgd_interval_smoke():
    cells, n = _cells(4, seed=51)
    df, meta = dp_sgd_engine(cells, statistic="slope", epsilon=4.0, delta=1e-5, rng=np.random.default_rng(52),
                             config=DPSGDConfig(steps=40))
    rel = df.released.to_numpy()
    assert rel.all() and np.isfinite(df.ci_low).all() and (df.ci_high - df.ci_low > 0).all()
    assert meta["interval"].startswith("theta~ -/+") and "subsampling" in meta["interval"]


@pytest.mark.slow
@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_dp_sgd_interval_coverage(eps):
    """100 cells per band (SD of a band's coverage 0.022; ~1 min per statistic): coverage per band."""
    cells, n = _cells(100, seed=53)
    for stat in ("p25", "slope"):
        df, _ = dp_sgd_engine(cells, statistic=stat, epsilon=eps, delta=1e-5, rng=np.random.default_rng(54))
        _check_bands(_coverage(df, stat, n), (eps, stat), low=0.90, high=1.0)
