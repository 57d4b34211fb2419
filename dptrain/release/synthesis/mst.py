"""MST (McKenna, Miklau and Sheldon 2021, the 2018 NIST challenge's winner), a select-measure-
generate synthesizer, on the project's table machinery (:mod:`dptrain.release.tables.marginals`).

The budget rho (zCDP) is split in three equal parts:

1. measure: every column's 1-way marginal with the discrete Gaussian (rho / 3 shared evenly);
2. select: a spanning tree of the columns, one edge at a time (Kruskal order: an edge joins two
   components), each edge chosen by the exponential mechanism over the pairs that join two
   components, with utility the L1 distance between the pair's true 2-way counts and the
   independent estimate from the noisy 1-way marginals (sensitivity 1 under add/remove: the
   estimate is public). An epsilon-DP exponential mechanism is (epsilon^2 / 8)-zCDP (Cesar and
   Rogers 2021), so each of the d - 1 selections gets epsilon = sqrt(8 (rho / 3) / (d - 1));
3. measure: the selected d - 1 pairs' 2-way marginals with the discrete Gaussian.

Generate (post-processing): the measurements are made consistent nonnegative integer tables (the
tree's 2-way tables agree with the 1-way ones: :func:`consistent_tables`), which define the
tree-structured distribution P(x) = prod_edges P(x_i, x_j) / prod_nodes P(x_i)^(deg - 1) (the
maximum-entropy model with those marginals, what Private-PGM's estimation finds on a tree).
Rows are drawn from the root down: each column given its parent from the pair's table. The whole
release is (rho)-zCDP; its (epsilon, delta) is the RDP accountant's conversion.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dptrain.privacy.samplers import discrete_gaussian
from dptrain.release.tables.marginals import Marginal, consistent_tables

__all__ = ["MSTResult", "mst"]


@dataclass
class MSTResult:
    """The fitted tree model: its edges (parent, child) from the root, the consistent 1-way and
    edge tables, the noisy total, and what each stage spent (zCDP rho)."""

    sizes: tuple[int, ...]
    root: int
    edges: list[tuple[int, int]]
    one_way: dict[int, np.ndarray]
    pairs: dict[tuple[int, int], np.ndarray]
    total: int
    spent: list[dict] = field(default_factory=list)

    @property
    def total_rho(self) -> float:
        return float(sum(s["rho"] for s in self.spent))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows (n, d) of codes drawn from the tree model (root first, then each child given
        its parent)."""
        d = len(self.sizes)
        out = np.zeros((n, d), dtype=np.int64)
        root_p = _normalise(self.one_way[self.root].astype(np.float64))
        out[:, self.root] = rng.choice(self.sizes[self.root], size=n, p=root_p)
        for parent, child in self.edges:
            table = self.pairs[(parent, child)].astype(np.float64)  # (parent levels, child levels)
            fallback = _normalise(self.one_way[child].astype(np.float64))
            rows = table.sum(axis=1, keepdims=True)
            cond = np.where(rows > 0, table / np.maximum(rows, 1e-300), fallback[None, :])
            cum = np.cumsum(cond, axis=1)
            u = rng.random(n)[:, None]
            out[:, child] = np.minimum((u > cum[out[:, parent]]).sum(axis=1), self.sizes[child] - 1)
        return out


def _normalise(p: np.ndarray) -> np.ndarray:
    s = p.sum()
    return p / s if s > 0 else np.full(p.size, 1.0 / p.size)


