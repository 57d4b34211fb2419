"""Vectorised math behind ``dptrain.release.sensitivity`` (docs/release.md section 2).

Notation, per cell: n rows, means xbar and ybar, S = Sxx = sum (x_i - xbar)^2, slope b, residuals
e_i = (y_i - ybar) - b u_i with u_i = x_i - xbar, and RSS = sum e_i^2.

Every built-in statistic is linear in the coefficients, theta = z'beta, and its change under a
rank-one update of X'X is e * z'(X'X)^-1 x / (1 +- h). Multiplying numerator and denominator by S
gives one form for both statistics, with an "influence factor" alpha + beta u:

    theta = a + b x0:  alpha = S / n, beta = c = x0 - xbar
    theta = b       :  alpha = 0,     beta = 1

    add (x*, y*), u = x* - xbar, e* = y* - ybar - b u:
        d_add(u, e*) = e* (alpha + beta u) / (u^2 + q0),          q0 = S (1 + 1/n)
    remove row i:
        d_rem,i = -e_i (alpha + beta u_i) / (S (1 - 1/n) - u_i^2),
                  and S (1 - 1/n) - u_i^2 = (n - 1)/n * Sxx after the removal.

Rows are processed in chunks (``ROW_CHUNK``) so that per-row temporaries stay small; per-cell
parameters are packed into one (G, k) array and gathered with one fancy index per chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dptrain.release.cells import Cells, Domain, OLSFit, ols

ROW_CHUNK = 1 << 20
# cells.ols: "no spread in x" when Sxx <= 1e-12 * sum x^2; the same rule is applied after a removal
REL_TOL = 1e-12
GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True)
class CellFit:
    """Refined OLS moments per cell (``fit_cells``). Where ``ok`` is False (``cells.ols`` says
    undefined) the values are harmless placeholders (n=3, S=1, b=0, ...) whose results the caller
    overwrites."""

    ok: np.ndarray
    n: np.ndarray
    xbar: np.ndarray
    ybar: np.ndarray
    S: np.ndarray
    b: np.ndarray
    rss: np.ndarray
    tol: np.ndarray  # removal of row i leaves no spread iff S (1 - 1/n) - u_i^2 <= tol


Block = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _row_blocks(cells: Cells, packed: np.ndarray) -> Iterator[Block]:
    """Yield (codes, x, y, packed[codes]) per chunk of rows. The (G, k) per-cell table is gathered
    as one k*8-byte record per row (a void view + ``np.take``): one cache line per row instead of
    k separate random reads."""
    packed = np.ascontiguousarray(packed, dtype=np.float64)
    k = packed.shape[1]
    rec = packed.view(np.dtype((np.void, 8 * k))).ravel()
    for start in range(0, cells.codes.shape[0], ROW_CHUNK):
        sl = slice(start, start + ROW_CHUNK)
        c = cells.codes[sl]
        yield c, cells.x[sl], cells.y[sl], np.take(rec, c).view(np.float64).reshape(-1, k)


def fit_cells(cells: Cells, fit: OLSFit | None = None) -> CellFit:
    """Per-cell OLS moments, refined in one pass over the rows (float64, no raw-sum cancellation).

    Not a second OLS: a refinement of ``cells.ols`` (``fit``, computed here if not given) that
    the sensitivity formulas need, since they subtract nearly equal moments.
    ``cells.ols`` decides which cells are defined and gives starting values xbar, ybar, b0. With
    u_i = x_i - xbar and e0_i = (y_i - ybar) - b0 u_i, one pass accumulates S = sum u^2,
    Q = sum u e0 and R = sum e0^2; then the exact least-squares slope and RSS about those means are
        b = b0 + Q / S,    RSS = R - Q^2 / S
    (b0 is already close, so Q is tiny and nothing cancels). The removal tolerance mirrors ``ols``:
    Sxx' <= 1e-12 sum x'^2, i.e. S (1 - 1/n) - u_i^2 <= 1e-12 sum x^2 (n - 1)/n.
    """
    f = ols(cells) if fit is None else fit
    ok = f.defined
    G = cells.n_cells
    n = np.where(ok, cells.n, 3.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        xbar = np.where(ok, cells.sx / cells.n, 0.0)
        ybar = np.where(ok, cells.sy / cells.n, 0.0)
    b0 = np.where(ok, f.b, 0.0)
    S, Q, R = np.zeros(G), np.zeros(G), np.zeros(G)
    for c, x, y, g in _row_blocks(cells, np.column_stack([xbar, ybar, b0])):
        u = x - g[:, 0]
        e = y - g[:, 1]
        e -= g[:, 2] * u
        S += np.bincount(c, weights=u * u, minlength=G)
        Q += np.bincount(c, weights=u * e, minlength=G)
        R += np.bincount(c, weights=e * e, minlength=G)
    S = np.where(ok, S, 1.0)
    b = np.where(ok, b0 + Q / S, 0.0)
    rss = np.where(ok, np.maximum(R - Q * Q / S, 0.0), 0.0)
    tol = REL_TOL * np.where(ok, cells.sxx, 0.0) * (n - 1.0) / n
    return CellFit(ok=ok, n=n, xbar=xbar, ybar=ybar, S=S, b=b, rss=rss, tol=tol)


def rowwise_max(cells: Cells, fit: CellFit, params: np.ndarray,
                kernel: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Per cell, max over its rows of ``kernel(u_i, e_i, params[code_i])`` (>= 0), with
    u_i = x_i - xbar, e_i = (y_i - ybar) - b u_i; grouped by ``np.maximum.at`` (unbuffered)."""
    out = np.zeros(cells.n_cells)
    for c, x, y, g in _row_blocks(cells, np.column_stack([fit.xbar, fit.ybar, fit.b, params])):
        u = x - g[:, 0]
        e = y - g[:, 1]
        e -= g[:, 2] * u
        with np.errstate(invalid="ignore"):  # NaN rows only occur in cells the caller overrides
            np.maximum.at(out, c, kernel(u, e, g[:, 3:]))
    return out


