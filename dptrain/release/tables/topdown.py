"""Census-style TopDown on a geography (issue 33): noisy count vectors at every level of a tree
(nation -> states -> counties -> tracts), then a top-down pass that turns them into nonnegative
integer tables, consistent cell by cell from the tracts up to the nation, that keep the declared
invariants and structural zeros exactly. After the Census Bureau's 2020 Disclosure Avoidance
System (Abowd et al. 2022), written from its published description, simplified: one query per
unit (its full cell vector), no Gurobi.

**Measurements** (:func:`measure`, the only function that reads the exact counts). Each unit of
each level gets its vector of cell counts plus i.i.d. discrete Gaussian noise of scale
``sigma_level`` (OpenDP's exact sampler, :func:`dptrain.privacy.samplers.discrete_gaussian`).
Adding or removing one person changes exactly one unit's vector per level, by 1 in one cell: L2
sensitivity 1, so level l is rho_l = 1 / (2 sigma_l^2)-zCDP (the units of a level are disjoint and
compose in parallel) and the release is (sum_l rho_l)-zCDP. :func:`level_sigmas` splits a total rho
by shares. The structural-zero cells are public (declared impossible): they are never measured
and are 0 in every estimate.

**Invariants** (``none``, ``nation``, ``states``): totals released EXACTLY, outside the DP
guarantee (as the 2020 Census released the state populations): ``nation`` the nation's
population, ``states`` every state's population (hence the nation's too).

**Top-down pass** (:func:`topdown`; post-processing of the measurements, the invariants and the
public tree only). The nation: the nonnegative least-squares fit to its measurement subject to its
invariant total (a projection onto a scaled simplex), rounded to integers that keep the total;
without an invariant, its measurement clipped at 0. Then, level by level, each parent's children
are fitted jointly: minimise sum_children sum_cells (x - y)^2 subject to (a) the children sum to
the parent's final vector, cell by cell, (b) x >= 0, (c) x = 0 on the structural zeros. This is
the weighted least squares of TopDown: every unit of a level has the same noise variance, so the
inverse-variance weights within a level are equal and drop out, and the parent's own measurement
is not reused because the parent is already final (it was fitted from it one step above).

*Why it is a batch of simplex projections.* Neither the objective nor constraints (a)-(c) link two
cells: for parent p and cell j the problem is min sum_c (x_cj - y_cj)^2 subject to
sum_c x_cj = P_pj, x_cj >= 0, the Euclidean projection of the children's measurements onto the
simplex scaled by P_pj. Its solution is x_c = max(y_c - theta, 0) with theta found by sorting
(Held, Wolfe and Crowder 1974; Duchi et al. 2008: O(k log k)). :func:`project_simplex` does every
(parent, cell) of a level at once on a padded (parents, cells, children) array.

*The states under state invariants.* Their totals add one constraint per state across its cells,
sum_j x_sj = T_s, so the cells no longer separate: the fit is the projection onto a transportation
polytope (given row and column sums, x >= 0). :func:`project_transport` solves it by exact block
coordinate ascent on the dual, x_sj = max(y_sj - a_s - b_j, 0): alternately each state's and each
cell's threshold is a simplex threshold.

**Integer rounding that keeps the parent** (controlled rounding). Every estimate is rounded down or
up, never further: for one (parent, cell) the children get floor(x) and the largest fractional
parts get the missing units (:func:`round_to_total`), so the children sum to the parent's integer
cell exactly; under state invariants the 0/1 choice of entries to round up must keep every state
total and every cell sum, found by a maximum flow (:func:`round_transport`; it exists because the
fractional parts have integer row and column sums). Ties are broken at random (``rng``): the
children's measurements are integers shifted by one threshold, so their fractional parts are
usually all equal, and breaking those ties by position gave the first child of every parent the
extra units: at rho = 0.5 without invariants the first of the four simulated states came out
7.6 +- 1.5 people too large over 30 draws, and the first tract of each county 7 people larger
than its siblings (0.1 with random ties).

**Known effect: small units are biased upward.** Non-negativity truncates the noise of cells
whose true count is near 0 from below only, and the sum constraint takes the excess from the
other children: small units (mostly small or empty cells) come out too large on average, the
largest units slightly too small. :func:`evaluate` reports the mean signed error of the smallest
and largest units of each level.

Baselines: :func:`bottom_up` (the tract measurements summed up the tree, nothing else) and
:func:`no_post_processing` (each level's own measurements as they are; negative counts included).

Public API::

    level_sigmas(rho_total, shares), measure(geo, rho, *, shares, invariants) -> Measurements,
    topdown(hierarchy, measurements, *, rng), bottom_up(hierarchy, measurements),
    no_post_processing(hierarchy, measurements), evaluate(geo, estimates, *, tail) -> DataFrame,
    project_simplex(y, total, mask), simplex_threshold(y, total, mask), round_to_total(x, total, mask, *, rng),
    project_transport(y, row_totals, col_totals, *, tol, max_sweeps),
    round_transport(x, row_totals, col_totals, *, rng),
    INVARIANTS, DEFAULT_SHARES
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dptrain.core.errors import ReleaseError
from dptrain.data.geography import Geography, Hierarchy
from dptrain.privacy.samplers import discrete_gaussian
from dptrain.release.tables.projection import integer_split, project_simplex, round_to_total, simplex_threshold

__all__ = [
    "DEFAULT_SHARES",
    "INVARIANTS",
    "Measurements",
    "bottom_up",
    "evaluate",
    "invariant_totals",
    "level_sigmas",
    "measure",
    "no_post_processing",
    "project_simplex",
    "project_transport",
    "round_to_total",
    "round_transport",
    "simplex_threshold",
    "topdown",
]

INVARIANTS = ("none", "nation", "states")
#: rho shares of nation, state, county, tract: the finer levels, where the noise matters most, get more
DEFAULT_SHARES = (0.1, 0.2, 0.3, 0.4)


# ------------------------------------------------------------------------------ measurements


def level_sigmas(rho_total: float, shares: Sequence[float]) -> tuple[float, ...]:
    """The discrete Gaussian scale of each level when level l gets rho_total * shares[l] /
    sum(shares) (zCDP; a unit's cell vector has L2 sensitivity 1): sigma_l = 1 / sqrt(2 rho_l),
    so sum_l 1 / (2 sigma_l^2) = rho_total. A share of 0 gives inf: the level is not measured."""
    if isinstance(rho_total, bool) or not isinstance(rho_total, numbers.Real) or not (
            math.isfinite(rho_total) and rho_total > 0):
        raise ReleaseError(f"rho={rho_total!r} is not allowed: must be a finite number > 0")
    s = np.asarray(shares, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)) or np.any(s < 0) or s.sum() <= 0:
        raise ReleaseError(f"shares={tuple(shares)!r} is not allowed: one finite number >= 0 per level, "
                           "at least one > 0")
    rhos = float(rho_total) * s / s.sum()
    return tuple(math.inf if r == 0 else 1.0 / math.sqrt(2.0 * r) for r in rhos)


@dataclass(frozen=True, eq=False)
class Measurements:
    """What the release publishes: per level the noisy cell vectors (int64, units x cells; 0 on
    the structural zeros; None for a level that was not measured), the noise scales, the
    invariant totals (exact, per level; None where the level has none) and the structural
    zeros (a public cell mask)."""

    noisy: tuple[np.ndarray | None, ...]
    sigmas: tuple[float, ...]
    invariants: str
    totals: tuple[np.ndarray | None, ...]
    structural_zeros: np.ndarray
    #: each level's L2 sensitivity: 1 (one person), or k (a unit of at most k persons)
    sensitivity: float = 1.0

    @property
    def rhos(self) -> tuple[float, ...]:
        """zCDP rho of each level's measurement, sensitivity^2 / (2 sigma^2) (0 where not measured)."""
        d2 = self.sensitivity**2
        return tuple(0.0 if math.isinf(s) else d2 / (2.0 * s * s) for s in self.sigmas)

    @property
    def rho(self) -> float:
        """The whole release's zCDP rho (the invariants are outside it)."""
        return float(sum(self.rhos))


def invariant_totals(geo: Geography, invariants: str) -> tuple[np.ndarray | None, ...]:
    """The exact totals that ``invariants`` releases, per level (None where none): ``nation``
    the nation's population, ``states`` each state's population and the nation's."""
    if invariants not in INVARIANTS:
        raise ReleaseError(f"invariants={invariants!r} is not allowed: one of {INVARIANTS}")
    out: list[np.ndarray | None] = [None] * len(geo.levels)
    if invariants in ("nation", "states"):
        out[0] = geo.population(0).astype(np.int64)
    if invariants == "states":
        out[1] = geo.population(1).astype(np.int64)
    return tuple(out)


def measure(geo: Geography, rho: float, *, shares: Sequence[float] = DEFAULT_SHARES,
            invariants: str = "states", sensitivity: float = 1.0) -> Measurements:
    """The noisy measurements of every unit at every level (``rho`` zCDP in all, split by
    ``shares``, one per level) and the exact ``invariants``. ``sensitivity``: each level's L2
    sensitivity (1: one person; k: a unit of at most k persons, who move a level's counts by at
    most k in L2, all in one cell the worst case): every sigma is multiplied by it. Fresh noise
    from OpenDP's CSPRNG at every call: no seed reproduces it."""
    if len(shares) != len(geo.levels):
        raise ReleaseError(f"shares={tuple(shares)!r} is not allowed: one share per level {geo.levels}")
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Real) or not sensitivity >= 1:
        raise ReleaseError(f"sensitivity={sensitivity!r} is not allowed: a number >= 1")
    sigmas = tuple(float(sensitivity) * s for s in level_sigmas(rho, shares))
    totals = invariant_totals(geo, invariants)
    allowed = ~geo.hierarchy.structural_zeros
    noisy: list[np.ndarray | None] = []
    for counts, sigma in zip(geo.counts, sigmas):
        if math.isinf(sigma):
            noisy.append(None)
            continue
        out = np.zeros(counts.shape, dtype=np.int64)
        out[:, allowed] = discrete_gaussian(np.ascontiguousarray(counts[:, allowed]), sigma)
        noisy.append(out)
    return Measurements(noisy=tuple(noisy), sigmas=sigmas, invariants=invariants, totals=totals,
                        structural_zeros=geo.hierarchy.structural_zeros.copy(), sensitivity=float(sensitivity))


