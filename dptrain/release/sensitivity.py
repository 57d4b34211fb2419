"""Local sensitivity LS_g of per-cell OLS statistics and of their standard errors (docs/release.md sections 2, 4).

Closed forms, vectorised over cells and rows (no Python loop over cells); the math lives in
``dptrain.release._ls_math``. For a statistic theta in {p25, p75, slope} with influence factor
alpha + beta u ((S/n, x0 - xbar) for a + b x0; (0, 1) for b), u = x - xbar, S = Sxx:

    add (x*, y*):   d_add = e* (alpha + beta u) / (u^2 + S (1 + 1/n)),     e* = y* - yhat(x*)
    remove row i:   d_rem,i = -e_i (alpha + beta u_i) / (S (1 - 1/n) - u_i^2)

(p25/p75: the paper's formula times S/S; slope: d_add = u e* / (S (1 + 1/n) + u^2)).
LS_add is the EXACT sup over the domain (y* at its ends, x* at the domain ends or at the roots
of a quadratic, see ``_ls_math.theta_add_sup``); LS_remove is the max over rows of |d_rem,i|.

The SE (``se_local_sensitivity``) uses the rank-one updates of n, xbar, Sxx and RSS; its add
sup over x* is NUMERICAL (a scale-aware grid plus golden-section refinement,
``_ls_math.se_add_sup``).

Undefined cells get LS = +inf and a reason: "n < 3", "no spread in x" (``cells.ols``), "no spread
in x after removing one row" (Sxx' <= 1e-12 sum x'^2, the same rule as ``cells.ols``). Removing a
row of an n = 3 cell leaves a 2-point line, which is defined: theta's LS is finite there. The SE
needs n' - 2 >= 1, so under ``add_remove`` the SE's LS is +inf for n = 3 ("n < 4: SE undefined
after removing one row"); under ``add`` it is finite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dptrain.release import _ls_math as M
from dptrain.release.cells import STATISTICS, Cells, Domain, ReleaseError

NEIGHBORS: tuple[str, ...] = ("add", "add_remove")
BEAT_REL = 1e-9  # "the exact sup beat the corners" means sup > corners (1 + 1e-9)
StatFn = Callable[[np.ndarray, np.ndarray], float]


@dataclass(frozen=True)
class Sensitivity:
    """Per-cell local sensitivity (float64 arrays of length G).

    Attributes:
        ls: the LS used: ls_add (``add``) or max(ls_add, ls_remove) (``add_remove``); +inf where
            undefined.
        ls_add: sup over one added point anywhere in the domain.
        ls_remove: max over removing one existing row (all NaN when neighbors == "add").
        ls_corners: the add-side max over the 4 domain corners only (the Stata guide).
        beat_corners: ls_add > ls_corners (1 + 1e-9).
        reason: "" where ``ls`` is finite, else why it is infinite.
    """

    ls: np.ndarray
    ls_add: np.ndarray
    ls_remove: np.ndarray
    ls_corners: np.ndarray
    beat_corners: np.ndarray
    reason: np.ndarray


def _check(statistic: str | None, neighbors: str) -> None:
    if neighbors not in NEIGHBORS:
        raise ReleaseError(f"release.neighbors={neighbors!r} is not allowed: "
                           f"use one of {', '.join(NEIGHBORS)}")
    if statistic is not None and statistic not in STATISTICS:
        raise ReleaseError(f"release.statistic={statistic!r} is not allowed: "
                           f"use one of {', '.join(STATISTICS)}")


def _finish(cells: Cells, fit: M.CellFit, add: np.ndarray, corners: np.ndarray,
            rem: np.ndarray | None,
            extra: list[tuple[np.ndarray, str]]) -> Sensitivity:
    """Assemble a Sensitivity: reasons in priority order, +inf wherever a reason applies."""
    G = cells.n_cells
    reason = np.full(G, "", dtype=object)
    reason[~fit.ok] = "no spread in x"
    reason[cells.n < 3] = "n < 3"
    if rem is not None:
        extra = extra + [(fit.ok & np.isinf(rem), "no spread in x after removing one row")]
    for mask, msg in extra:
        reason[mask & (reason == "")] = msg
    bad = reason != ""
    add = np.where(fit.ok, add, np.inf)
    corners = np.where(fit.ok, corners, np.inf)
    beat = fit.ok & (add > corners * (1.0 + BEAT_REL))
    if rem is None:
        rem = np.full(G, np.nan)
        ls = add.copy()
    else:
        rem = np.where(fit.ok, rem, np.inf)
        ls = np.maximum(add, rem)
    ls[bad] = np.inf
    return Sensitivity(ls=ls, ls_add=add, ls_remove=rem, ls_corners=corners, beat_corners=beat,
                       reason=reason)


def local_sensitivity(cells: Cells, *, statistic: str, neighbors: str = "add_remove",
                      moments: M.CellFit | None = None) -> Sensitivity:
    """LS of theta in {p25, p75, slope} per cell, in closed form.

    Args:
        cells: the grouped rows (``make_cells`` / ``group_cells``).
        statistic: "p25" or "p75" (a + b x0, x0 = domain.x0(statistic)) or "slope" (b).
        neighbors: "add" (one point added anywhere in the domain) or "add_remove" (also one row
            removed; the default).
        moments: the cells' refined OLS moments (``_ls_math.fit_cells``) if already computed
            (``CellEstimates.moments`` computes them once per run); else computed here.

    Returns:
        Sensitivity; see the module docstring for the formulas. The add sup is exact.

    Raises:
        ReleaseError: unknown statistic or neighbour relation.
    """
    _check(statistic, neighbors)
    fit = M.fit_cells(cells) if moments is None else moments
    alpha, beta = M.influence(fit, statistic, cells.domain)
    add, corners = M.theta_add_sup(fit, alpha, beta, cells.domain)
    rem = None
    if neighbors == "add_remove":
        params = np.column_stack([alpha, beta, fit.S * (1.0 - 1.0 / fit.n), fit.tol])
        rem = M.rowwise_max(cells, fit, params, M.theta_remove_kernel)
    return _finish(cells, fit, add, corners, rem, [])


def se_local_sensitivity(cells: Cells, *, statistic: str, neighbors: str = "add_remove",
                         grid: int = 129, moments: M.CellFit | None = None) -> Sensitivity:
    """LS of the homoskedastic OLS standard error of theta (docs/release.md section 4: the SE as a statistic).

    Add (x*, y*), u = x* - xbar, e* = y* - yhat(x*), h* = 1/n + u^2/S:
        RSS' = RSS + e*^2/(1 + h*), n' = n + 1, xbar' = xbar + u/(n+1), S' = S + n u^2/(n+1).
    Remove row i (h_i = 1/n + u_i^2/S):
        RSS' = RSS - e_i^2/(1 - h_i), n' = n - 1, xbar' = xbar - u_i/(n-1), S' = S - n u_i^2/(n-1).
    SE' = sqrt(RSS'/(n'-2) * (1/n' + (x0 - xbar')^2/S')) for p25/p75, sqrt(RSS'/((n'-2) S')) for
    slope. The add sup is numerical (``_ls_math.se_add_sup``: y* in {y_lo, y_hi, clip(yhat(x*))},
    x* on a ``grid``-point asinh-spaced grid plus golden-section refinement); removal is exact.

    Args:
        cells: the grouped rows.
        statistic: "p25", "p75" or "slope".
        neighbors: "add" or "add_remove".
        grid: grid points per cell for the add-side search over x*.
        moments: precomputed refined OLS moments, as for :func:`local_sensitivity`.

    Raises:
        ReleaseError: unknown statistic or neighbour relation.
    """
    _check(statistic, neighbors)
    fit = M.fit_cells(cells) if moments is None else moments
    slope = statistic == "slope"
    c = np.zeros_like(fit.S) if slope else cells.domain.x0(statistic) - fit.xbar
    se0 = M.se_value(fit.rss, fit.n, fit.S, c, slope)
    add, corners = M.se_add_sup(fit, c, se0, slope, cells.domain, config=M.SESearchConfig(grid=grid))
    rem, extra = None, []
    if neighbors == "add_remove":
        rem = M.rowwise_max(cells, fit, M.se_remove_params(fit, c, se0), M.se_remove_kernel(slope))
        small = fit.ok & (cells.n < 4)
        rem[small] = np.inf
        extra = [(small, "n < 4: SE undefined after removing one row")]
    return _finish(cells, fit, add, corners, rem, extra)


# ----------------------------------------------------------------------------- brute force


def _safe(stat_fn: StatFn, x: np.ndarray, y: np.ndarray) -> float:
    try:
        v = float(stat_fn(x, y))
    except Exception:  # noqa: BLE001 - any failure of a user statistic means "undefined"
        return np.nan
    return v


def brute_force_local_sensitivity(x: np.ndarray, y: np.ndarray, *,
                                  stat_fn: StatFn, domain: Domain,
                                  neighbors: str = "add_remove", grid: int = 101) -> float:
    """LS of an arbitrary statistic by refitting: max |stat(neighbour) - stat(cell)|.

    Rows are clipped to the domain first. Neighbours: each row removed (``add_remove``) and one
    point added at each of grid x grid domain points (a linspace over each axis, so the 4 corners
    included). A lower bound on the true add sup for statistics whose sup is interior.

    Args:
        x, y: the cell's rows.
        stat_fn: (x, y) -> float; raising or returning a non-finite value means undefined.
        domain: the public domain.
        neighbors: "add" or "add_remove".
        grid: points per axis for additions (>= 2).

    Returns:
        The LS, +inf if the statistic is undefined on the cell or on any neighbour.
    """
    _check(None, neighbors)
    x = np.clip(np.asarray(x, dtype=np.float64), domain.x_lo, domain.x_hi)
    y = np.clip(np.asarray(y, dtype=np.float64), domain.y_lo, domain.y_hi)
    theta = _safe(stat_fn, x, y)
    if not np.isfinite(theta):
        return np.inf
    best = 0.0
    neighbours: list[tuple[np.ndarray, np.ndarray]] = []
    if neighbors == "add_remove":
        neighbours += [(np.delete(x, i), np.delete(y, i)) for i in range(x.shape[0])]
    xs = np.linspace(domain.x_lo, domain.x_hi, max(int(grid), 2))
    ys = np.linspace(domain.y_lo, domain.y_hi, max(int(grid), 2))
    for xn, yn in neighbours:
        v = _safe(stat_fn, xn, yn)
        if not np.isfinite(v):
            return np.inf
        best = max(best, abs(v - theta))
    for xa in xs:
        for ya in ys:
            v = _safe(stat_fn, np.append(x, xa), np.append(y, ya))
            if not np.isfinite(v):
                return np.inf
            best = max(best, abs(v - theta))
    return best


def brute_force_cells(cells: Cells, *, stat_fn: StatFn,
                      neighbors: str = "add_remove", grid: int = 101) -> np.ndarray:
    """``brute_force_local_sensitivity`` for every cell (a Python loop: small data only)."""
    _check(None, neighbors)
    order = np.argsort(cells.codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(cells.codes, minlength=cells.n_cells))])
    out = np.empty(cells.n_cells)
    for g in range(cells.n_cells):
        rows = order[bounds[g]:bounds[g + 1]]
        out[g] = brute_force_local_sensitivity(cells.x[rows], cells.y[rows], stat_fn=stat_fn,
                                               domain=cells.domain, neighbors=neighbors, grid=grid)
    return out


def _ols_arrays(x: np.ndarray, y: np.ndarray, min_n: int) -> tuple[float, ...] | None:
    """(n, xbar, S, b, RSS) by two-pass OLS, None if n < min_n or Sxx <= 1e-12 sum x^2.

    Deliberately NOT ``cells.ols``: the brute force is the independent reference the closed
    forms are tested against, so it refits each neighbour's rows from scratch (two passes)."""
    n = x.shape[0]
    if n < min_n:
        return None
    u = x - x.mean()
    S = float(u @ u)
    if not S > M.REL_TOL * float(x @ x):
        return None
    d = y - y.mean()
    b = float(u @ d) / S
    r = d - b * u
    return float(n), float(x.mean()), S, b, float(r @ r)