def _count(codes: np.ndarray, cols: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    shape = [sizes[c] for c in cols]
    idx = np.ravel_multi_index(codes[:, list(cols)].T, shape)
    return np.bincount(idx, minlength=int(np.prod(shape))).reshape(shape).astype(np.int64)


def _select_tree(codes: np.ndarray, sizes: Sequence[int], noisy_one: dict[int, np.ndarray], epsilon: float,
                 rng: np.random.Generator) -> list[tuple[int, int]]:
    """The d - 1 edges, each by the exponential mechanism among the pairs joining two components."""
    d = len(sizes)
    total = max(float(np.mean([max(v.sum(), 0) for v in noisy_one.values()])), 1.0)
    score = {}
    for i, j in itertools.combinations(range(d), 2):
        pi, pj = _normalise(np.maximum(noisy_one[i], 0).astype(float)), _normalise(np.maximum(noisy_one[j], 0)
                                                                                    .astype(float))
        score[(i, j)] = float(np.abs(_count(codes, (i, j), sizes) - total * np.outer(pi, pj)).sum())
    component = list(range(d))

    def find(a: int) -> int:
        while component[a] != a:
            component[a] = component[component[a]]
            a = component[a]
        return a

    edges = []
    for _ in range(d - 1):
        cand = [e for e in score if find(e[0]) != find(e[1])]
        u = np.array([score[e] for e in cand])
        pick = cand[int(np.argmax(epsilon * u / 2.0 + rng.gumbel(size=u.size)))]
        edges.append(pick)
        component[find(pick[0])] = find(pick[1])
    return edges


def _orient(d: int, edges: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
    """The tree's edges as (parent, child) in breadth-first order from column 0."""
    nbrs: dict[int, list[int]] = {k: [] for k in range(d)}
    for a, b in edges:
        nbrs[a].append(b)
        nbrs[b].append(a)
    order, seen, out = [0], {0}, []
    for node in order:
        for nb in sorted(nbrs[node]):
            if nb not in seen:
                seen.add(nb)
                order.append(nb)
                out.append((node, nb))
    return 0, out


def mst(codes: np.ndarray, sizes: Sequence[int], *, rho: float, rng: np.random.Generator) -> MSTResult:
    """MST on ``codes`` (n, d) over columns of ``sizes`` levels with total zCDP ``rho`` (module
    docstring). ``rng`` draws the exponential mechanism's Gumbel noise (floating point); the
    measurements' noise is OpenDP's exact discrete Gaussian."""
    d = len(sizes)
    if d < 2:
        raise ValueError("MST needs at least two columns")
    part = rho / 3.0
    sigma1 = math.sqrt(d / (2.0 * part))
    noisy_one = {c: discrete_gaussian(_count(codes, (c,), sizes), sigma1) for c in range(d)}
    eps_select = math.sqrt(8.0 * part / (d - 1))
    edges = _select_tree(codes, sizes, noisy_one, eps_select, rng)
    sigma2 = math.sqrt((d - 1) / (2.0 * part))
    noisy_two = {e: discrete_gaussian(_count(codes, e, sizes), sigma2) for e in edges}
    marginals = [Marginal((c,), noisy_one[c], sigma1**2) for c in range(d)]
    marginals += [Marginal(e, noisy_two[e], sigma2**2) for e in edges]
    tables = consistent_tables(marginals, list(sizes))
    one_way = {c: tables[c] for c in range(d)}
    pairs_by_edge = {e: t for e, t in zip(edges, tables[d:])}
    root, oriented = _orient(d, edges)
    pairs = {}
    for parent, child in oriented:
        key = (min(parent, child), max(parent, child))
        table = pairs_by_edge[key]
        pairs[(parent, child)] = table if key == (parent, child) else table.T
    spent = [{"stage": "1-way marginals", "mechanism": "discrete Gaussian", "tables": d, "sigma": sigma1,
              "rho": part},
             {"stage": "tree selection", "mechanism": "exponential mechanism (rho = epsilon^2 / 8 each)",
              "selections": d - 1, "epsilon_each": eps_select, "rho": part},
             {"stage": "2-way marginals of the tree", "mechanism": "discrete Gaussian", "tables": d - 1,
              "sigma": sigma2, "rho": part}]
    return MSTResult(tuple(int(s) for s in sizes), root, oriented, one_way, pairs, int(tables[0].sum()), spent)