def influence(fit: CellFit, statistic: str, domain: Domain) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta) of the influence factor: (S/n, x0 - xbar) for p25/p75, (0, 1) for slope."""
    if statistic == "slope":
        return np.zeros_like(fit.S), np.ones_like(fit.S)
    return fit.S / fit.n, domain.x0(statistic) - fit.xbar


def theta_add_sup(fit: CellFit, alpha: np.ndarray, beta: np.ndarray,
                  domain: Domain) -> tuple[np.ndarray, np.ndarray]:
    """Exact sup over the domain of |d_add|, and the max over the 4 corners only.

    d_add is linear in y*, so y* in {y_lo, y_hi}. For fixed y* (r = y* - ybar) it is N(u)/D(u) with
        N = p2 u^2 + p1 u + p0,  p2 = -b beta,  p1 = r beta - b alpha,  p0 = r alpha,
        D = u^2 + q0.
    N'D - N D' = -p1 u^2 + 2 (p2 q0 - p0) u + p1 q0 (the cubic terms cancel), so the interior
    stationary points solve p1 u^2 - 2 B u - p1 q0 = 0 with B = p2 q0 - p0: real roots
    (B +- sqrt(B^2 + p1^2 q0)) / p1 whose product is -q0. We take u1 = (B + sign(B) sqrt(.)) / p1
    and u2 = -q0 / u1 = -q0 p1 / (B + sign(B) sqrt(.)) (no cancellation; p1 = 0 gives u2 = 0
    and u1 at infinity). Candidates: the two domain ends and the roots clipped into the domain.
    """
    q0 = fit.S * (1.0 + 1.0 / fit.n)
    ulo, uhi = domain.x_lo - fit.xbar, domain.x_hi - fit.xbar

    def d(u: np.ndarray, r: np.ndarray) -> np.ndarray:
        return np.abs((r - fit.b * u) * (alpha + beta * u) / (u * u + q0))

    rs = (domain.y_lo - fit.ybar, domain.y_hi - fit.ybar)
    corners = np.maximum.reduce([d(u, r) for u in (ulo, uhi) for r in rs])
    sup = corners.copy()
    for r in rs:
        p2, p1, p0 = -fit.b * beta, r * beta - fit.b * alpha, r * alpha
        B = p2 * q0 - p0
        t = B + np.copysign(np.sqrt(B * B + p1 * p1 * q0), B)
        with np.errstate(divide="ignore", invalid="ignore"):
            roots = (t / p1, -q0 * p1 / t)
        for u in roots:
            u = np.clip(np.where(np.isfinite(u), u, ulo), ulo, uhi)
            np.maximum(sup, d(u, r), out=sup)
    return sup, corners


def theta_remove_kernel(u: np.ndarray, e: np.ndarray, p: np.ndarray) -> np.ndarray:
    """|d_rem,i| = |e_i (alpha + beta u_i) / (S (1 - 1/n) - u_i^2)|; +inf where no spread is left.
    ``p`` columns: alpha, beta, S (1 - 1/n), tol."""
    den = p[:, 2] - u * u
    with np.errstate(divide="ignore", invalid="ignore"):
        val = np.abs(e * (p[:, 0] + p[:, 1] * u) / den)
    val[~(den > p[:, 3])] = np.inf
    return val


def se_value(rss, n, S, c, slope: bool):
    """Homoskedastic SE: s^2 = RSS/(n-2); slope sqrt(s^2/S); prediction sqrt(s^2 (1/n + c^2/S))."""
    s2 = np.maximum(rss, 0.0) / (n - 2.0)
    return np.sqrt(s2 / S) if slope else np.sqrt(s2 * (1.0 / n + c * c / S))


def se_after_add(n, S, rss, c, u, e, slope: bool):
    """SE after adding (x*, y*): RSS' = RSS + e*^2 S/(u^2 + q0) (= e*^2 / (1 + h*)), n' = n + 1,
    S' = S + n u^2/(n+1), c' = c - u/(n+1) (xbar' = xbar + u/(n+1))."""
    rss = rss + e * e * S / (u * u + S * (1.0 + 1.0 / n))
    return se_value(rss, n + 1.0, S + n * u * u / (n + 1.0), c - u / (n + 1.0), slope)


def golden_max(f: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray,
               iters: int) -> np.ndarray:
    """Elementwise golden-section search for max f on [lo, hi]; returns the best value seen."""
    c, d = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fc, fd = f(c), f(d)
    best = np.maximum(fc, fd)
    for _ in range(iters):
        m = fc >= fd
        lo, hi = np.where(m, lo, c), np.where(m, d, hi)
        p = np.where(m, hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo))
        fp = f(p)
        np.maximum(best, fp, out=best)
        c, d = np.where(m, p, d), np.where(m, c, p)
        fc, fd = np.where(m, fp, fd), np.where(m, fc, fp)
    return best


