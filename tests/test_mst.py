"""MST (dptrain.release.synthesis.mst): its privacy spend, the tree it selects on data with a
chain of strong dependences, and that its samples reproduce the measured marginals."""

from __future__ import annotations

import numpy as np
import pytest

from dptrain.release.synthesis.mst import mst


def _chain(rng: np.random.Generator, n: int) -> tuple[np.ndarray, list[int]]:
    """Columns 0 -> 1 -> 2 -> 3 each a noisy copy of the previous; column 4 independent."""
    sizes = [4, 4, 4, 4, 3]
    x = np.zeros((n, 5), dtype=np.int64)
    x[:, 0] = rng.integers(0, 4, n)
    for c in (1, 2, 3):
        keep = rng.random(n) < 0.85
        x[:, c] = np.where(keep, x[:, c - 1], rng.integers(0, 4, n))
    x[:, 4] = rng.integers(0, 3, n)
    return x, sizes


def test_mst_spends_its_rho_in_three_parts_and_finds_the_chain():
    rng = np.random.default_rng(0)
    codes, sizes = _chain(rng, 20_000)
    fit = mst(codes, sizes, rho=1.0, rng=rng)
    assert fit.total_rho == pytest.approx(1.0) and [s["rho"] for s in fit.spent] == pytest.approx([1 / 3] * 3)
    edges = {tuple(sorted(e)) for e in fit.edges}
    assert {(0, 1), (1, 2), (2, 3)} <= edges and len(edges) == 4
    assert abs(fit.total - 20_000) < 100


def test_mst_samples_reproduce_the_two_way_marginals_of_the_tree():
    rng = np.random.default_rng(1)
    codes, sizes = _chain(rng, 20_000)
    fit = mst(codes, sizes, rho=2.0, rng=rng)
    synth = fit.sample(fit.total, np.random.default_rng(2))
    assert synth.shape == (fit.total, 5) and synth.min() >= 0 and np.all(synth.max(axis=0) < np.array(sizes))
    for a, b in ((0, 1), (1, 2), (0, 2)):  # (0, 2) is not an edge: the chain carries it
        true = np.histogram2d(codes[:, a], codes[:, b], bins=[range(sizes[a] + 1), range(sizes[b] + 1)])[0]
        fake = np.histogram2d(synth[:, a], synth[:, b], bins=[range(sizes[a] + 1), range(sizes[b] + 1)])[0]
        assert np.abs(true / true.sum() - fake / fake.sum()).sum() < 0.06, (a, b)