# ------------------------------------------------------------------------------ projections




def project_transport(y: np.ndarray, row_totals: np.ndarray, col_totals: np.ndarray, *, tol: float = 1e-7,
                      max_sweeps: int = 20_000) -> np.ndarray:
    """The Euclidean projection of the matrix ``y`` onto {x >= 0, row sums = ``row_totals``,
    column sums = ``col_totals``} (the totals >= 0 with equal sums). Exact block coordinate ascent
    on the dual: x = max(y - a_i - b_j, 0), each a_i (then each b_j) the simplex threshold that
    makes its row (column) sum right; stops when every row sum is within ``tol`` * (1 + total)."""
    y = np.asarray(y, dtype=np.float64)
    rows = np.asarray(row_totals, dtype=np.float64)
    cols = np.asarray(col_totals, dtype=np.float64)
    if y.shape != (rows.size, cols.size) or abs(rows.sum() - cols.sum()) > 1e-9 * (1.0 + rows.sum()):
        raise ValueError("project_transport needs one total per row and per column, with equal sums")
    b = np.zeros(cols.size)
    limit = tol * (1.0 + rows.sum())
    for _ in range(max_sweeps):
        a = simplex_threshold(y - b[None, :], rows)
        b = simplex_threshold((y - a[:, None]).T, cols)
        x = np.maximum(y - a[:, None] - b[None, :], 0.0)
        if np.max(np.abs(x.sum(axis=1) - rows)) <= limit:
            return x
    raise RuntimeError(f"project_transport did not converge in {max_sweeps} sweeps")