class SEAddCells(NamedTuple):
    """Per-cell inputs of the SE add-side search (arrays over the cells searched): the natural
    scale sig = sqrt(S (1 + 1/n)), the u range [lo, hi], n, S, RSS, c = x0 - xbar, b, and the
    y* range as mid +- half around ybar."""

    sig: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: np.ndarray
    S: np.ndarray
    rss: np.ndarray
    c: np.ndarray
    b: np.ndarray
    mid: np.ndarray
    half: np.ndarray

    def part(self, sl: slice) -> SEAddCells:
        return SEAddCells(*(a[sl] for a in self))


@dataclass(frozen=True)
class SESearchConfig:
    """The numerical add-side search of the SE's LS: ``grid`` points per cell, ``iters``
    golden-section steps, ``cell_chunk`` cells per block of the grid search (cache size)."""

    grid: int = 129
    iters: int = 32
    cell_chunk: int = 256


def _se2_add(s, sgn, p: SEAddCells, slope: bool):
    """sgn * SE'^2 after adding a point at u = clip(sig sinh(s)) with the y* that maximises
    (sgn = +1) or minimises (sgn = -1) SE'^2 there (``p``: the cells' :class:`SEAddCells`).

    SE'^2 = (RSS + e*^2 w(u)) k(u) with w = S/(u^2 + q0) (= 1/(1 + h*)) and k = (1/(n+1) +
    c'^2/S')/(n-1) (prediction) or 1/((n-1) S') (slope), increasing in e*^2. With r = y* - ybar in
    [r0, r1], mid = (r0+r1)/2, half = (r1-r0)/2 and t = |b u - mid|: max |e*| = t + half (a y*
    end), min |e*| = max(t - half, 0) (y* = clip(yhat(x*))); i.e. |e*| = max(t + sgn half, 0)."""
    n, S = p.n, p.S
    u = np.clip(p.sig * np.sinh(s), p.lo, p.hi)
    u2 = u * u
    w = S / (u2 + S * (1.0 + 1.0 / n))
    Sp = S + (n / (n + 1.0)) * u2
    if slope:
        k = 1.0 / ((n - 1.0) * Sp)
    else:
        cp = p.c - u / (n + 1.0)
        k = (1.0 / (n + 1.0) + cp * cp / Sp) / (n - 1.0)
    e = np.maximum(np.abs(p.b * u - p.mid) + sgn * p.half, 0.0)
    return sgn * (p.rss + e * e * w) * k


