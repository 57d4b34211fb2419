"""DP Theil-Sen (``release.method=theil_sen | theil_sen_wide``; Alabi et al. 2022, section 2.2,
DPExpTheilSen / DPWideTheilSen): per cell, the exponential-mechanism median of pairwise-line
estimates. Pure epsilon-DP, replace-one within a cell (docs/release.md section 5).

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
number of its pairs: the sensitivity argument (n - 1 or k) is unchanged.

95% interval (issue 18; ``TheilSenConfig.interval_share``, 0.3 in the registered methods): that share
of epsilon goes to the 25% and 75% quantiles of the same pair estimates (half each), the rest to the
median; the interval is post-processing of the three draws (dptrain/release/methods/_ts_interval.py).

Caveat: the sampling is textbook floating point (Gumbel-max, a uniform draw), not a
bit-exact exponential mechanism (Ilvento 2020); adequate for comparing accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours
from dptrain.release.api import CellEstimates
from dptrain.release.cells import Cells, ReleaseError
from dptrain.release.methods._ts_interval import KAPPA, IntervalConfig, ts_interval
from dptrain.release.methods.base import RELEASE_METHODS, MethodResult, ReleaseMethod
from dptrain.release.methods.common import (
    ALABI,
    NO_INTERVAL,
    check_epsilon,
    check_fraction,
    check_int,
    check_statistic,
    method_meta,
    reasons,
    result_frame,
    widths,
)
from dptrain.release.spec import ReleaseSpec

#: all-pairs is not run on a cell with more pairs than this (memory: ~10 float64 arrays of this
#: size); such a cell uses k matchings (variant auto) or is not released (variant all_pairs)
MAX_PAIRS = 20_000_000


# ---------------------------------------------------------------- the numeric core
def exp_mech_median(values: np.ndarray, *, lo: float, hi: float, epsilon: float,
                    rng: np.random.Generator, width: float = 0.0, quantile: float = 0.5) -> float:
    """One draw of the exponential-mechanism median of ``values`` on [lo, hi] (module docstring).

    ``epsilon`` is per unit of rank-utility sensitivity (the caller divides by the number of
    values one person can change). ``width`` > 0: the wide variant. Uniform on [lo, hi] when
    there are no values or epsilon is 0. ``quantile`` q != 1/2: the q-quantile, utility
    -|(1 - q) #{v < r} - q #{v > r}| (= -|j - q m| between sorted values; sensitivity
    max(q, 1 - q) <= 1 per changed value, so the same epsilon calibration).
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
        logw = np.log(lengths) - epsilon * np.abs(j - quantile * m) / 2.0
    pick = int(np.argmax(logw + rng.gumbel(size=m + 1)))
    return float(rng.uniform(edges[pick], edges[pick + 1]))


INTERVAL = (
    "none: ci_low / ci_high are NaN; the exponential-mechanism median has no closed-form error law; its "
    "spread depends on the private spread of the pair estimates around their median (not released), and the "
    "Theil-Sen median's sampling SD also needs the residual SD; a valid interval would need a parametric "
    "bootstrap on synthetic cells whose x distribution (private) is unknown, or extra epsilon for a DP spread "
    "estimate; not built")


INTERVAL_SHARE = 0.3  # share of epsilon the registered methods spend on the interval's quartiles
INTERVAL_TS = (
    "test inversion: theta is in the interval unless the released median is outside the central 95% of its law "
    "given theta (normal sampling error of the Theil-Sen median, then the exponential mechanism on the public range); "
    "the pair-estimate CDF is modelled through the released 25% / 75% pair quantiles (linear centre, Cauchy tails), "
    "the sampling SD is kappa sqrt(2 pi) IQR / (1.349 sqrt(N)) with kappa calibrated by simulation (0.43 p25/p75, "
    "0.285 slope); released draws and public settings only (dptrain/release/methods/_ts_interval.py); "
    "APPROXIMATE: measured 0.90-0.99 per cell-size band on simulated Atlas-like cells, but 0.83-0.89 in cells "
    "below N = 100 of the Figure-2 design at epsilon 1 (experiments/mos_vs_baselines)")


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


@dataclass(frozen=True)
class MedianConfig:
    """What every cell's median uses: the prediction point ``x0`` (None: the slope), the public
    range [lo, hi], the number of matchings ``k``, the wide median's ``width`` (0: plain) and the
    ``spread`` share of epsilon spent on the 25% and 75% quantiles (0: none)."""

    x0: float | None
    lo: float
    hi: float
    k: int | None
    width: float
    spread: float = 0.0  # share of epsilon for the quartiles (half each); 0: median only


