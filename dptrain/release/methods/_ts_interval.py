"""The 95% interval of DP Theil-Sen (issue 18), from released values and public settings only.

With ``interval_share`` > 0 the method spends that share of its epsilon on two more
exponential-mechanism quantiles of the SAME pair estimates, the 25% and 75% points (half the share
each; rank utility -|#{v < r} - q m|, sensitivity 1 per changed pair value like the median), and
the rest on the median. From the released median theta~ and quartiles q25~, q75~ (gamma =
|q75~ - q25~| / 2, floored at 1e-4 of the public range):

* a model of the pair-estimate CDF F through the released quartiles: linear between theta~ -/+
  gamma (the flattest law with those quartiles near the centre, so the exponential mechanism is
  modelled at its widest there) and Cauchy tails outside (pair slopes and pair predictions are
  ratios with a heavy, about 1/r^2, tail); clipped to the public range [lo, hi];
* the exponential-mechanism median given the sample median t: density of r on [lo, hi]
  proportional to exp(-a |F(r - t) - 1/2|), a = eps_median * m / 2 (eps_median per unit
  sensitivity, m the public pair count N(N-1)/2 or k floor(N/2)); the wide median's window moves
  r ``width`` towards t first; its running integral is tabulated once per cell on a sinh grid
  (fine near t, reaching the whole range), so the truncation to [lo, hi] is exact for any t;
* the sampling error of the non-private Theil-Sen median t: normal, SD s = kappa sqrt(2 pi) tau /
  sqrt(N) with tau = 2 gamma / 1.349 (the normal scale with that IQR). For a U-quantile,
  sqrt(N) (t - theta) -> N(0, 4 zeta_1 / f(theta)^2); kappa stands for 2 sqrt(zeta_1) f_normal / f.
  It is CALIBRATED, not derived: simulated non-private all-pairs Theil-Sen (uniform and Beta(2, 5)
  x; clipped-normal, normal and t3 errors; N = 50 and 200; 300 replicates each) gave kappa in
  0.39-0.48 for a prediction and 0.26-0.32 for the slope; their means, 0.43 and 0.285, are used.
  (The U-statistic bound zeta_1 <= zeta_2 / 2 = 1/8 gives kappa <= 0.71 under a normal f, far too
  wide: pair estimates are heavy-tailed.) k matchings add the median-of-m term 1 / (4 m).

The interval inverts the test: theta is in it unless P(theta~ <= obs | theta) < (1 - level)/2 or
> (1 + level)/2, with P averaging the truncated mechanism over t = theta + s Z (Gauss-Hermite, 24
nodes); the bounds are found by bisection on [lo, hi] (so the interval lies in the public range;
at small epsilon N it is the whole range). Plugging theta~ in as the centre of the mechanism's
law instead (theta~ -/+ its quantiles) under-covers near the range ends (measured 82% at N = 50,
epsilon 1). Everything is a function of (theta~, q25~, q75~, N, epsilon, lo, hi, width,
statistic): post-processing of the three draws, inside the method's epsilon.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dptrain.release.intervals import LEVEL

KAPPA = {"slope": 0.285, "level": 0.43}  # 2 sqrt(zeta_1) f_normal / f, calibrated (module docstring)
_S = np.linspace(-1.0, 1.0, 2001) * np.arcsinh(1e7)  # error grid u = gamma 1e-3 sinh(s)
_GH_Z, _GH_W = np.polynomial.hermite_e.hermegauss(24)
_GH_W = _GH_W / _GH_W.sum()  # E f(Z), Z ~ N(0, 1), by Gauss-Hermite quadrature


@dataclass(frozen=True)
class IntervalConfig:
    """Public settings of the interval: the range [lo, hi], the wide median's ``width``, the
    sampling constant ``kappa`` and the ``level``."""

    lo: float
    hi: float
    width: float
    kappa: float
    level: float = LEVEL


def model_cdf(u: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """The pair-estimate CDF model at u = r - centre: linear on -/+ gamma (0.25 to 0.75), Cauchy tails."""
    z = u / gamma
    return np.where(np.abs(z) <= 1.0, 0.5 + 0.25 * z, 0.5 + np.arctan(z) / np.pi)


def _cum_table(gamma: np.ndarray, a: np.ndarray, width: float) -> np.ndarray:
    """Per cell (rows) the running integral over the grid u of the mechanism's unnormalised density
    exp(-a |F(u moved width towards 0) - 1/2|) (the centre's density is 1)."""
    u = gamma[:, None] * 1e-3 * np.sinh(_S)[None, :]
    moved = np.sign(u) * np.maximum(np.abs(u) - width, 0.0)
    g = np.exp(-a[:, None] * np.abs(model_cdf(moved, gamma[:, None]) - 0.5))
    step = 0.5 * (g[:, 1:] + g[:, :-1]) * np.diff(u, axis=1)
    return np.concatenate([np.zeros((u.shape[0], 1)), np.cumsum(step, axis=1)], axis=1)


def _cum_at(cum: np.ndarray, gamma: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The running integral at errors u (rows: cells), by linear interpolation on the sinh grid."""
    pos = (np.arcsinh(u / (gamma[:, None] * 1e-3)) - _S[0]) / (_S[1] - _S[0])
    pos = np.clip(pos, 0.0, _S.size - 1.0)
    i = np.minimum(pos.astype(np.int64), _S.size - 2)
    c0, c1 = np.take_along_axis(cum, i, axis=1), np.take_along_axis(cum, i + 1, axis=1)
    return c0 + (pos - i) * (c1 - c0)


def _p_below(obs: np.ndarray, theta: np.ndarray, s: np.ndarray, table: tuple, config: IntervalConfig) -> np.ndarray:
    """P(theta~ <= obs | true theta): the sample median theta + s Z (Gauss-Hermite over Z), then the
    mechanism on [lo, hi] centred there."""
    cum, gamma = table
    t = theta[:, None] + s[:, None] * _GH_Z[None, :]
    c_lo = _cum_at(cum, gamma, config.lo - t)
    num, den = _cum_at(cum, gamma, obs[:, None] - t) - c_lo, _cum_at(cum, gamma, config.hi - t) - c_lo
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(den > 0, num / den, (obs[:, None] >= t).astype(np.float64))
    return p @ _GH_W


def _invert(obs: np.ndarray, s: np.ndarray, table: tuple, target: float, config: IntervalConfig) -> np.ndarray:
    """The theta in [lo, hi] with P(theta~ <= obs | theta) = target (decreasing in theta; bisection),
    clipped to the range."""
    lo, hi = np.full(obs.shape, config.lo), np.full(obs.shape, config.hi)
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        up = _p_below(obs, mid, s, table, config) > target
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    return 0.5 * (lo + hi)


def ts_interval(theta: np.ndarray, q25: np.ndarray, q75: np.ndarray, n: np.ndarray, a: np.ndarray,
                m: np.ndarray, *, config: IntervalConfig) -> tuple[np.ndarray, np.ndarray]:
    """(ci_low, ci_high) per cell from the released median ``theta`` and quartiles, the public
    N ``n``, the median's ``a`` = eps_median m / 2 and the pair count ``m`` (0: all pairs); NaN
    where theta or a quartile is NaN. The interval is the set of theta the released median does
    not reject at level (1 - level)/2 on either side (test inversion). Cells in blocks."""
    theta, q25, q75 = (np.asarray(v, dtype=np.float64) for v in (theta, q25, q75))
    a, n, m = (np.asarray(v, dtype=np.float64) for v in (a, n, m))
    low, high = np.full(theta.shape, np.nan), np.full(theta.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(theta) & np.isfinite(q25) & np.isfinite(q75) & (n >= 2))
    tail = (1.0 - config.level) / 2.0
    for start in range(0, ok.size, 256):
        idx = ok[start:start + 256]
        gamma = np.maximum(0.5 * np.abs(q75[idx] - q25[idx]), 1e-4 * (config.hi - config.lo))
        extra = np.where(m[idx] > 0, 1.0 / (4.0 * np.maximum(m[idx], 1.0)), 0.0)
        s = (2.0 * gamma / 1.349) * np.sqrt(2.0 * np.pi) * np.sqrt(config.kappa ** 2 / n[idx] + extra)
        table = (_cum_table(gamma, a[idx], config.width), gamma)
        low[idx] = _invert(theta[idx], s, table, 1.0 - tail, config)
        high[idx] = _invert(theta[idx], s, table, tail, config)
    return low, high