def _add_corners(fit: CellFit, c: np.ndarray, se0: np.ndarray, slope: bool, domain: Domain) -> np.ndarray:
    """max over the 4 domain corners of |SE' - SE| after adding that point."""
    ulo, uhi = domain.x_lo - fit.xbar, domain.x_hi - fit.xbar
    rlo, rhi = domain.y_lo - fit.ybar, domain.y_hi - fit.ybar
    args = (fit.n, fit.S, fit.rss, c)
    return np.maximum.reduce([np.abs(se_after_add(*args, u, r - fit.b * u, slope) - se0)
                              for u in (ulo, uhi) for r in (rlo, rhi)])


def _search_cells(fit: CellFit, c: np.ndarray, domain: Domain, ok: np.ndarray) -> SEAddCells:
    ulo, uhi = domain.x_lo - fit.xbar, domain.x_hi - fit.xbar
    rlo, rhi = domain.y_lo - fit.ybar, domain.y_hi - fit.ybar
    n, S = fit.n[ok], fit.S[ok]
    r0, r1 = rlo[ok], rhi[ok]
    return SEAddCells(sig=np.sqrt(S * (1.0 + 1.0 / n)), lo=ulo[ok], hi=uhi[ok], n=n, S=S, rss=fit.rss[ok],
                      c=c[ok], b=fit.b[ok], mid=(r0 + r1) / 2.0, half=(r1 - r0) / 2.0)