def theil_sen_cells(cells: Cells, *, epsilon: float, matchings: np.ndarray, rng: np.random.Generator,
                    skip: np.ndarray | None = None, config: MedianConfig) -> np.ndarray:
    """DP Theil-Sen per cell (a loop over cells); NaN for cells with n < 2 and cells in ``skip``.

    ``matchings``: per cell, True for k random matchings, False for all pairs. Per-point
    sensitivity of the rank utility: n - 1 (all pairs) or k (matchings), so the exponential
    mechanism runs at epsilon / (n - 1) or epsilon / k. Returns (cells, 3): the median and, with
    ``config.spread`` > 0, the 25% and 75% quantiles (else NaN), at (1 - spread) epsilon and
    spread / 2 epsilon each (basic composition: epsilon in all).
    """
    x, y, n, k = cells.x, cells.y, cells.n, config.k
    order = np.argsort(cells.codes, kind="stable")
    starts = np.concatenate(([0], np.cumsum(n.astype(np.int64))))
    out = np.full((n.shape[0], 3), np.nan)
    share = (1.0 - config.spread, 0.5 * config.spread, 0.5 * config.spread)
    for g in range(n.shape[0]):
        rows = order[starts[g]:starts[g + 1]]
        m = rows.size
        if m < 2 or (skip is not None and skip[g]):
            continue
        i, j = pairs(m, variant="matchings" if matchings[g] else "all_pairs", k=k, rng=rng)
        est = pair_estimates(x[rows], y[rows], i, j, x0=config.x0)
        eps_em = epsilon / k if matchings[g] else epsilon / (m - 1)
        out[g, 0] = exp_mech_median(est, lo=config.lo, hi=config.hi, epsilon=eps_em * share[0], rng=rng,
                                    width=config.width)
        for c, q in ((1, 0.25), (2, 0.75)) if config.spread > 0 else ():
            out[g, c] = exp_mech_median(est, lo=config.lo, hi=config.hi, epsilon=eps_em * share[c], rng=rng,
                                        width=0.0, quantile=q)
    return out


# ---------------------------------------------------------------- the method
@dataclass(frozen=True)
class TheilSenConfig:
    """``variant``: "all_pairs" | "matchings" | "auto"; ``k``: matchings (needed unless all_pairs);
    ``wide``: the wide median, ``width`` (unit scale, 0.01 in the paper); ``value_range``: the
    public range of the pair estimates (None: the default of :func:`dp_theil_sen`);
    ``interval_share``: the share of epsilon spent on the pair quartiles for the 95% interval
    (0: no interval; the registered methods use :data:`INTERVAL_SHARE`)."""

    variant: str = "all_pairs"
    k: int | None = None
    wide: bool = False
    width: float = 0.01
    value_range: tuple[float, float] | None = None
    interval_share: float = 0.0


