"""dptrain.release.employer.mechanisms and scripts/lodes_attack.py (issue 34): exact privacy-loss
ratios on strong alpha-neighbours, the smooth-sensitivity properties by brute force, the
log-Laplace bias and its correction, the quartic sampler's law, the median's smooth sensitivity,
and the establishment-size attack."""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

from dptrain.core.neighbours import Neighbours
from dptrain.release.employer import mechanisms as mech

REPO = Path(__file__).resolve().parents[1]


def _strong_neighbours(x: float, alpha: float, points: int = 7) -> np.ndarray:
    """Sizes x' with x <= x' <= max((1 + alpha) x, x + 1), endpoints included."""
    return np.linspace(x, max((1.0 + alpha) * x, x + 1.0), points)


def test_er_ee_relation_is_registered():
    assert Neighbours.parse("er_ee") is Neighbours.ER_EE
    assert Neighbours("replace_one") is Neighbours.REPLACE_ONE


# ------------------------------------------------------------------ log-Laplace
@pytest.mark.parametrize("alpha,epsilon", [(0.1, 1.0), (0.05, 0.5), (0.5, 2.0)])
def test_log_laplace_density_ratio_within_e_epsilon(alpha, epsilon):
    gamma = 1.0 / alpha
    y = np.concatenate([np.linspace(-gamma + 1e-6, 50.0, 4000), np.geomspace(50.0, 1e7, 4000)])
    worst = 0.0
    for others in (0.0, 3.0, 250.0):
        for x in (0.0, 0.5, 1.0, gamma / 2, gamma - 0.5, gamma, 3 * gamma, 1000.0):  # x < 1/alpha included
            n = others + x
            for x2 in _strong_neighbours(x, alpha)[1:]:
                p = mech.log_laplace_density(y, n, alpha, epsilon)
                q = mech.log_laplace_density(y, others + x2, alpha, epsilon)
                worst = max(worst, float(np.max(np.abs(np.log(p) - np.log(q)))))
    assert worst <= epsilon * (1 + 1e-9)
    # the bound is attained by the +1 case when the cell is tiny (n = 0, x' = 1: ratio exactly 1 + alpha)
    p = mech.log_laplace_density(y, 0.0, alpha, epsilon)
    q = mech.log_laplace_density(y, 1.0, alpha, epsilon)
    assert np.max(np.abs(np.log(p) - np.log(q))) == pytest.approx(epsilon, rel=1e-6)


def test_log_laplace_density_integrates_to_one_and_matches_draws():
    alpha, epsilon, n = 0.1, 1.0, 40.0
    total = sum(integrate.quad(mech.log_laplace_density, a, b, args=(n, alpha, epsilon), limit=400)[0]
                for a, b in ((-10.0, n), (n, np.inf)))
    assert total == pytest.approx(1.0, abs=1e-6)
    draws = mech.log_laplace(np.full(20000, n), alpha, epsilon, np.random.default_rng(1))
    cdf = lambda t: integrate.quad(mech.log_laplace_density, -10.0, t, args=(n, alpha, epsilon))[0]  # noqa: E731
    for t in (20.0, 40.0, 60.0):
        assert np.mean(draws <= t) == pytest.approx(cdf(t), abs=0.015)


def test_log_laplace_bias_and_its_correction():
    alpha, epsilon = 0.1, 1.0
    b = mech.log_laplace_scale(alpha, epsilon)
    assert b == pytest.approx(math.log(1.1))
    assert mech.log_laplace_bias_factor(alpha, epsilon) == pytest.approx(1.0 / (1.0 - b * b))
    rng = np.random.default_rng(2)
    for n in (0.0, 5.0, 100.0):
        draws = mech.log_laplace(np.full(400_000, n), alpha, epsilon, rng)
        expected = mech.log_laplace_expectation(n, alpha, epsilon)
        assert expected > n  # upward, multiplicative on n + gamma
        se = draws.std() / math.sqrt(draws.size)
        assert abs(draws.mean() - expected) < 4 * se
        fixed = mech.log_laplace_unbiased(draws, alpha, epsilon)
        assert abs(fixed.mean() - n) < 4 * fixed.std() / math.sqrt(fixed.size)
        if n == 100.0:
            assert (draws.mean() - n) / se > 10  # the bias is detectable; the correction removes it
    with pytest.raises(ValueError):
        mech.log_laplace_unbiased([1.0], 2.0, 1.0)  # b = ln 3 > 1: no finite mean