def _augmenting_path(supply: np.ndarray, demand: np.ndarray, cap: np.ndarray,
                     flow: np.ndarray) -> list[tuple[int, int, int]] | None:
    """A shortest path (rows and columns alternating) from a row with supply left to a column
    with demand left in the residual graph: [(row, column, +1 forward / -1 backward)], or None."""
    n_rows, n_cols = cap.shape
    seen_rows, seen_cols = supply > 0, np.zeros(n_cols, dtype=bool)
    via_row, via_col = np.full(n_cols, -1), np.full(n_rows, -1)
    frontier = list(np.flatnonzero(seen_rows))
    while frontier:
        nxt = []
        for i in frontier:
            for j in np.flatnonzero((flow[i] < cap[i]) & ~seen_cols):
                seen_cols[j], via_row[j] = True, i
                if demand[j] > 0:
                    path, col = [], j
                    while True:
                        row = int(via_row[col])
                        path.append((row, int(col), 1))
                        if via_col[row] < 0:
                            return path
                        col = int(via_col[row])
                        path.append((row, col, -1))
                for i2 in np.flatnonzero((flow[:, j] > 0) & ~seen_rows):
                    seen_rows[i2], via_col[i2] = True, j
                    nxt.append(i2)
        frontier = nxt
    return None