def se_add_sup(fit: CellFit, c: np.ndarray, se0: np.ndarray, slope: bool, domain: Domain, *,
               config: SESearchConfig = SESearchConfig()) -> tuple[np.ndarray, np.ndarray]:
    """NUMERICAL sup over the domain of |SE' - SE| after adding one point (not a proven exact sup).

    The sup is max(sqrt(max SE'^2) - SE, SE - sqrt(min SE'^2)); over y* the max of SE'^2 is at a
    y* end and the min at y* = clip(yhat(x*)) (``_se2_add``). Over x* both are rational in
    u = x* - xbar with natural scale sigma = sqrt(S (1 + 1/n)): a per-cell grid of ``grid`` points
    uniform in s = asinh(u / sigma) over the domain (dense near xbar, log-spaced far away), then
    ``iters`` golden-section steps inside the grid bracket around the best point. The 4 corners are
    always included. Returns (sup, corners) (placeholders where ``fit.ok`` is False).
    """
    grid, chunk = config.grid, config.cell_chunk
    corners = _add_corners(fit, c, se0, slope, domain)
    ok = np.flatnonzero(fit.ok)
    p = _search_cells(fit, c, domain, ok)
    sL, sH = np.arcsinh(p.lo / p.sig), np.arcsinh(p.hi / p.sig)
    step = (sH - sL) / (grid - 1)
    sgn = np.array([1.0, -1.0])
    best, kbest = np.empty((2, ok.size)), np.empty((2, ok.size), dtype=np.int64)
    t = np.linspace(0.0, 1.0, grid)[:, None]
    for a in range(0, ok.size, chunk):  # grid search, a few hundred cells at a time (cache)
        sl = slice(a, a + chunk)
        s_grid = sL[sl] + (sH[sl] - sL[sl]) * t
        vals = _se2_add(s_grid, sgn[:, None, None], p.part(sl), slope)
        kbest[:, sl] = np.argmax(vals, axis=1)
        best[:, sl] = np.take_along_axis(vals, kbest[:, None, sl], axis=1)[:, 0]
    lo_s, hi_s = sL + step * np.maximum(kbest - 1, 0), sL + step * np.minimum(kbest + 1, grid - 1)
    for a in range(0, ok.size, 16 * chunk):  # golden-section refinement of both branches
        sl = slice(a, a + 16 * chunk)
        part = p.part(sl)
        ref = golden_max(lambda s, part=part: _se2_add(s, sgn[:, None], part, slope),
                         lo_s[:, sl], hi_s[:, sl], config.iters)
        np.maximum(best[:, sl], ref, out=best[:, sl])
    s0 = se0[ok]
    ls = np.maximum(np.sqrt(best[0]) - s0, s0 - np.sqrt(np.maximum(-best[1], 0.0)))
    sup = corners.copy()
    sup[ok] = np.maximum(corners[ok], ls)
    return sup, corners


def se_remove_params(fit: CellFit, c: np.ndarray, se0: np.ndarray) -> np.ndarray:
    """Per-cell columns for ``se_remove_kernel``: S (1 - 1/n), tol, RSS/(n-3), S/(n-3), 1/(n-1),
    c, (n-1)/n, SE (n <= 3 cells get placeholders; their SE LS is +inf anyway)."""
    n3 = np.where(fit.n > 3, fit.n - 3.0, 1.0)
    return np.column_stack([fit.S * (1.0 - 1.0 / fit.n), fit.tol, fit.rss / n3, fit.S / n3,
                            1.0 / (fit.n - 1.0), c, (fit.n - 1.0) / fit.n, se0])


def se_remove_kernel(slope: bool) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """Per-row |SE' - SE| after removing row i (``p`` = ``se_remove_params`` gathered per row).

    With den = S (1 - 1/n) - u_i^2 = S (1 - h_i): RSS' = RSS - e_i^2 S/den, n' = n - 1,
    S' = den n/(n-1), c' = c + u_i/(n-1), so
        SE'^2 = (RSS - e_i^2 S/den)/(n-3) * [1/(n-1) + c'^2 (n-1)/(n den)]   (prediction)
        SE'^2 = (RSS - e_i^2 S/den)/(n-3) * (n-1)/(n den)                  (slope)
    and +inf where den <= tol (no spread left)."""

    def kernel(u: np.ndarray, e: np.ndarray, p: np.ndarray) -> np.ndarray:
        den = p[:, 0] - u * u
        with np.errstate(divide="ignore", invalid="ignore"):
            r = e * e
            r *= p[:, 3]
            r /= den
            np.subtract(p[:, 2], r, out=r)
            np.maximum(r, 0.0, out=r)
            if slope:
                k = p[:, 6] / den
            else:
                k = p[:, 4] * u
                k += p[:, 5]
                k *= k
                k *= p[:, 6]
                k /= den
                k += p[:, 4]
            r *= k
            np.sqrt(r, out=r)
            r -= p[:, 7]
            np.abs(r, out=r)
        r[~(den > p[:, 1])] = np.inf
        return r

    return kernel
