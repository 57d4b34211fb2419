"""How far a cell is from instability: upper bounds A_k on the local sensitivity of its OLS
statistic over every data set within k row changes (docs/dp_mos.md, section 3).

DP-MOS (:mod:`dptrain.release.dp_mos`) releases a cell's theta with noise scaled to a public
bound Delta = chi / N~ only if a private test says the cell is far from any data set whose local
sensitivity exceeds Delta (propose-test-release, Dwork & Lei 2009). The test needs a distance
with sensitivity 1; it is built from bounds ``A_k(D)`` with

    (a)  A_0(D) >= LS(D)                         (the local sensitivity under add/remove)
    (b)  A_k(D) >= A_{k-1}(D')   for every neighbour D' of D and every k >= 1,

so that d(D) = min{k : A_k(D) > Delta} changes by at most 1 between neighbours, and d(D) >= 1
implies LS(D) <= Delta.

The bound. Adding (x*, y*) to a cell moves a + b x0 by e* (alpha + beta u) / (u^2 + Sxx (1 + 1/N))
and b by e* u / (u^2 + Sxx (1 + 1/N)) (u = x* - xbar, e* = y* - ybar - b u; alpha = Sxx / N,
beta = x0 - xbar; docs/release.md section 2). Removing row i from D is adding it back to D minus i, so
every change of theta between D'' and a neighbour is an addition to a data set of the ball of
radius k + 1 around D whenever D'' is within k of D. With |e*| <= R + B |u|, the change is at most

    g(v) = (R + B v)(alpha + beta v) / (v^2 + q0),   v = |u| in [0, U]     (alpha = 0, beta = 1: slope)

and A_k is the exact maximum of g over v (``_g_max``) with each parameter at its worst over the
ball of radius r = k + 1, from quantities whose bounds at radius r dominate a neighbour's at
radius r - 1 (which gives (b)):

    N - r                         the fewest rows;  mean shifts mx = r wx / (N - r), my = r wy / (N - r)
    U_r = max distance of a box x from a possible mean;  R_r likewise for y;  beta_r = |x0 - xbar| + mx
    q0 >= S*_r                    the smallest Sxx in the ball: EXACT, the best window of N - r
                                  consecutive sorted x values (adding rows never lowers Sxx)
    alpha <= S_hi / (N - r),      S_hi = Sxx + sum_{j<=r} U_j^2   (one row moves Sxx by <= U_j^2)
    B = min(sqrt(Syy_hi / S*_r), Sxy_hi / S*_r),  Syy_hi = Syy + sum R_j^2,  Sxy_hi = |Sxy| + sum U_j R_j

(caps: Sxx <= (N + r) wx^2 / 4 and Syy likewise). A_k = +inf when N - k < 4 or S*_{k+1} <= 0.
The derivation is in docs/dp_mos.md; ``tests/test_release_dp_mos.py`` checks (a) against
brute-force refits, (b) on random neighbours, and S*_k against every subset.
"""

from __future__ import annotations

import numpy as np

from .cells import Cells

#: relative slack subtracted from the window minimum of Sxx (rounding must never raise a lower bound)
_REL_SLACK = 1e-9


def window_min_sxx(xs: np.ndarray, k_max: int) -> np.ndarray:
    """S*_k for k = 0..k_max: the smallest Sxx of any N - k of the values ``xs`` (NaN where
    N - k < 2). Exact: a minimum-variance subset of fixed size of real numbers is a run of
    consecutive sorted values, so it is the best window of the sorted values."""
    x = np.sort(np.asarray(xs, dtype=np.float64))
    n = x.size
    out = np.full(k_max + 1, np.nan)
    if n < 2:
        return out
    x = x - x.mean()  # centred: the prefix-sum formula below then loses little to cancellation
    p1 = np.concatenate(([0.0], np.cumsum(x)))
    p2 = np.concatenate(([0.0], np.cumsum(x * x)))
    scale = float(p2[-1]) + 1e-300
    for k in range(min(k_max, n - 2) + 1):
        m = n - k
        s1 = p1[m:] - p1[: k + 1]
        s2 = p2[m:] - p2[: k + 1]
        w = s2 - s1 * s1 / m
        out[k] = max(float(w.min()) - _REL_SLACK * scale, 0.0)
    return out