def _bipartite_flow(supply: np.ndarray, demand: np.ndarray, cap: np.ndarray) -> np.ndarray | None:
    """An integer flow from rows (``supply``) to columns (``demand``) over the edges of capacity
    ``cap`` that meets every supply and demand (augmenting paths), or None if there is none."""
    supply, demand = supply.astype(np.int64).copy(), demand.astype(np.int64).copy()
    flow = np.zeros(cap.shape, dtype=np.int64)
    while supply.sum() > 0:
        path = _augmenting_path(supply, demand, cap, flow)
        if path is None:
            return None
        start, end = path[-1][0], path[0][1]
        push = min(supply[start], demand[end],
                   *[cap[i, j] - flow[i, j] if d > 0 else flow[i, j] for i, j, d in path])
        for i, j, d in path:
            flow[i, j] += d * push
        supply[start] -= push
        demand[end] -= push
    return flow


def round_transport(x: np.ndarray, row_totals: np.ndarray, col_totals: np.ndarray, *,
                    rng: np.random.Generator | None = None) -> np.ndarray:
    """Controlled rounding of a nonnegative matrix whose row and column sums are (up to the
    projection's tolerance) the integers ``row_totals`` and ``col_totals``: int64, every row and
    column sum exact, every entry its floor or its ceiling (a maximum flow picks the entries to
    round up; should the tolerance make that impossible, the remaining units go where a flow
    over all entries puts them). The flow searches rows and columns in index order, or in a
    random order with ``rng`` (see :func:`round_to_total` on why)."""
    if rng is not None:
        rp, cp = rng.permutation(len(row_totals)), rng.permutation(len(col_totals))
        out = np.empty(np.shape(x), dtype=np.int64)
        out[np.ix_(rp, cp)] = round_transport(np.asarray(x)[np.ix_(rp, cp)], np.asarray(row_totals)[rp],
                                              np.asarray(col_totals)[cp])
        return out
    x = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
    base, frac = integer_split(x)
    supply = np.asarray(row_totals, dtype=np.int64) - base.sum(axis=1)
    demand = np.asarray(col_totals, dtype=np.int64) - base.sum(axis=0)
    if supply.min(initial=0) < 0 or demand.min(initial=0) < 0 or supply.sum() != demand.sum():
        raise ValueError("round_transport needs a matrix whose row and column sums are the integer totals")
    up = _bipartite_flow(supply, demand, (frac > 0).astype(np.int64))
    if up is None:
        up = _bipartite_flow(supply, demand, np.full(x.shape, int(supply.sum()), dtype=np.int64))
    return base + up


