"""Intervals of the smooth mechanisms from public quantities only (the module docstring of
:mod:`dptrain.release.employer.mechanisms`, "Intervals"): the release, the settings and the public
largest establishment size; never the cell's largest establishment or its size class, which the
width would otherwise publish."""

from __future__ import annotations

import math

import numpy as np

from dptrain.release.employer.mechanisms import (
    quartic_quantile,
    smooth_gamma_params,
    smooth_grid_step,
    smooth_laplace_params,
    smooth_sensitivity,
)


def public_smooth_interval(released, *, per_s: float, alpha: float, beta: float, max_size: float,
                           half_step: float, iterations: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """The hull of {m : |y - m| <= t(m)}, t(m) = per_s S(min(max(m, 1), max_size)) + half_step, for each
    release y (module docstring, Intervals): public quantities only. t increases with m, so the lower
    end, where m + t(m) reaches y, is found by bisection (the lower bracket is returned); the upper
    end is the largest fixed point of u = y + t(u), reached from above (u_0 = y + t(max_size)): every
    iterate bounds the set from above, so stopping early only widens the interval."""
    if not all(np.isfinite(v) and v > 0 for v in (per_s, alpha, beta, max_size)):
        raise ValueError("per_s, alpha, beta and max_size must be positive and finite")
    y = np.asarray(released, dtype=float)

    def reach(m: np.ndarray) -> np.ndarray:
        return per_s * smooth_sensitivity(np.clip(m, 1.0, max_size), alpha, beta) + half_step

    lo, hi = np.ones_like(y), np.maximum(y, 1.0)
    below = lo + reach(lo) < y  # else the lower end is at most 1, where t is t(1): y - t(1)
    for _ in range(iterations if below.any() else 0):
        mid = 0.5 * (lo + hi)
        short = mid + reach(mid) < y
        lo, hi = np.where(below & short, mid, lo), np.where(below & ~short, mid, hi)
    lo = np.where(below, lo, y - reach(np.ones_like(y)))
    upper = y + reach(np.full_like(y, max_size))
    for _ in range(iterations):
        upper = np.minimum(upper, y + reach(upper))
    return lo, upper


def smooth_laplace_interval_public(released, alpha: float, epsilon: float, delta: float, max_size: float,
                                   level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """:func:`smooth_laplace`'s ``level`` interval from public quantities only (:func:`public_smooth_interval`)."""
    beta, per_s = smooth_laplace_params(epsilon, delta)
    return public_smooth_interval(released, per_s=math.log(1.0 / (1.0 - level)) * per_s, alpha=alpha, beta=beta,
                                  max_size=max_size, half_step=0.5 * smooth_grid_step(per_s))


def smooth_gamma_interval_public(released, alpha: float, epsilon: float, max_size: float,
                                 level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """:func:`smooth_gamma`'s ``level`` interval from public quantities only (:func:`public_smooth_interval`)."""
    beta, a = smooth_gamma_params(epsilon)
    return public_smooth_interval(released, per_s=quartic_quantile(0.5 + level / 2.0) / a, alpha=alpha, beta=beta,
                                  max_size=max_size, half_step=0.5 * smooth_grid_step(1.0 / a))