def test_intervals_cover_at_95_percent():
    rng = np.random.default_rng(3)
    n = np.full(20000, 37.0)
    lo, hi = mech.log_laplace_interval(mech.log_laplace(n, 0.1, 1.0, rng), 0.1, 1.0)
    assert np.mean((lo <= n) & (n <= hi)) == pytest.approx(0.95, abs=0.008)
    lo, hi = mech.laplace_worker_interval(mech.laplace_worker(n, 1.0, rng), 1.0)
    # integer noise: the least half-width with coverage >= 95% (3 at epsilon 1) covers 97.3%
    assert 0.95 <= np.mean((lo <= n) & (n <= hi)) - 0.004 and np.mean((lo <= n) & (n <= hi)) < 0.985
    lo, hi = mech.employer_laplace_interval(mech.employer_laplace(n, 500.0, 1.0, rng), 500.0, 1.0)
    assert np.mean((lo <= n) & (n <= hi)) == pytest.approx(0.95, abs=0.008)
    s = mech.smooth_sensitivity(np.full(n.size, 30.0), 0.01, mech.smooth_laplace_params(1.0, 1e-6)[0])
    lo, hi = mech.smooth_laplace_interval(mech.smooth_laplace(n, 30.0, 0.01, 1.0, 1e-6, rng), s, 1.0, 1e-6)
    assert np.mean((lo <= n) & (n <= hi)) == pytest.approx(0.95, abs=0.008)
    s = mech.smooth_sensitivity(np.full(n.size, 30.0), 0.05, mech.smooth_gamma_params(1.0)[0])
    lo, hi = mech.smooth_gamma_interval(mech.smooth_gamma(n, 30.0, 0.05, 1.0, rng), s, 1.0)
    assert np.mean((lo <= n) & (n <= hi)) == pytest.approx(0.95, abs=0.008)


# ------------------------------------------------------------------ Laplace baselines
def _laplace_log_ratio(y, a, b, scale):
    return (np.abs(y - b) - np.abs(y - a)) / scale


def test_worker_laplace_protects_a_job_but_not_a_size():
    y = np.linspace(-100, 400, 20001)
    eps = 1.0
    assert np.max(np.abs(_laplace_log_ratio(y, 100.0, 101.0, 1.0 / eps))) <= eps + 1e-12
    # a strong alpha-neighbour 100 -> 110 costs alpha x epsilon = 10
    assert np.max(np.abs(_laplace_log_ratio(y, 100.0, 110.0, 1.0 / eps))) == pytest.approx(10.0)
    draws = mech.laplace_worker(np.full(100_000, 50.0), eps, np.random.default_rng(4))
    assert abs(draws.mean() - 50.0) < 4 * draws.std() / math.sqrt(draws.size)


def test_employer_laplace_protects_a_capped_establishment():
    cap, eps = 200.0, 1.0
    y = np.linspace(-2000, 3000, 20001)
    for x in (0.0, 1.0, 50.0, cap):  # removing an establishment of (clipped) size x <= cap
        assert np.max(np.abs(_laplace_log_ratio(y, 500.0, 500.0 + x, cap / eps))) <= eps + 1e-12
    draws = mech.employer_laplace(np.full(100_000, 50.0), cap, eps, np.random.default_rng(5))
    assert abs(draws.mean() - 50.0) < 4 * draws.std() / math.sqrt(draws.size)