# ------------------------------------------------------------------------------ the top-down pass


def _check(hierarchy: Hierarchy, m: Measurements, *, every_level: bool) -> None:
    if len(m.noisy) != len(hierarchy.levels):
        raise ReleaseError(f"the measurements have {len(m.noisy)} levels, the hierarchy {len(hierarchy.levels)}")
    for lv, noisy in enumerate(m.noisy):
        if noisy is None:
            if every_level or lv == len(m.noisy) - 1:
                raise ReleaseError(f"level {hierarchy.levels[lv]!r} was not measured (share 0): this estimate "
                                   "needs it; allowed: a share > 0")
        elif noisy.shape != (hierarchy.n_units(lv), hierarchy.n_cells):
            raise ReleaseError(f"level {hierarchy.levels[lv]!r}: the measurements do not match the hierarchy")
    if not np.array_equal(m.structural_zeros, hierarchy.structural_zeros):
        raise ReleaseError("the measurements' structural zeros are not the hierarchy's")


def _top(m: Measurements, allowed: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The top unit: nonnegative least squares under its invariant total, integer."""
    y = m.noisy[0][0].astype(np.float64)
    out = np.zeros(y.shape, dtype=np.int64)
    if m.totals[0] is None:
        out[allowed] = np.maximum(m.noisy[0][0][allowed], 0)
    else:
        total = int(m.totals[0][0])
        out[allowed] = round_to_total(project_simplex(y[allowed], float(total)), total, rng=rng)
    return out[None, :]


def _children(y: np.ndarray, parents: np.ndarray, parent_est: np.ndarray, allowed: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
    """Every parent's children fitted (sum to the parent cell by cell, >= 0, integer), all
    (parent, cell) simplex projections at once on a (parents, cells, children) padded array."""
    n_par, n_cells = parent_est.shape
    size = np.bincount(parents, minlength=n_par)
    order = np.argsort(parents, kind="stable")
    rank = np.empty(len(parents), dtype=np.int64)
    rank[order] = np.arange(len(parents)) - (np.cumsum(size) - size)[parents[order]]
    padded = np.zeros((n_par, n_cells, int(size.max())))
    padded[parents, :, rank] = y
    mask = np.zeros((n_par, 1, int(size.max())), dtype=bool)
    mask[parents, 0, rank] = True
    mask = mask & allowed[None, :, None]
    total = np.where(allowed[None, :], parent_est, 0)
    fitted = round_to_total(project_simplex(padded, total, mask), total, mask, rng=rng)
    return fitted[parents, :, rank]


def _children_with_totals(y: np.ndarray, parents: np.ndarray, parent_est: np.ndarray, allowed: np.ndarray,
                          totals: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Like :func:`_children` when each child's total is an invariant: one transportation
    projection and one controlled rounding per parent."""
    out = np.zeros(y.shape, dtype=np.int64)
    for p in range(parent_est.shape[0]):
        kids = np.flatnonzero(parents == p)
        if totals[kids].sum() != parent_est[p].sum():
            raise ReleaseError("the invariant totals of a level do not add up to their parent's")
        cols = parent_est[p, allowed]
        x = project_transport(y[np.ix_(kids, allowed)].astype(np.float64), totals[kids], cols)
        out[np.ix_(kids, allowed)] = round_transport(x, totals[kids], cols, rng=rng)
    return out


def topdown(hierarchy: Hierarchy, measurements: Measurements, *,
            rng: np.random.Generator | None = None) -> tuple[np.ndarray, ...]:
    """The TopDown estimates, per level (top first): int64 (units x cells), nonnegative, 0 on the
    structural zeros, every level summing exactly to the level above cell by cell, the invariant
    totals exact. Uses only the measurements, their invariants and the public hierarchy.

    ``rng`` breaks the ties of the integer rounding (default: a generator seeded by the operating
    system). It is independent of the data, so the pass stays post-processing; a seeded ``rng``
    makes the pass deterministic given the measurements."""
    _check(hierarchy, measurements, every_level=True)
    rng = np.random.default_rng() if rng is None else rng
    allowed = ~hierarchy.structural_zeros
    est = [_top(measurements, allowed, rng)]
    for lv in range(1, len(hierarchy.levels)):
        y = measurements.noisy[lv].astype(np.float64)
        totals = measurements.totals[lv]
        if totals is None:
            est.append(_children(y, hierarchy.parents[lv], est[-1], allowed, rng))
        else:
            est.append(_children_with_totals(y, hierarchy.parents[lv], est[-1], allowed, totals, rng))
    return tuple(est)


def bottom_up(hierarchy: Hierarchy, measurements: Measurements) -> tuple[np.ndarray, ...]:
    """Baseline: the noisy tract (last-level) vectors as they are, summed up the tree; no
    clipping, no rounding, no invariant. Consistent, but may be negative."""
    _check(hierarchy, measurements, every_level=False)
    return hierarchy.roll_up(measurements.noisy[-1].copy())


def no_post_processing(hierarchy: Hierarchy, measurements: Measurements) -> tuple[np.ndarray, ...]:
    """Baseline: each level's own noisy vectors as they are (neither consistent nor
    nonnegative)."""
    _check(hierarchy, measurements, every_level=True)
    return tuple(n.copy() for n in measurements.noisy)


# ------------------------------------------------------------------------------ evaluation


def _tail(population: np.ndarray, share: float) -> tuple[np.ndarray, np.ndarray]:
    """(the smallest, the largest) ceil(share * n) units by true population (ties by index)."""
    k = max(1, math.ceil(share * len(population)))
    order = np.argsort(population, kind="stable")
    return order[:k], order[-k:]


def evaluate(geo: Geography, estimates: Sequence[np.ndarray], *, tail: float = 0.1) -> pd.DataFrame:
    """Errors of ``estimates`` (one units x cells array per level) against the exact counts, one
    row per level: units; mae_total and rmse_total (error of each unit's total population);
    mae_cell and rmse_cell (error per unit and cell, structural zeros left out); bias_small and
    bias_large (mean signed error of the total of the ``tail`` share of units with the smallest /
    largest true population, at least one unit) with those units' mean true population
    (pop_small, pop_large)."""
    if not 0 < tail <= 0.5:
        raise ReleaseError(f"tail={tail!r} is not allowed: a share in (0, 0.5]")
    if len(estimates) != len(geo.levels):
        raise ReleaseError(f"estimates has {len(estimates)} levels, the geography {len(geo.levels)}")
    allowed = ~geo.hierarchy.structural_zeros
    rows = []
    for name, truth, est in zip(geo.levels, geo.counts, estimates):
        if np.shape(est) != truth.shape:
            raise ReleaseError(f"level {name!r}: estimates of shape {np.shape(est)}, the counts {truth.shape}")
        err = np.asarray(est, dtype=np.float64) - truth
        tot = err.sum(axis=1)
        cell = err[:, allowed]
        pop = truth.sum(axis=1)
        small, large = _tail(pop, tail)
        rows.append({"level": name, "units": len(pop), "mae_total": float(np.mean(np.abs(tot))),
                     "rmse_total": float(np.sqrt(np.mean(tot**2))), "mae_cell": float(np.mean(np.abs(cell))),
                     "rmse_cell": float(np.sqrt(np.mean(cell**2))), "bias_small": float(tot[small].mean()),
                     "pop_small": float(pop[small].mean()), "bias_large": float(tot[large].mean()),
                     "pop_large": float(pop[large].mean())})
    return pd.DataFrame(rows)
