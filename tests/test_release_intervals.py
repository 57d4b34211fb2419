"""95% intervals of the release methods (issue 18): ``ci_low`` / ``ci_high`` per cell, their
coverage of the TRUE cell parameter on simulated cells, and that they use released or public
quantities only (dptrain.release.methods.common.result_frame, each method's meta ``interval``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from dptrain.data.atlas import clipped_mean, projection_line
from dptrain.release.cells import Domain, make_cells
from dptrain.release.intervals import laplace_normal_halfwidth
from dptrain.release.methods.common import result_frame
from dptrain.release.methods.dp_gd import DPGDConfig, dp_gradient_descent
from dptrain.release.methods.dp_sgd import DPSGDConfig, dp_sgd_engine
from dptrain.release.methods.noisy_stats import noisy_stats
from dptrain.release.methods.ss_laplace import sufficient_stats_laplace
from dptrain.release.methods.suppression import suppression
from dptrain.release.methods.theil_sen import dp_theil_sen

BANDS = (50, 100, 200)
SD = 0.18  # y = clip(0.3 + 0.3 x + SD N(0, 1), 0, 1), x ~ U(0, 1)


def _truth() -> dict[str, float]:
    """The population OLS line of the CLIPPED y on x ~ U(0, 1) (exact quadrature, dptrain.data.atlas)."""
    a, b = projection_line(np.zeros(1), np.ones(1), lambda xs: clipped_mean(0.3 + 0.3 * xs, SD))
    return {"p25": a[0] + 0.25 * b[0], "p75": a[0] + 0.75 * b[0], "slope": b[0]}


TRUTH = _truth()


def _cells(per_band: int, *, seed: int):
    rng = np.random.default_rng(seed)
    n = np.repeat(BANDS, per_band)
    codes = np.repeat(np.arange(n.size), n)
    x = rng.uniform(0, 1, codes.size)
    y = np.clip(0.3 + 0.3 * x + SD * rng.standard_normal(codes.size), 0, 1)
    return make_cells(x, y, codes, keys=pd.DataFrame({"g": np.arange(n.size)}), domain=Domain()), n


def _coverage(df: pd.DataFrame, stat: str, n: np.ndarray) -> dict:
    rel = df.released.to_numpy()
    lo, hi = df.ci_low.to_numpy(), df.ci_high.to_numpy()
    assert np.isfinite(lo[rel]).all() and np.isfinite(hi[rel]).all()
    assert (hi[rel] - lo[rel] > 0).all()
    assert np.isnan(lo[~rel]).all() and np.isnan(hi[~rel]).all()
    hit = (lo <= TRUTH[stat]) & (TRUTH[stat] <= hi)
    return {"all": hit[rel].mean(), **{b: hit[rel & (n == b)].mean() for b in BANDS}}


def _run(name, cells, stat, eps, seed):
    rng = np.random.default_rng(seed)
    if name == "suppression":
        return suppression(cells, statistic=stat, k=5)
    fn = {"ss_laplace": sufficient_stats_laplace, "noisy_stats": noisy_stats}[name]
    return fn(cells, statistic=stat, epsilon=eps, rng=rng)


# ------------------------------------------------------------------ the common frame
def test_result_frame_interval_columns():
    reason = np.array(["", "", "too small", ""], dtype=object)
    theta = np.array([0.5, np.nan, 0.2, 0.3])
    plain = result_frame(reason, theta, 0.1)
    assert list(plain.columns) == ["released", "reason", "theta_released", "noise_sd"]  # old callers
    df = result_frame(reason, theta, 0.1, halfwidth=np.array([0.1, 0.1, 0.1, np.inf]))
    assert list(df.columns)[-2:] == ["ci_low", "ci_high"]
    np.testing.assert_allclose(df.ci_low, [0.4, np.nan, np.nan, np.nan])
    np.testing.assert_allclose(df.ci_high, [0.6, np.nan, np.nan, np.nan])
    df = result_frame(reason, theta, 0.1, ci=(theta - 0.1, theta + 0.3))
    np.testing.assert_allclose(df.ci_high, [0.8, np.nan, np.nan, 0.6])
    assert result_frame(reason, theta, 0.1, ci=(np.nan, np.nan)).ci_low.isna().all()
    with pytest.raises(ValueError, match="not both"):
        result_frame(reason, theta, 0.1, halfwidth=0.1, ci=(0.0, 1.0))


# ------------------------------------------------------------------ coverage of the truth
def test_suppression_t_interval_coverage():
    """Exact values, exact OLS t-interval: coverage 0.95 within Monte Carlo error in every N band
    (1200 cells per band: SD of a band's coverage 0.006; of the total 0.0036)."""
    cells, n = _cells(1200, seed=11)
    for stat in ("p25", "slope"):
        df, meta = suppression(cells, statistic=stat, k=5)
        cov = _coverage(df, stat, n)
        assert 0.935 <= cov["all"] <= 0.965, (stat, cov)
        assert all(0.925 <= cov[b] <= 0.975 for b in BANDS), (stat, cov)
        assert meta["interval"].startswith("exact OLS t-interval")


@pytest.mark.parametrize("name", ["ss_laplace", "noisy_stats"])
@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_dp_bootstrap_interval_covers(name, eps):
    """ss_laplace and noisy_stats claim a CONSERVATIVE interval (public sigma bound, bootstrap of
    the known noise): coverage >= 0.95 up to Monte Carlo error (300 cells per band: SD 0.013),
    finite positive widths, NaN where not released."""
    cells, n = _cells(300, seed=12)
    for stat in ("p25", "slope"):
        df, meta = _run(name, cells, stat, eps, seed=13)
        cov = _coverage(df, stat, n)
        assert cov["all"] >= 0.95, (stat, cov)
        assert all(cov[b] >= 0.92 for b in BANDS), (stat, cov)
        assert "bootstrap" in meta["interval"] and "CONSERVATIVE" in meta["interval"]


def test_intervals_narrow_with_epsilon_and_n():
    cells, n = _cells(100, seed=14)
    for name in ("ss_laplace", "noisy_stats"):
        width = {}
        for eps in (1.0, 8.0):
            df, _ = _run(name, cells, "p25", eps, seed=15)
            w = (df.ci_high - df.ci_low).to_numpy()
            width[eps] = [np.nanmedian(w[n == b]) for b in BANDS]
        assert all(w8 < w1 for w1, w8 in zip(width[1.0], width[8.0])), (name, width)
        assert width[8.0][0] > width[8.0][1] > width[8.0][2], (name, width)


# ------------------------------------------------------------------ released quantities only
@pytest.mark.parametrize("stat", ["p25", "slope"])
def test_ss_laplace_interval_ignores_unreleased_private_values(stat):
    """The interval is a function of the noisy sums, public settings and the rng: the same noisy
    sums with different private rows (sum y^2, the rows themselves) give the same interval, and
    the release draws come first (theta is as without the interval)."""
    cells, _ = _cells(20, seed=16)
    other = dataclasses.replace(cells, syy=cells.syy * 0.5, y=cells.y[::-1].copy())
    a, _ = sufficient_stats_laplace(cells, statistic=stat, epsilon=2.0, rng=np.random.default_rng(17))
    b, _ = sufficient_stats_laplace(other, statistic=stat, epsilon=2.0, rng=np.random.default_rng(17))
    pd.testing.assert_frame_equal(a, b)
    from dptrain.release.methods import ss_laplace

    noisy, scale, _ = ss_laplace._noisy_sums(cells, 2.0, np.random.default_rng(17))
    theta, _, _ = ss_laplace._ols_and_gradient(noisy, None if stat == "slope" else 0.25)
    np.testing.assert_array_equal(a.theta_released.dropna(), theta[a.released])


def test_noisy_stats_interval_does_not_use_private_xbar():
    """noisy_stats' p25 uses the private xbar in theta but never publishes it: shifting every x
    of a cell by a constant leaves ncov, nvar (and the noise draws) unchanged and moves theta, but
    the interval's half-widths must not move (they use the worst case over xbar in the domain)."""
    rng = np.random.default_rng(18)
    n = np.full(40, 60)
    codes = np.repeat(np.arange(n.size), n)
    x = rng.uniform(0.0, 0.5, codes.size)
    y = np.clip(0.3 + 0.3 * x + SD * rng.standard_normal(codes.size), 0, 1)
    keys = pd.DataFrame({"g": np.arange(n.size)})
    base = make_cells(x, y, codes, keys=keys, domain=Domain())
    shifted = make_cells(x + 0.5, y, codes, keys=keys, domain=Domain())
    a, _ = noisy_stats(base, statistic="p25", epsilon=4.0, rng=np.random.default_rng(19))
    b, _ = noisy_stats(shifted, statistic="p25", epsilon=4.0, rng=np.random.default_rng(19))
    assert not np.allclose(a.theta_released, b.theta_released)
    for col in ("ci_low", "ci_high"):
        np.testing.assert_allclose((a[col] - a.theta_released), (b[col] - b.theta_released), rtol=1e-6, atol=1e-9)


def test_suppression_interval_is_exact_t():
    cells, _ = _cells(5, seed=20)
    df, _ = suppression(cells, statistic="p75", k=5)
    from scipy.stats import t

    from dptrain.release.cells import ols, standard_error

    fit = ols(cells)
    half = t.ppf(0.975, cells.n - 2) * standard_error(fit, "p75", cells.domain)
    np.testing.assert_allclose(df.ci_high - df.theta_released, half, rtol=1e-12)
    np.testing.assert_allclose(df.theta_released - df.ci_low, half, rtol=1e-12)


# ------------------------------------------------------------------ methods without an interval
def test_methods_without_interval_say_so():
    cells, _ = _cells(1, seed=21)
    rng = np.random.default_rng(22)
    runs = [
        dp_theil_sen(cells, statistic="p25", epsilon=2.0, rng=rng),
        dp_gradient_descent(cells, statistic="p25", epsilon=1.0, delta=1e-5, rng=rng,
                            config=DPGDConfig(iterations=10, interval_fraction=0.0)),  # no interval bought
        dp_sgd_engine(cells, statistic="p25", epsilon=1.0, delta=1e-5, rng=rng,
                      config=DPSGDConfig(steps=6, interval_fraction=0.0)),
    ]
    for df, meta in runs:
        assert {"ci_low", "ci_high"} <= set(df.columns)
        assert df.ci_low.isna().all() and df.ci_high.isna().all()
        assert meta["interval"].startswith("none: "), meta["method"]


def test_laplace_normal_halfwidth_is_the_sum_law():
    """The helper the intervals rest on: coverage of N(0, s^2) + Laplace(b) by its half-width."""
    rng = np.random.default_rng(23)
    for s, b in ((0.1, 0.0), (0.0, 0.1), (0.1, 0.1), (0.05, 0.2)):
        h = float(laplace_normal_halfwidth(s=s, b=b))
        e = s * rng.standard_normal(200_000) + rng.laplace(0.0, b, 200_000) if b else s * rng.standard_normal(200_000)
        assert abs(np.mean(np.abs(e) <= h) - 0.95) < 0.003