# ------------------------------------------------------------------ smooth sensitivity of a total
def _scan_smooth(x_max, alpha, beta, k_max=3000):
    x, best = float(x_max), 0.0
    for k in range(k_max):
        best = max(best, math.exp(-beta * k) * max(alpha * x, 1.0))
        x = max((1.0 + alpha) * x, x + 1.0)
    return best


def _brute_local(sizes, alpha, grid=9):
    """LS by enumerating strong alpha-neighbours of each establishment (up and down) on a grid."""
    best = 0.0
    for x in sizes:
        ups = _strong_neighbours(x, alpha, grid)
        downs = [z for z in np.linspace(0.0, x, 4 * grid) if x <= max((1 + alpha) * z, z + 1) + 1e-12]
        best = max(best, *(abs(u - x) for u in ups), *(abs(x - d) for d in downs))
    return best


def test_smooth_sensitivity_matches_scan_and_local_sensitivity():
    alpha, beta = 0.1, 0.15
    xs = np.array([0.0, 0.3, 1.0, 5.0, 9.0, 9.5, 9.99, 10.0, 10.5, 12.0, 40.0, 1000.0])
    s = mech.smooth_sensitivity(xs, alpha, beta)
    for x, sx in zip(xs, s):
        assert sx == pytest.approx(_scan_smooth(x, alpha, beta), rel=1e-12)
    for sizes in ([1.0, 2.0], [3.0, 12.0, 7.0], [0.0], [40.0, 40.0], [9.0, 9.5]):
        ls = _brute_local(sizes, alpha)
        assert ls == pytest.approx(float(mech.local_sensitivity(max(sizes), alpha)))
        assert mech.smooth_sensitivity([np.array(sizes)], alpha, beta)[0] >= ls - 1e-12
    with pytest.raises(ValueError, match="infinite"):
        mech.smooth_sensitivity(xs, alpha, math.log1p(alpha))


def test_smooth_sensitivity_is_beta_smooth_on_neighbours():
    alpha, beta = 0.1, 0.12
    rng = np.random.default_rng(6)
    for _ in range(60):
        sizes = list(rng.choice([0.0, 1.0, 3.0, 8.0, 9.7, 10.0, 25.0, 300.0], size=rng.integers(1, 4)))
        s_d = mech.smooth_sensitivity([np.array(sizes)], alpha, beta)[0]
        for e, x in enumerate(sizes):
            for x2 in _strong_neighbours(x, alpha, 5)[1:]:
                other = sizes.copy()
                other[e] = x2
                s_o = mech.smooth_sensitivity([np.array(other)], alpha, beta)[0]
                assert s_d <= math.exp(beta) * s_o * (1 + 1e-12)
                assert s_o <= math.exp(beta) * s_d * (1 + 1e-12)


def _neighbour_pairs(alpha, beta):
    """(n, S(D), n', S(D')) over strong alpha-neighbour cells D -> D' (both directions)."""
    out = []
    for sizes in ([0.0], [1.0], [5.0, 2.0], [9.5, 3.0], [10.0], [30.0, 7.0], [200.0, 5.0]):
        for x2 in _strong_neighbours(sizes[0], alpha, 5)[1:]:
            other = [x2] + sizes[1:]
            s_a, s_b = mech.smooth_sensitivity([np.array(sizes), np.array(other)], alpha, beta)
            out.append((sum(sizes), s_a, sum(other), s_b))
            out.append((sum(other), s_b, sum(sizes), s_a))
    return out


def test_smooth_gamma_density_ratio_within_e_epsilon():
    alpha, epsilon = 0.05, 1.0
    beta, _ = mech.smooth_gamma_params(epsilon)
    worst = 0.0
    for n, s, n2, s2 in _neighbour_pairs(alpha, beta):
        y = n + s * np.concatenate([np.linspace(-200, 200, 40001), np.geomspace(200, 1e8, 2000),
                                    -np.geomspace(200, 1e8, 2000)])
        p = mech.smooth_gamma_density(y, n, s, epsilon)
        q = mech.smooth_gamma_density(y, n2, s2, epsilon)
        worst = max(worst, float(np.max(np.abs(np.log(p) - np.log(q)))))
    assert worst <= 0.88 * epsilon  # the derivation's 3^(3/4)/4 + 3/10 = 0.870


