"""Intervals for released statistics: the error of a noisy release is sampling error plus privacy
noise, and the interval must use the law of their SUM, not 1.96 times a combined SD.

For a release theta~ = theta_hat + L with theta_hat ~ N(theta, s^2) (sampling) and L the privacy
noise, independent of the data, theta~ - theta = G + L. For Laplace noise of scale b the 95% point
of |G + L| is NOT 1.96 sqrt(s^2 + 2 b^2): for pure Laplace noise that gives P(|L| <= 2.77 b) =
1 - exp(-2.77) = 93.7%, an undercoverage that grows in exactly the cells where noise dominates.
:func:`laplace_normal_halfwidth` solves P(|G + L| <= h) = level exactly, with the closed-form CDF
of the normal-Laplace convolution (Reed 2006):

    P(G + L <= z) = Phi(z / s) - 1/2 exp(s^2 / (2 b^2) - z / b) Phi(z / s - s / b)
                               + 1/2 exp(s^2 / (2 b^2) + z / b) Phi(-z / s - s / b),

evaluated in log space (``log_ndtr``) so that it neither overflows nor cancels, and inverted by
bisection. ``b = 0`` gives the normal interval, ``s = 0`` the Laplace one, b log(1 / (1 - level)).

The discrete (grid) Laplace of :mod:`dptrain.release.noise` has variance 2 t^2 - gamma^2 / 6 + ...
with gamma ~ 2^-20 t: the continuous law with the same scale is the same to about 1e-6 relative.
"""

from __future__ import annotations

import numpy as np

from .cells import ReleaseError

LEVEL = 0.95


def _check_level(level: float) -> float:
    if not (isinstance(level, (int, float)) and 0.0 < float(level) < 1.0):
        raise ReleaseError(f"interval level={level!r} is not allowed: a number in (0, 1), e.g. 0.95")
    return float(level)


def laplace_normal_cdf(z: np.ndarray, *, s: np.ndarray, b: np.ndarray) -> np.ndarray:
    """P(G + L <= z) for G ~ N(0, s^2), L ~ Laplace(0, b), element-wise (s > 0, b > 0)."""
    from scipy.special import log_ndtr, ndtr  # scipy: imported where it is used

    z, s, b = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (z, s, b)))
    r = s / b
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        lo = 0.5 * r * r - z / b + log_ndtr(z / s - r)
        hi = 0.5 * r * r + z / b + log_ndtr(-z / s - r)
        out = ndtr(z / s) - 0.5 * np.exp(lo) + 0.5 * np.exp(hi)
    return np.clip(out, 0.0, 1.0)


def laplace_normal_halfwidth(*, s: np.ndarray | float, b: np.ndarray | float, level: float = LEVEL) -> np.ndarray:
    """The h with P(|G + L| <= h) = ``level``, G ~ N(0, s^2), L ~ Laplace(0, b), per element.

    ``s`` (sampling SD) and ``b`` (Laplace scale) are >= 0; NaN or inf in either gives NaN.
    Exact to a relative 1e-10 (bisection on the closed-form CDF)."""
    from scipy.special import ndtri  # scipy: imported where it is used

    level = _check_level(level)
    s, b = np.broadcast_arrays(np.asarray(s, dtype=np.float64), np.asarray(b, dtype=np.float64))
    s, b = s.astype(np.float64).copy(), b.astype(np.float64).copy()
    bad = ~(np.isfinite(s) & np.isfinite(b)) | (s < 0) | (b < 0)
    s[bad], b[bad] = 1.0, 1.0
    tail = (1.0 - level) / 2.0
    h_norm = s * ndtri(1.0 - tail)
    h_lap = b * np.log(1.0 / (1.0 - level))
    both = (s > 0) & (b > 0)
    out = np.where(b == 0, h_norm, np.where(s == 0, h_lap, np.nan))
    if both.any():
        ss, bb = s[both], b[both]
        lo = np.maximum(ss * ndtri(1.0 - tail), bb * np.log(1.0 / (1.0 - level)))  # each part alone
        hi = ss * ndtri(1.0 - tail) + bb * np.log(1.0 / (1.0 - level)) + 1e-300  # triangle inequality
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            cover = laplace_normal_cdf(mid, s=ss, b=bb) - laplace_normal_cdf(-mid, s=ss, b=bb)
            below = cover < level
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
            if np.all(hi - lo <= 1e-10 * hi):
                break
        out[both] = hi
    out[bad] = np.nan
    return out


def normal_halfwidth(*, sd: np.ndarray | float, level: float = LEVEL) -> np.ndarray:
    """z_{(1 + level) / 2} times ``sd``: the half-width for an error that is (approximately) normal."""
    from scipy.special import ndtri  # scipy: imported where it is used

    level = _check_level(level)
    return np.asarray(sd, dtype=np.float64) * ndtri(0.5 + level / 2.0)


def interval_columns(theta: np.ndarray, halfwidth: np.ndarray, released: np.ndarray) -> dict[str, np.ndarray]:
    """``ci_low`` / ``ci_high``: theta -/+ halfwidth where released and finite, else NaN."""
    theta = np.asarray(theta, dtype=np.float64)
    h = np.broadcast_to(np.asarray(halfwidth, dtype=np.float64), theta.shape)
    ok = np.asarray(released, dtype=bool) & np.isfinite(theta) & np.isfinite(h)
    return {"ci_low": np.where(ok, theta - h, np.nan), "ci_high": np.where(ok, theta + h, np.nan)}