def _refit_fn(statistic: str, domain: Domain, min_n: int,
              value: Callable[[np.ndarray, tuple[float, float, float, float, float], float], float]) -> StatFn:
    """stat_fn for the brute force: ``value(y, fit, c)`` of a refit (n, xbar, Sxx, b, rss), c = x0 -
    xbar (0 for the slope); NaN when n < ``min_n`` or x has no spread."""
    _check(statistic, "add")

    def fn(x: np.ndarray, y: np.ndarray) -> float:
        f = _ols_arrays(x, y, min_n)
        if f is None:
            return np.nan
        return value(y, f, 0.0 if statistic == "slope" else domain.x0(statistic) - f[1])

    return fn


def ols_statistic_fn(statistic: str, domain: Domain) -> StatFn:
    """stat_fn for the brute force: theta of a refit (NaN when n < 2 or no spread in x)."""
    if statistic == "slope":
        return _refit_fn(statistic, domain, 2, lambda y, f, c: f[3])
    return _refit_fn(statistic, domain, 2, lambda y, f, c: float(y.mean()) + f[3] * c)


def ols_se_fn(statistic: str, domain: Domain) -> StatFn:
    """stat_fn for the brute force: the SE of theta of a refit (NaN when n < 3 or no spread)."""
    return _refit_fn(statistic, domain, 3, lambda y, f, c: float(M.se_value(f[4], f[0], f[2], c,
                                                                                 statistic == "slope")))