def test_smooth_laplace_hockey_stick_within_delta():
    alpha, epsilon, delta = 0.01, 1.0, 1e-6
    beta, per_s = mech.smooth_laplace_params(epsilon, delta)
    for n, s, n2, s2 in _neighbour_pairs(alpha, beta):
        b1, b2 = per_s * s, per_s * s2
        y = np.linspace(min(n, n2) - 60 * max(b1, b2), max(n, n2) + 60 * max(b1, b2), 400_001)
        p = np.exp(-np.abs(y - n) / b1) / (2 * b1)
        q = np.exp(-np.abs(y - n2) / b2) / (2 * b2)
        excess = np.trapezoid(np.maximum(p - math.exp(epsilon) * q, 0.0), y)
        assert excess <= delta
    draws = mech.smooth_laplace(np.full(100_000, 80.0), 30.0, alpha, epsilon, delta, np.random.default_rng(7))
    assert abs(draws.mean() - 80.0) < 4 * draws.std() / math.sqrt(draws.size)


# ------------------------------------------------------------------ the quartic noise
def test_quartic_law_cdf_and_sampler():
    total, _ = integrate.quad(mech.quartic_pdf, -np.inf, np.inf)
    assert total == pytest.approx(1.0, abs=1e-10)
    for z in (-7.0, -1.0, -0.3, 0.0, 0.8, 2.5, 30.0):
        assert mech.quartic_cdf(z) == pytest.approx(integrate.quad(mech.quartic_pdf, -np.inf, z)[0], abs=1e-9)
    var, _ = integrate.quad(lambda z: z * z * mech.quartic_pdf(z), -np.inf, np.inf)
    assert var == pytest.approx(1.0, abs=1e-8)
    q = mech.quartic_quantile(0.975)
    assert mech.quartic_cdf(q) == pytest.approx(0.975, abs=1e-12)
    draws = mech.quartic_sample(50_000, np.random.default_rng(8))
    assert stats.kstest(draws, mech.quartic_cdf).pvalue > 0.001
    assert abs(draws.mean()) < 4 / math.sqrt(draws.size)
    sg = mech.smooth_gamma(np.full(50_000, 10.0), 20.0, 0.05, 1.0, np.random.default_rng(9))
    assert abs(sg.mean() - 10.0) < 4 * sg.std() / math.sqrt(sg.size)


