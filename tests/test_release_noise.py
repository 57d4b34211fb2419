"""Tests of dptrain.release.noise: grid discrete Laplace / rounded normal, seeding, Mironov leak."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dptrain.release.cells import ReleaseError
from dptrain.release.noise import (
    GRID_BITS,
    add_noise,
    calibrate,
    grid_step,
    laplace_noise,
    make_rng,
)


def _is_integer(a: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(a)) and np.all(a == np.rint(a)))


# ---------------------------------------------------------------- randomness


def test_seeded_rng_is_reproducible_and_says_so():
    r1, d1 = make_rng(7)
    r2, _ = make_rng(7)
    r3, _ = make_rng(8)
    a, b, c = (laplace_noise(1.0, size=1000, rng=r) for r in (r1, r2, r3))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert "REPRODUCIBLE" in d1 and "not for production" in d1
    assert "7" not in d1  # the description never echoes the seed


def test_unseeded_rng_uses_csprng_and_differs():
    (r1, d1), (r2, _) = make_rng(None), make_rng(None)
    assert "CSPRNG" in d1 and "secrets" in d1
    assert not np.array_equal(laplace_noise(1.0, size=100, rng=r1), laplace_noise(1.0, size=100, rng=r2))


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_bad_seed_refused(seed):
    with pytest.raises(ReleaseError, match="seed="):
        make_rng(seed)


# ---------------------------------------------------------------- grid


def test_grid_step_is_power_of_two_just_below_scale():
    s = np.array([1e-9, 3e-5, 0.01, 0.5, 1.0, 1.5, 2.0, 7.3, 1e6])
    g = grid_step(s)
    m, _ = np.frexp(g)
    assert np.all(m == 0.5)  # exact powers of two
    assert np.all((g > s * 2.0 ** -(GRID_BITS + 1)) & (g <= s * 2.0 ** -GRID_BITS))
    assert np.isnan(grid_step(np.array([0.0, np.inf, np.nan, -1.0]))).all()


def test_outputs_lie_exactly_on_the_grid():
    rng, _ = make_rng(1)
    values = rng.uniform(-3, 3, 20_000)
    scale = rng.uniform(1e-4, 5.0, 20_000)
    g = grid_step(scale)
    for kind in ("laplace", "normal"):
        out = add_noise(values, scale, kind=kind, rng=rng)
        assert _is_integer(out / g)
    assert _is_integer(laplace_noise(scale, size=20_000, rng=rng) / g)


def test_calibrate_gives_epsilon_for_every_pair_within_sensitivity():
    """(Delta + gamma) / t = epsilon, and the integer shift |M - M'| of any two values within
    Delta never exceeds (Delta + gamma) / gamma: the discrete Laplace privacy loss is <= epsilon."""
    rng, _ = make_rng(2)
    delta, eps = np.array([0.013, 0.2, 1.0, 3.7]), 0.7
    t, g = calibrate(delta, eps)
    assert np.allclose((delta + g) / t, eps, rtol=1e-15)
    assert np.all(t / (delta / eps) - 1 <= 2.0 ** -GRID_BITS / eps)
    v = rng.uniform(-2, 2, (100_000, 1))
    v2 = v + rng.uniform(-1, 1, (100_000, 1)) * delta
    loss = np.abs(np.rint(v / g) - np.rint(v2 / g)) * g / t
    assert loss.max() <= eps * (1 + 1e-12)
    t0, _ = calibrate(np.array([np.inf, 0.0]), 1.0)
    assert t0[0] == np.inf and t0[1] == 0.0


# ---------------------------------------------------------------- distribution


def test_discrete_laplace_pmf_chi_square():
    """Coarse grid (gamma = scale / 2): frequencies of K = noise / gamma match
    P(K = k) = (1 - q) / (1 + q) q^|k|, q = exp(-gamma / scale)."""
    rng, _ = make_rng(11)
    scale, step, n = 1.0, 0.5, 200_000
    k = laplace_noise(scale, size=n, rng=rng, step=step) / step
    assert _is_integer(k)
    a = step / scale
    edges = np.arange(-8, 9)
    pmf = stats.dlaplace.pmf(edges, a)
    obs = np.array([np.sum(k == e) for e in edges] + [np.sum(np.abs(k) > 8)])
    exp = np.append(pmf, 1 - pmf.sum()) * n
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    q = np.exp(-a)
    assert np.isclose(np.mean(k == 0), (1 - q) / (1 + q), atol=0.005)


def test_fine_grid_matches_continuous_laplace_ks():
    rng, _ = make_rng(12)
    noise = laplace_noise(0.3, size=100_000, rng=rng)
    assert stats.kstest(noise, stats.laplace(scale=0.3).cdf).pvalue > 1e-3


@pytest.mark.parametrize("kind", ["laplace", "normal"])
def test_variance_and_mean_400k_vectorised(kind):
    rng, _ = make_rng(13)
    n = 400_000
    scale = np.where(np.arange(n) % 2 == 0, 0.05, 2.0)
    out = add_noise(np.zeros(n), scale, kind=kind, rng=rng)
    z = out / scale  # standardised: variance 2, mean 0
    assert abs(z.var() / 2 - 1) < 0.02
    assert abs(z.mean()) < 5 * np.sqrt(2 / n)
    for s in (0.05, 2.0):  # per-scale variance too
        assert abs(out[scale == s].var() / (2 * s * s) - 1) < 0.03
    if kind == "normal":
        assert stats.kstest(z[:50_000], stats.norm(scale=np.sqrt(2)).cdf).pvalue > 1e-3


# ---------------------------------------------------------------- the Mironov leak


def test_low_order_bits_do_not_leak_but_naive_float_laplace_does():
    n = 50_000
    x, x2 = 0.3, 0.3 + 1e-12  # differ only in low-order bits
    # grid mechanism: with the same seed the outputs are bit-for-bit identical, hence the output
    # distributions (same function of the same randomness) are identical
    a = add_noise(np.full(n, x), 1.0, kind="laplace", rng=make_rng(5)[0])
    b = add_noise(np.full(n, x2), 1.0, kind="laplace", rng=make_rng(5)[0])
    assert np.array_equal(a, b)
    assert np.array_equal(np.unique(a), np.unique(b))
    # naive floating-point Laplace: the SAME noise draws give different outputs, so the output
    # is a function of the true value's low bits (Mironov 2012)
    lap = np.random.default_rng(5).laplace(0.0, 1.0, n)
    naive_a, naive_b = x + lap, x2 + lap
    assert np.mean(naive_a != naive_b) > 0.9


# ---------------------------------------------------------------- edge cases


def test_nan_values_and_infinite_scale_give_nan():
    rng, _ = make_rng(3)
    out = add_noise(np.array([0.5, np.nan, 0.5, 0.5]), np.array([1.0, 1.0, np.inf, 0.0]), kind="laplace", rng=rng)
    assert np.isfinite(out[0]) and np.isnan(out[1]) and np.isnan(out[2])
    assert out[3] == 0.5  # zero scale: no noise
    assert np.isnan(laplace_noise(np.inf, size=3, rng=rng)).all()


def test_integer_grid_step_one_for_counts():
    rng, _ = make_rng(4)
    n = np.arange(3, 10_003, dtype=float)
    out = add_noise(n, 1.0 / 0.5, kind="laplace", rng=rng, step=1.0)
    assert _is_integer(out)
    q = np.exp(-0.5)  # discrete Laplace with gamma / t = 0.5: variance 2q / (1 - q)^2 (~7.84, not 8)
    assert abs(np.var(out - n) / (2 * q / (1 - q) ** 2) - 1) < 0.05
    with pytest.raises(ReleaseError, match="power of two"):
        add_noise(n, 1.0, kind="laplace", rng=rng, step=0.3)


def test_bad_kind_and_scale_refused():
    rng, _ = make_rng(3)
    with pytest.raises(ReleaseError, match="release.noise"):
        add_noise(np.zeros(3), 1.0, kind="gauss", rng=rng)
    with pytest.raises(ReleaseError, match="release.noise"):
        add_noise(np.zeros(3), -1.0, kind="laplace", rng=rng)
