"""Numeric core of DP Theil-Sen (Alabi et al. 2022, section 2.2): pairwise estimates and the
exponential-mechanism median. The public wrapper is :func:`dptrain.release.baselines.dp_theil_sen`.

Exponential-mechanism median (McSherry & Talwar 2007; the continuous version of Alabi et al.'s
DPExpMedian). For m values v clipped to a PUBLIC range [lo, hi], the output r in [lo, hi] has
density proportional to exp(eps_em * u(r) / 2) with the rank utility

    u(r) = -|#{v < r} - #{v > r}| / 2          (= -|#{v < r} - m/2| when no value equals r).

Changing one value changes u by at most 1 everywhere, so this is eps_em-DP per unit of value
sensitivity. Between consecutive sorted values u is constant, so r is drawn by picking an
interval j (length L_j, utility -|j - m/2|) with probability proportional to
L_j exp(-eps_em |j - m/2| / 2) (Gumbel-max on the log-weights), then r uniform in it.

Wide median (Alabi et al.'s DPWideMedian, ``width`` = theta, 0.01 in the paper): the values below
the median are pushed theta down and those above theta up (the middle one of an odd count stays),
then clipped to [lo, hi], and the exponential-mechanism median above is taken. This equals the
exponential mechanism with the window utility u_theta(r) = max over |r' - r| <= theta of u(r')
(checked by writing out both sides: left of the median, u_theta(r) = u(r + theta), which counts the
values pushed down), so the sensitivity is still 1 per changed value (a maximum of
sensitivity-1 functions) and the privacy calibration is unchanged. It gives the top utility to a
band of width >= 2 theta, which matters when many pair estimates coincide.

Pairs whose two x are equal have no slope; they are left out. Each left-out pair contributes 0
instead of +-1 to #{v < r} - #{v > r}, so a change of one point still moves u by at most the
number of its pairs: the sensitivity argument of the wrapper (n - 1 or k) is unchanged.

Caveat: the sampling is textbook floating point (Gumbel-max, a uniform draw), not a
bit-exact exponential mechanism (Ilvento 2020); adequate for comparing accuracy.
"""

from __future__ import annotations

import numpy as np

#: all-pairs is not run on a cell with more pairs than this (memory: ~10 float64 arrays of this
#: size); such a cell uses k matchings (variant auto) or is not released (variant all_pairs)
MAX_PAIRS = 20_000_000


def exp_mech_median(values: np.ndarray, *, lo: float, hi: float, epsilon: float,
                    rng: np.random.Generator, width: float = 0.0) -> float:
    """One draw of the exponential-mechanism median of ``values`` on [lo, hi] (module docstring).

    ``epsilon`` is per unit of rank-utility sensitivity (the caller divides by the number of
    values one person can change). ``width`` > 0: the wide variant. Uniform on [lo, hi] when
    there are no values or epsilon is 0.
    """
    v = np.sort(np.clip(np.asarray(values, dtype=np.float64), lo, hi))
    m = v.size
    if width > 0 and m:
        i = np.arange(m)
        mid = (m - 1) / 2.0
        v = np.clip(np.where(i < mid, v - width, np.where(i > mid, v + width, v)), lo, hi)
    edges = np.concatenate(([lo], v, [hi]))
    lengths = np.diff(edges)
    j = np.arange(m + 1)
    with np.errstate(divide="ignore"):
        logw = np.log(lengths) - epsilon * np.abs(j - m / 2.0) / 2.0
    pick = int(np.argmax(logw + rng.gumbel(size=m + 1)))
    return float(rng.uniform(edges[pick], edges[pick + 1]))


def pair_estimates(x: np.ndarray, y: np.ndarray, i: np.ndarray, j: np.ndarray, *,
                   x0: float | None) -> np.ndarray:
    """Per pair (i, j) with x_i != x_j: the slope of the line through the two points
    (``x0`` None), or that line's prediction at ``x0``; pairs with equal x are dropped."""
    dx = x[j] - x[i]
    keep = dx != 0
    i, j, dx = i[keep], j[keep], dx[keep]
    slope = (y[j] - y[i]) / dx
    if x0 is None:
        return slope
    return 0.5 * (y[i] + y[j]) + slope * (x0 - 0.5 * (x[i] + x[j]))


def pairs(n: int, *, variant: str, k: int | None, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs: all n(n-1)/2 pairs, or k independent uniformly random matchings of
    floor(n/2) pairs each (a point is in at most k pairs)."""
    if variant == "all_pairs":
        return np.triu_indices(n, 1)
    perms = np.stack([rng.permutation(n) for _ in range(int(k))])
    half = n // 2
    return perms[:, 0:2 * half:2].ravel(), perms[:, 1:2 * half:2].ravel()


def theil_sen_cells(x: np.ndarray, y: np.ndarray, codes: np.ndarray, n: np.ndarray, *,
                    x0: float | None, lo: float, hi: float, epsilon: float, matchings: np.ndarray,
                    k: int | None, width: float, rng: np.random.Generator,
                    skip: np.ndarray | None = None) -> np.ndarray:
    """DP Theil-Sen per cell (a loop over cells); NaN for cells with n < 2 and cells in ``skip``.

    ``matchings``: per cell, True for k random matchings, False for all pairs. Per-point
    sensitivity of the rank utility: n - 1 (all pairs) or k (matchings), so the exponential
    mechanism runs at epsilon / (n - 1) or epsilon / k.
    """
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate(([0], np.cumsum(n.astype(np.int64))))
    out = np.full(n.shape[0], np.nan)
    for g in range(n.shape[0]):
        rows = order[starts[g]:starts[g + 1]]
        m = rows.size
        if m < 2 or (skip is not None and skip[g]):
            continue
        variant = "matchings" if matchings[g] else "all_pairs"
        i, j = pairs(m, variant=variant, k=k, rng=rng)
        est = pair_estimates(x[rows], y[rows], i, j, x0=x0)
        eps_em = epsilon / k if matchings[g] else epsilon / (m - 1)
        out[g] = exp_mech_median(est, lo=lo, hi=hi, epsilon=eps_em, rng=rng, width=width)
    return out