# ------------------------------------------------------------------ the NRS median
def _median(v):
    v = sorted(v)
    return v[(len(v) + 1) // 2 - 1]


def _brute_median_smooth(data, domain, beta):
    n = len(data)
    base = np.bincount(data, minlength=len(domain))
    best = 0.0
    for other in itertools.combinations_with_replacement(domain, n):
        dist = n - int(np.minimum(base, np.bincount(other, minlength=len(domain))).sum())
        med = _median(other)
        ls = max(abs(_median(list(other[:i]) + [v] + list(other[i + 1:])) - med) for i in range(n) for v in domain)
        best = max(best, math.exp(-beta * dist) * ls)
    return best


@pytest.mark.parametrize("data", [[0, 1, 1, 3, 5], [2, 2, 2, 2], [0, 5, 5, 1], [4], [1, 3, 3, 3, 4, 5]])
def test_median_smooth_sensitivity_against_brute_force(data):
    domain = list(range(6))
    for beta in (0.1, 0.7):
        exact = mech.median_smooth_sensitivity(data, 0, 5, beta)
        assert exact == pytest.approx(_brute_median_smooth(data, domain, beta), abs=1e-12)
    released = mech.smooth_median(data, 0, 5, 1.0, np.random.default_rng(10))
    assert np.isfinite(released)


def test_median_clips_to_the_public_range():
    clipped = mech.median_smooth_sensitivity([0, 2, 5], 0, 5, 0.5)
    assert mech.median_smooth_sensitivity([-100, 2, 999], 0, 5, 0.5) == clipped
    draws = [mech.smooth_median([1, 2, 3, 4, 50], 0, 10, 4.0, np.random.default_rng(s)) for s in range(400)]
    assert abs(np.median(draws) - 3.0) < 1.0


# ------------------------------------------------------------------ the attack
def _attack_module():
    spec = importlib.util.spec_from_file_location("lodes_attack_under_test", REPO / "scripts" / "lodes_attack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lodes_attack_worker_level_fails_er_ee_holds():
    attack = _attack_module()
    r = attack.attack(draws=2000, seed=0, alpha=0.1, epsilon=1.0)
    assert r["worker_mae"] < 3.0
    assert r["worker_power_mc"] > 0.99 and r["worker_power"] > 0.99
    assert r["erree_log_ratio"] <= 1.0
    bound = 0.05 * math.e
    assert r["erree_power"] <= bound and r["erree_power_alone"] <= bound
    assert r["erree_power_mc"] <= bound + 3 * math.sqrt(bound * (1 - bound) / 2000)
    big = attack.attack(draws=200_000, seed=1)
    assert big["erree_power_mc"] == pytest.approx(big["erree_power"], abs=0.005)
    assert attack.main(["--draws", "500"]) == 0


# ------------------------------------------------------------------ the smooth mechanisms' public grid
def test_smooth_outputs_lie_on_a_public_grid_whatever_the_count():
    """Mironov's attack reads the count from the low-order bits of fl(n + noise): with continuous
    noise added in floating point, the set of doubles the output takes depends on n. Here every
    output is an exact multiple of a step fixed by epsilon (and delta) alone, for any n and any x_max."""
    rng = np.random.default_rng(11)
    gamma_step = mech.smooth_grid_step(1.0 / mech.smooth_gamma_params(2.0)[1])
    laplace_step = mech.smooth_grid_step(mech.smooth_laplace_params(2.0, 1e-6)[1])
    assert gamma_step == 2.0 ** -19 and laplace_step == 2.0 ** -20  # 1 / a = 2, 2 / epsilon = 1
    for n in (0.0, 7.0, 1_000_003.0):
        for x_max in (1.0, 40.0, 5000.0):
            for out, step in ((mech.smooth_gamma(np.full(500, n), x_max, 0.05, 2.0, rng), gamma_step),
                              (mech.smooth_laplace(np.full(500, n), x_max, 0.01, 2.0, 1e-6, rng), laplace_step)):
                units = out / step
                assert np.array_equal(units, np.rint(units)) and np.unique(out).size > 450
    with pytest.raises(ValueError, match="integer counts"):
        mech.smooth_gamma([3.5], 4.0, 0.05, 2.0, rng)


def test_the_float_sum_would_leak_and_the_grid_does_not():
    """The leak the grid removes, reproduced: with continuous noise w, fl(1 + w) near 0 is always a
    multiple of 2^-53 (the exact sum's last bit), while fl(0 + w) = w near 0 almost never is, so an
    output near 0 tells n = 0 from n = 1 whatever the noise scale. On the grid both counts give
    multiples of one public step, and the test that separated them no longer does."""
    rng = np.random.default_rng(12)
    w = rng.laplace(0.0, 1.0, 40_000)

    def coarse_share(y):
        y = y[np.abs(y) < 0.25]
        return np.mean(y * 2.0 ** 53 == np.rint(y * 2.0 ** 53))

    assert coarse_share(1.0 + w) == 1.0 and coarse_share(0.0 + w) < 0.5
    step = mech.smooth_grid_step(mech.smooth_laplace_params(1.0, 1e-6)[1])
    for n in (0.0, 1.0):
        out = mech.smooth_laplace(np.full(40_000, n), 10.0, 0.01, 1.0, 1e-6, rng)
        assert coarse_share(out) == 1.0 and np.array_equal(out / step, np.rint(out / step))


def test_smooth_noise_law_unchanged_by_the_grid():
    rng = np.random.default_rng(13)
    _, a = mech.smooth_gamma_params(1.0)
    s = float(mech.smooth_sensitivity(np.array([40.0]), 0.05, mech.smooth_gamma_params(1.0)[0])[0])
    z = (mech.smooth_gamma(np.full(40_000, 100.0), 40.0, 0.05, 1.0, rng) - 100.0) * a / s
    assert stats.kstest(z, mech.quartic_cdf).pvalue > 1e-3
    _, per_s = mech.smooth_laplace_params(1.0, 1e-6)
    s = float(mech.smooth_sensitivity(np.array([40.0]), 0.01, mech.smooth_laplace_params(1.0, 1e-6)[0])[0])
    z = (mech.smooth_laplace(np.full(40_000, 100.0), 40.0, 0.01, 1.0, 1e-6, rng) - 100.0) / (per_s * s)
    assert stats.kstest(z, stats.laplace.cdf).pvalue > 1e-3


def test_smooth_median_on_its_grid():
    rng = np.random.default_rng(14)
    step = mech.smooth_grid_step((37.3 - 0.1) / mech.smooth_gamma_params(1.0)[1])
    for _ in range(50):
        out = mech.smooth_median(rng.uniform(0, 40, 31), 0.1, 37.3, 1.0, rng)
        assert out / step == round(out / step)
    with pytest.raises(ValueError, match="bounds"):
        mech.smooth_median([1.0], 2.0, 2.0, 1.0, rng)


def test_smooth_intervals_from_public_quantities_cover():
    """The task's intervals use the release and public quantities only (S at min(m, the public largest
    size) for each candidate count m): they cover at least 95% on the simulator's cells, and exactly
    95% (up to the grid) for a cell that is one establishment, where S(min(n, M)) is S itself."""
    from dptrain.data.jobs import simulate_jobs
    from dptrain.release.employer.intervals import smooth_gamma_interval_public, smooth_laplace_interval_public

    cells = simulate_jobs(5, establishments=4000).cell_totals(("place", "sector"))
    n, x_max = (cells[c].to_numpy(float) for c in ("n", "x_max"))
    rng = np.random.default_rng(15)
    reps = 40
    for draw, interval in (
            (lambda: mech.smooth_gamma(n, x_max, 0.1, 4.0, rng), lambda y: smooth_gamma_interval_public(y, 0.1, 4.0,
                                                                                                         30_000)),
            (lambda: mech.smooth_laplace(n, x_max, 0.1, 4.0, 1e-6, rng),
             lambda y: smooth_laplace_interval_public(y, 0.1, 4.0, 1e-6, 30_000))):
        covered = np.mean([np.mean((lambda lo_hi: (lo_hi[0] <= n) & (n <= lo_hi[1]))(interval(draw())))
                           for _ in range(reps)])
        assert 0.95 <= covered < 1.0
    # one establishment of 500 in its cell: the bound at the true count is S itself, 95% exactly
    total, rng = np.full(40_000, 500.0), np.random.default_rng(16)
    lo, hi = smooth_gamma_interval_public(mech.smooth_gamma(total, 500.0, 0.1, 4.0, rng), 0.1, 4.0, 30_000)
    assert np.mean((lo <= total) & (total <= hi)) == pytest.approx(0.95, abs=0.006)
    lo, hi = smooth_laplace_interval_public(mech.smooth_laplace(total, 500.0, 0.1, 4.0, 1e-6, rng), 0.1, 4.0, 1e-6,
                                            30_000)
    assert np.mean((lo <= total) & (total <= hi)) == pytest.approx(0.95, abs=0.006)