def _value_range(cells: Cells, statistic: str, value_range: tuple | None) -> tuple[float, float]:
    d = cells.domain
    wx, wy = widths(cells)
    if value_range is None:
        value_range = ((-4.0 * wy / wx, 4.0 * wy / wx) if statistic == "slope"
                       else (d.y_lo - wy / 2, d.y_hi + wy / 2))
    lo, hi = (float(v) for v in value_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ReleaseError(f"release.value_range={value_range!r} is not allowed: finite lo < hi")
    return lo, hi


def _check_share(share: float) -> float:
    if share == 0:
        return 0.0
    return check_fraction(share, "theil_sen interval_share")


def _interval(est: np.ndarray, n: np.ndarray, matchings: np.ndarray, eps: float, *, statistic: str,
              config: MedianConfig) -> tuple[tuple, str, str]:
    """(ci, the meta's interval text, the epsilon split text) from the released median and quartiles
    (``est`` columns) and public settings (dptrain.release.methods._ts_interval)."""
    if config.spread == 0:
        return NO_INTERVAL, INTERVAL, "all epsilon to one exponential-mechanism median"
    n = n.astype(np.float64)
    m = np.where(matchings, float(config.k or 0) * np.floor(n / 2), n * (n - 1) / 2)
    eps_em = np.where(matchings, eps / float(config.k or 1), eps / np.maximum(n - 1, 1))
    a = (1.0 - config.spread) * eps_em * m / 2.0
    icfg = IntervalConfig(lo=config.lo, hi=config.hi, width=config.width,
                          kappa=KAPPA["slope" if statistic == "slope" else "level"])
    ci = ts_interval(est[:, 0], est[:, 1], est[:, 2], n, a, np.where(matchings, m, 0.0), config=icfg)
    split = (f"{1 - config.spread:g} of epsilon to the exponential-mechanism median, {config.spread / 2:g} each "
             "to the 25% and 75% quantiles of the same pair estimates (for the interval)")
    return ci, INTERVAL_TS, split


def _split_text(variant: str, k: int | None) -> str:
    return {"all_pairs": f"all pairs at epsilon/(n-1) (cells above {MAX_PAIRS:,} pairs not released)",
            "matchings": f"k = {k} random matchings at epsilon/k",
            "auto": f"all pairs at epsilon/(n-1) up to {MAX_PAIRS:,} pairs, else k = {k} random "
                    "matchings at epsilon/k (chosen by the public n)"}[variant]


def dp_theil_sen(cells: Cells, *, statistic: str, epsilon: float, rng: np.random.Generator,
                 config: TheilSenConfig = TheilSenConfig()) -> tuple[pd.DataFrame, dict]:
    """DP Theil-Sen (Alabi et al. 2022, DPExpTheilSen / DPWideTheilSen). epsilon-DP (pure),
    replace-one within a cell (each cell's n public).

    Per pair of points with distinct x: the pair's line's prediction at x0 (p25/p75) or its slope;
    clipped to ``value_range``; the median by the exponential mechanism (module docstring).
    ``variant="all_pairs"``: all n(n-1)/2 pairs, each point in n - 1 of them, so the mechanism
    runs at epsilon / (n - 1); a cell with more than ``MAX_PAIRS`` pairs is NOT released
    (reason "all-pairs limit", no N quoted). ``"matchings"``: k random perfect matchings, each point
    in <= k pairs, epsilon / k. ``"auto"``: all pairs up to the limit, k matchings above it (needs
    k). Choosing by n is allowed here: n is public under replace-one neighbours. Either way the
    cell's estimate is epsilon-DP. ``wide``: values below/above the median pushed ``width`` (0.01
    in the paper, on the unit scale; scaled by the y width, by wy / wx for the slope) away first.
    Default range: [-0.5, 1.5] on the unit square for p25/p75 (the paper); for the slope
    [-4, 4] wy / wx, the slopes of lines whose p25 and p75 both lie in [-0.5, 1.5].
    Cells with N < 2 (public under replace-one) are not released; noise_sd is NaN.
    """
    check_statistic(statistic)
    eps = check_epsilon(epsilon)
    variant, k = config.variant, config.k
    if variant not in ("all_pairs", "matchings", "auto"):
        raise ReleaseError(f"release.theil_sen_variant={variant!r} is not allowed: auto, all_pairs or matchings")
    if variant != "all_pairs":
        k = check_int(k, "release.theil_sen_k (matchings)")
    wx, wy = widths(cells)
    lo, hi = _value_range(cells, statistic, config.value_range)
    too_many = cells.n * (cells.n - 1) / 2 > MAX_PAIRS
    w = float(config.width) * (wy / wx if statistic == "slope" else wy) if config.wide else 0.0
    median = MedianConfig(x0=None if statistic == "slope" else cells.domain.x0(statistic), lo=lo, hi=hi, k=k, width=w,
                          spread=_check_share(config.interval_share))
    skip = (variant == "all_pairs") & too_many
    matchings = np.full(cells.n_cells, variant == "matchings") | ((variant == "auto") & too_many)
    theta = theil_sen_cells(cells, epsilon=eps, rng=rng, skip=skip, config=median, matchings=matchings)
    ci, interval, split = _interval(theta, cells.n, matchings, eps, statistic=statistic, config=median)
    theta = theta[:, 0]
    reason = reasons(cells.n_cells, [
        (cells.n < 2, "N < 2: no pairs"),
        (skip, f"all-pairs limit ({MAX_PAIRS:,} pairs) exceeded; allowed: release.theil_sen_variant=auto or matchings"),
    ])
    return result_frame(reason, theta, np.nan, ci=ci), method_meta(
        "dp_theil_sen" + ("_wide" if config.wide else ""), statistic, "replace_one", eps, 0.0,
        split=f"{split}; {_split_text(variant, k)}",
        guarantee="epsilon-DP (pure), replace-one within a cell (each cell's N treated as public)",
        reference=ALABI + ", DPTheilSen", variant=variant, k=k, value_range=(lo, hi), width=w,
        caveats=["exponential mechanism sampled in floating point (not bit-exact)"], interval=interval,
        interval_share=median.spread)


class TheilSen(ReleaseMethod):
    """DP Theil-Sen with ``release.theil_sen_variant`` and ``release.theil_sen_k``."""

    neighbours = Neighbours.REPLACE_ONE

    def __init__(self, *, wide: bool) -> None:
        self.wide = wide

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseSpec) -> MethodResult:
        ts = TheilSenConfig(variant=config.theil_sen_variant, k=config.theil_sen_k, wide=self.wide,
                            interval_share=INTERVAL_SHARE)
        return MethodResult(*dp_theil_sen(est.cells, statistic=config.statistic, epsilon=epsilon, rng=rng, config=ts))


RELEASE_METHODS.register("theil_sen", TheilSen(wide=False))
RELEASE_METHODS.register("theil_sen_wide", TheilSen(wide=True))
