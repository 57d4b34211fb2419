"""MST's estimation step against Private-PGM's (the ``mbi`` package, the reference implementation;
an optional extra, ``pip install -e ".[synthesis-reference]"``, JAX included). On the same noisy
1-way and tree 2-way measurements, our consistent tables (dptrain.release.tables.marginals, the
tree model MST samples from) and mbi's mirror-descent estimate give the same edge marginals."""

from __future__ import annotations

import numpy as np
import pytest

from dptrain.privacy.samplers import discrete_gaussian
from dptrain.release.tables.marginals import Marginal, consistent_tables

mbi = pytest.importorskip("mbi")


def _chain(rng: np.random.Generator, n: int) -> tuple[np.ndarray, list[int]]:
    sizes = [4, 3, 5, 2]
    x = np.zeros((n, 4), dtype=np.int64)
    x[:, 0] = rng.integers(0, 4, n)
    for c in (1, 2, 3):
        keep = rng.random(n) < 0.8
        x[:, c] = np.where(keep, x[:, c - 1] % sizes[c], rng.integers(0, sizes[c], n))
    return x, sizes


def _count(x: np.ndarray, cols: tuple[int, ...], sizes: list[int]) -> np.ndarray:
    shape = [sizes[c] for c in cols]
    return np.bincount(np.ravel_multi_index(x[:, list(cols)].T, shape), minlength=int(np.prod(shape))).reshape(shape)


@pytest.mark.slow  # JAX compiles the estimator: ~20 s
def test_our_tree_tables_match_private_pgm_on_the_same_measurements():
    rng = np.random.default_rng(3)
    x, sizes = _chain(rng, 30_000)
    edges = [(0, 1), (1, 2), (2, 3)]
    sigma1, sigma2 = 30.0, 30.0
    one = {c: discrete_gaussian(_count(x, (c,), sizes), sigma1) for c in range(4)}
    two = {e: discrete_gaussian(_count(x, e, sizes), sigma2) for e in edges}
    ours = consistent_tables([Marginal((c,), one[c], sigma1**2) for c in range(4)]
                             + [Marginal(e, two[e], sigma2**2) for e in edges], sizes)
    names = [f"a{c}" for c in range(4)]
    domain = mbi.Domain(names, sizes)
    measurements = [mbi.LinearMeasurement(one[c].astype(float), (names[c],), stddev=sigma1) for c in range(4)]
    measurements += [mbi.LinearMeasurement(two[e].astype(float).reshape(-1), tuple(names[c] for c in e),
                                           stddev=sigma2) for e in edges]
    model = mbi.estimation.MirrorDescent().estimate(domain, measurements, iters=2000)
    for k, e in enumerate(edges):
        theirs = np.asarray(model.project(tuple(names[c] for c in e)).datavector(flatten=False), dtype=float)
        mine = ours[4 + k].astype(float)
        truth = _count(x, e, sizes).astype(float)
        gap = np.abs(mine / mine.sum() - theirs / theirs.sum()).sum()
        assert gap < 0.02, (e, gap)  # the same fit up to our integer rounding
        for est in (mine, theirs):
            assert np.abs(est / est.sum() - truth / truth.sum()).sum() < 0.05
