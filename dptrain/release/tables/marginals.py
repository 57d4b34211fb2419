"""DP marginals over a declared domain, and their post-processing into consistent nonnegative
integer tables.

**Domain.** Each column has a PUBLIC list of levels (a categorical column's declared categories and
its ``<other>`` slot, a numeric column's equal-width bins within its declared bounds, a binary
target's two labels). Every cell of every requested marginal is released, empty or not: a cell
listed only when someone is in it would reveal them.

**Mechanism.** Adding or removing one row changes each marginal's count vector by one in one
cell: L1 and L2 sensitivity 1 per marginal. Marginal k gets

* ``laplace``: the discrete Laplace with scale 1 / epsilon_k (pure epsilon_k-DP); the release is
  (sum epsilon_k)-DP by basic composition, delta 0;
* ``gaussian``: the discrete Gaussian with scale sigma_k, rho_k = 1 / (2 sigma_k^2)-zCDP; the
  release is (sum rho_k)-zCDP, converted to (epsilon, delta) by the RDP accountant.

Both from OpenDP's exact samplers (:mod:`dptrain.privacy.samplers`); the two are the registered
table mechanisms ``gaussian`` and ``laplace`` of :mod:`dptrain.release.oneshot.tables` (their
noise, their shares and their events).

**Budget split** (``cells``, workload-aware). With c_k cells in marginal k, the total squared
error of the raw counts is sum_k c_k Var_k. Minimising it under the budget gives, for the Gaussian
(Var_k = 1 / (2 rho_k), sum rho_k fixed), rho_k proportional to sqrt(c_k); for the Laplace
(Var_k ~ 2 / epsilon_k^2, sum epsilon_k fixed), epsilon_k proportional to c_k^(1/3): finer
marginals get more. ``equal`` gives every marginal the same share.

**Consistency** (post-processing, no privacy cost), for workloads of 1- and 2-way marginals:

1. mutual consistency of the real-valued tables on every attribute set two marginals share, the
   smallest sets first (the empty set, i.e. the total, then single columns): the shared
   sub-marginal is the inverse-variance weighted average of what each marginal implies, and each
   marginal is moved by the difference spread evenly over its cells (Qardaji, Yang and Li's
   PriView step; a weighted least-squares projection onto the consistent tables);
2. the total is rounded to an integer; each column's 1-way marginal is projected onto the
   nonnegative vectors that sum to it (Euclidean projection onto a scaled simplex) and rounded to
   integers that keep the sum (largest remainders);
3. each 2-way table, clipped at zero, is raked (iterative proportional fitting) to those rounded
   1-way margins and rounded to integers that keep every row and column sum (a 0/1 choice of the
   entries to round up, found by a maximum flow: it exists because the fractional parts already
   have integer row and column sums).

The result: nonnegative integers, every table sums to the same total, and every table's 1-way
margins equal the released 1-way marginals, exactly. Higher-way marginals get steps 1 and 2's
total and are rounded on their own (their shared lower-way margins are not made exact).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dptrain.core.errors import DPTrainError
from dptrain.privacy.samplers import discrete_laplace
from dptrain.release.cell_domain import selection_threshold
from dptrain.release.tables.projection import project_simplex as simplex_projection
from dptrain.release.tables.projection import round_to_total
from dptrain.release.zcdp import gaussian_rho

__all__ = ["Column", "Marginal", "consistent_tables", "gaussian_rho", "project_simplex", "round_keeping_sum",
           "round_matrix_keeping_margins", "stability_histogram", "workload"]


@dataclass(frozen=True)
class Column:
    """A column of the declared domain: its name and its PUBLIC levels (labels)."""

    name: str
    levels: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.levels)


@dataclass
class Marginal:
    """One released marginal: its columns (indices into the domain), the cell counts (shape: the
    columns' sizes), and the noise variance of one raw cell (for the weighted consistency)."""

    columns: tuple[int, ...]
    counts: np.ndarray
    variance: float


def workload(n_columns: int, spec: int | Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The marginals to release: every ``spec``-way set of the columns (an int), or the given sets."""
    if isinstance(spec, int):
        if not 1 <= spec <= n_columns:
            raise DPTrainError(f"tabulate.marginals={spec!r} is not allowed: a number in 1..{n_columns} (every "
                               "k-way marginal of the declared columns) or a list of column lists")
        return list(itertools.combinations(range(n_columns), spec))
    sets = [tuple(sorted(set(s))) for s in spec]
    if not sets or any(len(s) == 0 for s in sets) or len(set(sets)) != len(sets):
        raise DPTrainError(f"tabulate.marginals={spec!r} is not allowed: a non-empty list of distinct, non-empty "
                           "column lists")
    return sets


def _project(table: np.ndarray, columns: tuple[int, ...], onto: tuple[int, ...]) -> np.ndarray:
    axes = tuple(i for i, c in enumerate(columns) if c not in onto)
    return table.sum(axis=axes) if axes else table


def _spread(delta: np.ndarray, columns: tuple[int, ...], onto: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """``delta`` (over ``onto``) spread evenly over a table over ``columns`` of ``shape``."""
    expand = tuple(slice(None) if c in onto else np.newaxis for c in columns)
    per = math.prod(s for s, c in zip(shape, columns) if c not in onto)
    return np.broadcast_to(delta[expand] / per, shape)


def mutually_consistent(marginals: list[Marginal]) -> list[np.ndarray]:
    """Step 1 of the module docstring: real-valued tables that agree on every attribute set two of
    them share (the empty set and the shared columns, smallest first)."""
    tables = [m.counts.astype(np.float64) for m in marginals]
    shared: set[tuple[int, ...]] = {()}
    for a, b in itertools.combinations(marginals, 2):
        common = tuple(sorted(set(a.columns) & set(b.columns)))
        shared.update(tuple(s) for r in range(len(common) + 1) for s in itertools.combinations(common, r))
    for onto in sorted(shared, key=len):
        holders = [k for k, m in enumerate(marginals) if set(onto) <= set(m.columns)]
        if len(holders) < 2:
            continue
        parts, weights = [], []
        for k in holders:
            m = marginals[k]
            summed = tables[k].size / max(_project(tables[k], m.columns, onto).size, 1)
            parts.append(_project(tables[k], m.columns, onto))
            weights.append(1.0 / (m.variance * summed))
        avg = sum(w * p for w, p in zip(weights, parts)) / sum(weights)
        for k, part in zip(holders, parts):
            tables[k] = tables[k] + _spread(avg - part, marginals[k].columns, onto, tables[k].shape)
    return tables


def project_simplex(v: np.ndarray, total: float) -> np.ndarray:
    """The Euclidean projection of ``v`` (flattened) onto {x >= 0, sum x = total} (0 for a total
    <= 0): :func:`dptrain.release.tables.projection.project_simplex`."""
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    return np.zeros_like(v) if total <= 0 else simplex_projection(v, float(total))


def round_keeping_sum(x: np.ndarray, total: int) -> np.ndarray:
    """Nonnegative ``x`` summing to ``total`` (up to floating error) as integers summing to
    ``total``: :func:`dptrain.release.tables.projection.round_to_total` (floors, then the largest
    remainders)."""
    x = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
    return round_to_total(x * (float(total) / x.sum()) if x.sum() > 0 else x, int(total))


def rake(table: np.ndarray, rows: np.ndarray, cols: np.ndarray, *, iterations: int = 200) -> np.ndarray:
    """Iterative proportional fitting of a nonnegative matrix to row and column sums (equal
    totals); a tiny floor on every entry lets an all-zero row or column take its sum."""
    x = np.maximum(table, 0.0) + 1e-9
    for _ in range(iterations):
        x *= (rows / np.maximum(x.sum(axis=1), 1e-300))[:, None]
        x *= (cols / np.maximum(x.sum(axis=0), 1e-300))[None, :]
        if np.allclose(x.sum(axis=1), rows, atol=1e-6):
            break
    return x


def round_matrix_keeping_margins(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """A nonnegative integer matrix with row sums ``rows`` and column sums ``cols`` (integers)
    from a nonnegative real ``x`` with those sums: floors, then entries rounded up where a maximum
    flow (source -> row, capacity its deficit; row -> column, capacity 1 where the entry has a
    fractional part; column -> sink, capacity its deficit) sends a unit."""
    from scipy.sparse import csr_matrix  # here, not at the top: the command line starts without scipy
    from scipy.sparse.csgraph import maximum_flow

    base = np.floor(x + 1e-9).astype(np.int64)
    need_r, need_c = rows - base.sum(axis=1), cols - base.sum(axis=0)
    if not need_r.any() and not need_c.any():
        return base
    if (need_r < 0).any() or (need_c < 0).any():  # raking stopped short: no flow can fix an excess
        return _repair(base, rows, cols, x)
    r, c = x.shape
    frac = np.argwhere(x - base > 1e-9)
    n = r + c + 2
    src, sink = n - 2, n - 1
    u = np.concatenate([np.full(r, src), frac[:, 0], r + np.arange(c)])
    v = np.concatenate([np.arange(r), r + frac[:, 1], np.full(c, sink)])
    cap = np.concatenate([np.maximum(need_r, 0), np.ones(len(frac), dtype=np.int64), np.maximum(need_c, 0)])
    graph = csr_matrix((cap.astype(np.int32), (u, v)), shape=(n, n))
    flow = maximum_flow(graph, src, sink).flow.tocoo()
    for a, b, f in zip(flow.row, flow.col, flow.data):
        if f > 0 and a < r and r <= b < r + c:
            base[a, b - r] += 1
    return _repair(base, rows, cols, x)


def _repair(base: np.ndarray, rows: np.ndarray, cols: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Where raking stopped short of the margins (sparse tables converge slowly), the floors and
    the flow can miss them by a few units either way: take units away from the rows and columns
    over their margin (the entries most above ``x``), then add units where a row and a column are
    both short (the entries most below ``x``). Every margin is then met exactly."""
    need_r, need_c = rows - base.sum(axis=1), cols - base.sum(axis=0)
    while (need_r < 0).any() or (need_c < 0).any():
        over = base - x
        if (need_r < 0).any():
            i = int(np.flatnonzero(need_r < 0)[0])
            j = int(np.argmax(np.where(base[i] > 0, over[i], -np.inf)))
        else:
            j = int(np.flatnonzero(need_c < 0)[0])
            i = int(np.argmax(np.where(base[:, j] > 0, over[:, j], -np.inf)))
        base[i, j] -= 1
        need_r[i] += 1
        need_c[j] += 1
    while need_r.sum() > 0:
        ii, jj = np.flatnonzero(need_r > 0), np.flatnonzero(need_c > 0)
        under = (x - base)[np.ix_(ii, jj)]
        a, b = np.unravel_index(int(np.argmax(under)), under.shape)
        base[ii[a], jj[b]] += 1
        need_r[ii[a]] -= 1
        need_c[jj[b]] -= 1
    return base


def consistent_tables(marginals: list[Marginal], sizes: Sequence[int]) -> list[np.ndarray]:
    """Steps 1-3 of the module docstring: nonnegative integer tables that agree exactly on the
    total and (for 1- and 2-way marginals) on every column's 1-way margin."""
    tables = mutually_consistent(marginals)
    total = max(int(round(float(tables[0].sum()))), 0)
    one_way: dict[int, np.ndarray] = {}
    for col in sorted({c for m in marginals for c in m.columns}):
        holder = next(k for k, m in enumerate(marginals) if col in m.columns)
        margin = _project(tables[holder], marginals[holder].columns, (col,))
        one_way[col] = round_keeping_sum(project_simplex(margin, total), total)
    out = []
    for m, table in zip(marginals, tables):
        if len(m.columns) == 1:
            out.append(one_way[m.columns[0]].copy())
        elif len(m.columns) == 2:
            a, b = (one_way[c] for c in m.columns)
            out.append(round_matrix_keeping_margins(rake(table, a.astype(float), b.astype(float)), a, b))
        else:
            flat = round_keeping_sum(project_simplex(table.reshape(-1), total), total)
            out.append(flat.reshape(table.shape))
    return out


def stability_histogram(cell_ids: np.ndarray, *, epsilon: float, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """The stability-based histogram for a domain too large to list: the rows' cell ids (any
    int64 labels), their observed cells' counts plus discrete Laplace noise of scale 1 / epsilon
    (OpenDP's exact sampler), and only the cells whose noisy count reaches the threshold tau listed
    (:func:`dptrain.release.cell_domain.selection_threshold`: a cell with ONE row is listed with
    probability <= delta; an empty cell is never considered). (epsilon, delta)-DP under add/remove.
    Returns (listed cell ids, their noisy counts)."""
    ids, counts = np.unique(np.asarray(cell_ids, dtype=np.int64), return_counts=True)
    noisy = discrete_laplace(counts.astype(np.int64), 1.0 / epsilon) if ids.size else counts.astype(np.int64)
    keep = noisy >= selection_threshold(epsilon, delta)
    return ids[keep], noisy[keep]