def _g_max(r: np.ndarray, b: np.ndarray, alpha: np.ndarray, beta: np.ndarray, q0: np.ndarray,
           u: np.ndarray) -> np.ndarray:
    """max over v in [0, u] of g(v) = (r + b v)(alpha + beta v) / (v^2 + q0), all arguments >= 0
    and q0 > 0: g at 0, at u and at the roots in (0, u) of g' = 0, which is the quadratic
    -(b alpha + r beta) v^2 + 2 (b beta q0 - r alpha) v + (b alpha + r beta) q0 = 0 (the cubic
    terms cancel). Exact up to rounding, which a relative 1e-9 covers."""

    def g(v: np.ndarray) -> np.ndarray:
        return (r + b * v) * (alpha + beta * v) / (v * v + q0)

    c2 = -(b * alpha + r * beta)
    c1 = 2.0 * (b * beta * q0 - r * alpha)
    c0 = (b * alpha + r * beta) * q0
    best = np.maximum(g(np.zeros_like(u)), g(u))
    with np.errstate(invalid="ignore", divide="ignore"):
        disc = np.sqrt(np.maximum(c1 * c1 - 4.0 * c2 * c0, 0.0))
        for root in ((-c1 + disc) / (2.0 * c2), (-c1 - disc) / (2.0 * c2)):
            inside = np.isfinite(root) & (root > 0) & (root < u)
            best = np.where(inside, np.maximum(best, g(np.where(inside, root, 0.0))), best)
    return best * (1.0 + 1e-9)


def stability_bounds(cells: Cells, *, statistic: str, k_max: int) -> np.ndarray:
    """A_k for every cell and k = 0..k_max: an array (G, k_max + 1), +inf where undefined.

    Uses the cell's exact rows (PRIVATE); only the distance derived from it enters a release, and
    only through the noisy test of :mod:`dptrain.release.dp_mos`."""
    d = cells.domain
    wx, wy = d.x_hi - d.x_lo, d.y_hi - d.y_lo
    x0 = d.x0(statistic) if statistic != "slope" else None
    beta_box = None if x0 is None else max(abs(x0 - d.x_lo), abs(x0 - d.x_hi))
    G = cells.n_cells
    out = np.full((G, k_max + 1), np.inf)
    order = np.argsort(cells.codes, kind="stable")
    starts = np.concatenate(([0], np.cumsum(np.bincount(cells.codes, minlength=G))))
    xs_all = cells.x[order]
    r = np.arange(1, k_max + 2, dtype=np.float64)  # A_k uses the ball of radius k + 1
    for g in range(G):
        n = int(cells.n[g])
        if n < 4:
            continue
        s_star = window_min_sxx(xs_all[starts[g]: starts[g + 1]], k_max + 1)[1:]  # S*_r, r = 1..k_max+1
        n_lo = n - r
        with np.errstate(divide="ignore", invalid="ignore"):
            xbar, ybar = cells.sx[g] / n, cells.sy[g] / n
            sxx = max(cells.sxx[g] - cells.sx[g] * xbar, 0.0)
            syy = max(cells.syy[g] - cells.sy[g] * ybar, 0.0)
            sxy = abs(cells.sxy[g] - cells.sx[g] * ybar)
            mx, my = r * wx / n_lo, r * wy / n_lo  # how far the means can move in the ball
            u = np.minimum(wx, np.maximum(d.x_hi - (xbar - mx), (xbar + mx) - d.x_lo))
            ry = np.minimum(wy, np.maximum(d.y_hi - (ybar - my), (ybar + my) - d.y_lo))
            s_hi = np.minimum(sxx + np.cumsum(u * u), (n + r) * wx * wx / 4.0)
            syy_hi = np.minimum(syy + np.cumsum(ry * ry), (n + r) * wy * wy / 4.0)
            sxy_hi = sxy + np.cumsum(u * ry)
            b_max = np.minimum(np.sqrt(syy_hi / s_star), sxy_hi / s_star)
            if x0 is None:
                alpha, beta = np.zeros_like(r), np.ones_like(r)
            else:
                alpha, beta = s_hi / n_lo, np.minimum(beta_box, abs(x0 - xbar) + mx)
            a = _g_max(ry, b_max, alpha, beta, s_star, u)
        ok = (n_lo >= 3) & np.isfinite(s_star) & (s_star > 0) & np.isfinite(a)
        out[g] = np.where(ok, a, np.inf)
    return out


def distance_to_instability(bounds: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Per cell, min{k : A_k > Delta_g}, or k_max + 1 when no k up to k_max exceeds it (a cap
    keeps the sensitivity at 1). Delta NaN or <= 0 gives 0."""
    a = np.asarray(bounds, dtype=np.float64)
    dl = np.asarray(delta, dtype=np.float64)[:, None]
    over = ~(a <= dl)  # NaN Delta or NaN A: unstable
    first = np.where(over.any(axis=1), over.argmax(axis=1), a.shape[1])
    return first.astype(np.int64)
