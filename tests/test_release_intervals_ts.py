"""95% intervals of DP Theil-Sen (issue 18): coverage of the TRUE cell parameter per size band,
and that the interval is a function of the mechanism's released draws and public settings only
(dptrain.release.methods._ts_interval). Truth: the population OLS line of the clipped y
(tests/test_release_intervals.py); Theil-Sen estimates the median line, which differs from it by
well under the interval widths in this symmetric-noise, mildly clipped model."""

from __future__ import annotations

import numpy as np
import pytest
from test_release_intervals import BANDS, TRUTH, _cells

from dptrain.release.methods import theil_sen as ts
from dptrain.release.methods._ts_interval import KAPPA, IntervalConfig, ts_interval
from dptrain.release.methods.theil_sen import INTERVAL_SHARE, TheilSenConfig, dp_theil_sen

CFG = TheilSenConfig(interval_share=INTERVAL_SHARE)


@pytest.fixture(scope="module")
def cells():
    return _cells(200, seed=5)


@pytest.mark.parametrize("eps", [1.0, 8.0])
@pytest.mark.parametrize("stat", ["p25", "slope"])
def test_theil_sen_interval_coverage_per_band(cells, stat, eps):
    c, n = cells
    df, meta = dp_theil_sen(c, statistic=stat, epsilon=eps, rng=np.random.default_rng(7), config=CFG)
    rel = df.released.to_numpy()
    lo, hi = df.ci_low.to_numpy(), df.ci_high.to_numpy()
    assert rel.all() and np.isfinite(lo).all() and np.isfinite(hi).all() and (hi - lo > 0).all()
    assert ((lo <= df.theta_released) & (df.theta_released <= hi)).all()
    hit = (lo <= TRUTH[stat]) & (TRUTH[stat] <= hi)
    cover = {b: hit[n == b].mean() for b in BANDS}
    assert all(0.92 <= v <= 0.98 for v in cover.values()), cover
    assert meta["interval_share"] == INTERVAL_SHARE and "25% and 75% quantiles" in meta["epsilon_split"]
    assert not meta["interval"].startswith("none")


def test_theil_sen_interval_uses_released_draws_only(monkeypatch):
    """The three exponential-mechanism draws per cell, N and public settings give the interval
    exactly; the epsilons of the draws add up to the method's epsilon."""
    c, n = _cells(3, seed=11)
    seen, real = [], ts.exp_mech_median

    def spy(values, **kw):
        out = real(values, **kw)
        seen.append((kw.get("quantile", 0.5), kw["epsilon"], out))
        return out

    monkeypatch.setattr(ts, "exp_mech_median", spy)
    eps = 2.0
    df, meta = dp_theil_sen(c, statistic="p25", epsilon=eps, rng=np.random.default_rng(3), config=CFG)
    draws = np.array([s[2] for s in seen]).reshape(-1, 3)
    qs = np.array([s[0] for s in seen]).reshape(-1, 3)
    eps_em = np.array([s[1] for s in seen]).reshape(-1, 3)
    np.testing.assert_allclose(qs, np.tile([0.5, 0.25, 0.75], (n.size, 1)))
    np.testing.assert_allclose(eps_em.sum(axis=1) * (n - 1), eps)  # all pairs: epsilon / (N - 1) per draw
    m = n * (n - 1) / 2.0
    a = (1 - INTERVAL_SHARE) * eps / (n - 1) * m / 2.0
    lo, hi = meta["value_range"]
    low, high = ts_interval(draws[:, 0], draws[:, 1], draws[:, 2], n, a, np.zeros(n.size),
                            config=IntervalConfig(lo=lo, hi=hi, width=0.0, kappa=KAPPA["level"]))
    np.testing.assert_allclose(df.ci_low, low)
    np.testing.assert_allclose(df.ci_high, high)


def test_theil_sen_interval_off_and_wide_and_matchings():
    c, n = _cells(4, seed=12)
    df, meta = dp_theil_sen(c, statistic="slope", epsilon=4.0, rng=np.random.default_rng(1))
    assert df.ci_low.isna().all() and meta["interval"].startswith("none: ") and meta["interval_share"] == 0.0
    for cfg in (TheilSenConfig(wide=True, interval_share=0.3),
                TheilSenConfig(variant="matchings", k=10, interval_share=0.3)):
        df, _ = dp_theil_sen(c, statistic="slope", epsilon=4.0, rng=np.random.default_rng(1), config=cfg)
        assert np.isfinite(df.ci_low).all() and (df.ci_high > df.ci_low).all()
    w = df.ci_high - df.ci_low
    assert w[n == 200].median() < w[n == 50].median()  # narrows with N


def test_theil_sen_interval_narrows_with_epsilon():
    c, _ = _cells(10, seed=13)
    widths = [np.median(dp_theil_sen(c, statistic="p25", epsilon=e, rng=np.random.default_rng(2), config=CFG)[0]
                        .eval("ci_high - ci_low")) for e in (1.0, 8.0)]
    assert widths[1] < widths[0]
