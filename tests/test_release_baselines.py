"""The release methods of docs/release.md section 5 (dptrain.release.methods): noise scales, epsilon
splits, suppression rules, consistency."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from dptrain.core.errors import DPTrainError
from dptrain.core.neighbours import Neighbours, add_remove_footing, comparison_epsilon
from dptrain.privacy.accounting import calibrate_noise_multiplier, rdp_epsilon
from dptrain.release.cells import Domain, ReleaseError, make_cells, ols, statistic
from dptrain.release.methods import dp_gd, noisy_stats, ss_laplace
from dptrain.release.methods import theil_sen as _theilsen
from dptrain.release.methods.common import check_epsilon
from dptrain.release.methods.dp_gd import DPGDConfig, dp_gradient_descent
from dptrain.release.methods.dp_sgd import DPSGDConfig, SquaredLossLinearEngine, dp_sgd_engine
from dptrain.release.methods.noisy_stats import noisy_stats as noisy_stats_fn
from dptrain.release.methods.ss_laplace import sufficient_stats_laplace
from dptrain.release.methods.suppression import suppression
from dptrain.release.methods.theil_sen import TheilSenConfig, dp_theil_sen

NEIGHBOURS = {n.value for n in Neighbours}

COLUMNS = ["released", "reason", "theta_released", "noise_sd", "ci_low", "ci_high"]


UNIT = Domain()


def _cells(ns, *, seed=0, noise=0.1, domain=UNIT, x=None, y=None):
    rng = np.random.default_rng(seed)
    ns = np.asarray(ns)
    codes = np.repeat(np.arange(ns.size), ns)
    if x is None:
        x = rng.uniform(0, 1, codes.size)
    if y is None:
        y = np.clip(0.2 + 0.5 * x + noise * rng.standard_normal(codes.size), 0, 1)
    lo, wx, wy = np.array([domain.x_lo, domain.y_lo]), domain.x_hi - domain.x_lo, domain.y_hi - domain.y_lo
    return make_cells(lo[0] + wx * np.asarray(x), lo[1] + wy * np.asarray(y), codes,
                      keys=pd.DataFrame({"g": np.arange(ns.size)}), domain=domain)


def _copies(x, y, copies, domain=UNIT):
    """``copies`` identical cells holding the rows (x, y): many independent draws in one call."""
    m = len(x)
    return make_cells(np.tile(x, copies), np.tile(y, copies), np.repeat(np.arange(copies), m),
                      keys=pd.DataFrame({"g": np.arange(copies)}), domain=domain)


def _ols(cells, stat):
    return statistic(ols(cells), stat, cells.domain)


# ------------------------------------------------------------------ epsilon footing
def test_normalise_epsilon_factor_two_both_ways():
    """The comparison convention the runner applies to every method (dptrain.core.neighbours)."""
    assert comparison_epsilon(1.5, "replace_one") == 3.0
    assert add_remove_footing(3.0, "replace_one") == 1.5
    assert comparison_epsilon(0.7, "add_remove") == 0.7 and comparison_epsilon(0.7, "add") == 0.7
    assert add_remove_footing(2.0, "replace_one") == 1.0 and add_remove_footing(2.0, "add_remove") == 2.0
    with pytest.raises(DPTrainError, match="neighbours"):
        Neighbours.parse("swap")
    with pytest.raises(ReleaseError, match="epsilon"):
        check_epsilon(-1.0)


# ------------------------------------------------------------------ suppression
@pytest.mark.parametrize("k", [5, 10, 20])
def test_suppression_rule_exact(k):
    ns = [2, 3, 4, 5, 9, 10, 19, 20, 21, 40]
    c = _cells(ns)
    df, meta = suppression(c, statistic="p25", k=k)
    assert list(df.columns) == COLUMNS and df.index.name == "cell"
    n = np.asarray(ns)
    want = (n >= k) & (n >= 3)
    np.testing.assert_array_equal(df.released.to_numpy(), want)
    np.testing.assert_array_equal(df.theta_released[want], _ols(c, "p25")[want])  # exact, no noise
    assert (df.noise_sd[want] == 0).all() and df.theta_released[~want].isna().all()
    assert set(df.reason[n < k]) == {f"N < k={k}"} and set(df.reason[want]) == {""}
    assert meta["neighbours"] is None and "uncontrolled" in meta["guarantee"]


def test_suppression_rate_outcome_rule():
    # cells of 30: events 4, 5, 25, 26 -> k=5 needs events >= 5 and non-events >= 5
    events = [4, 5, 25, 26]
    y = np.concatenate([np.r_[np.ones(e), np.zeros(30 - e)] for e in events])
    c = _cells([30] * 4, y=y)
    df, _ = suppression(c, statistic="slope", k=5, rate_outcome=True)
    np.testing.assert_array_equal(df.released, [False, True, True, False])
    assert df.reason[0] == "events N p < k=5" and df.reason[3] == "non-events N (1 - p) < k=5"
    with pytest.raises(ReleaseError, match="rate_outcome"):
        suppression(_cells([30, 30]), statistic="p25", k=5, rate_outcome=True)


def test_suppression_ols_undefined_reason():
    c = _cells([10, 10], x=np.r_[np.full(10, 0.3), np.linspace(0, 1, 10)])
    df, _ = suppression(c, statistic="p75", k=5)
    assert df.reason[0].startswith("OLS undefined") and df.released[1]


# ------------------------------------------------------------------ sufficient statistics + Laplace
@pytest.mark.parametrize("domain", [Domain(), Domain(0.0, 2.0, -1.0, 1.0)])
def test_sufficient_stats_noise_scales(domain):
    eps = 2.0
    c = _cells(np.full(20000, 3), domain=domain)
    noisy, scale, sens = ss_laplace._noisy_sums(c, eps, np.random.default_rng(1))
    for key, delta_j in sens.items():
        assert scale[key] == pytest.approx(5 * delta_j / eps, rel=1e-5)
        sd = np.std(noisy[key] - getattr(c, key))
        assert sd == pytest.approx(math.sqrt(2) * 5 * delta_j / eps, rel=0.03), key
    if domain == Domain():
        assert all(scale[k] == pytest.approx(5 / eps, rel=1e-5) for k in scale)  # Laplace(5/eps)


def test_sufficient_stats_delta_method_noise_sd():
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, 400)
    y = np.clip(0.3 + 0.4 * x + 0.1 * rng.standard_normal(400), 0, 1)
    c = _copies(x, y, 3000)
    for stat in ("p25", "slope"):
        df, meta = sufficient_stats_laplace(c, statistic=stat, epsilon=20.0, rng=rng)
        assert df.released.all() and meta["neighbours"] == "add_remove" and meta["delta"] == 0.0
        emp = np.std(df.theta_released)
        assert df.noise_sd.median() == pytest.approx(emp, rel=0.1), stat


def test_sufficient_stats_not_released_reasons():
    df, _ = sufficient_stats_laplace(_cells(np.full(300, 4)), statistic="p25", epsilon=0.5,
                                       rng=np.random.default_rng(3))
    assert set(df.reason) <= {"", "noisy n < 3", "noisy Sxx <= 0"}
    assert (df.reason == "noisy n < 3").any() and (df.reason == "noisy Sxx <= 0").any()
    assert df.theta_released[~df.released].isna().all() and df.noise_sd[~df.released].isna().all()


# ------------------------------------------------------------------ NoisyStats
def test_noisy_stats_sensitivity_bound_replace_one():
    """Replace-one changes of ncov and nvar never exceed 1 - 1/n on [0, 1]^2 (Alabi et al.)."""
    rng = np.random.default_rng(4)
    for n in (2, 3, 10):
        for _ in range(300):
            x, y = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
            x[rng.random(n) < 0.3] = rng.integers(0, 2)  # some corners
            x2, y2 = x.copy(), y.copy()
            x2[0], y2[0] = rng.integers(0, 2), rng.integers(0, 2)
            def cov(a, b):
                return np.sum((a - a.mean()) * (b - b.mean()))

            assert abs(cov(x, y) - cov(x2, y2)) <= 1 - 1 / n + 1e-12
            assert abs(cov(x, x) - cov(x2, x2)) <= 1 - 1 / n + 1e-12


def test_noisy_stats_noise_scales_per_third():
    eps, n = 1.5, 10
    c = _cells(np.full(20000, n), seed=5)
    ncov_n, nvar_n, _, (xbar, ybar) = noisy_stats._noisy_moments(c, eps, np.random.default_rng(5))
    want = math.sqrt(2) * 3 * (1 - 1 / n) / eps  # Laplace(3 Delta / eps), Delta = 1 - 1/n
    nvar = c.sxx - c.n * xbar**2
    assert np.std(ncov_n - (c.sxy - c.n * xbar * ybar)) == pytest.approx(want, rel=0.03)
    assert np.std(nvar_n - nvar) == pytest.approx(want, rel=0.03)
    alpha = np.full(c.n_cells, 0.5)
    beta = noisy_stats._noisy_intercept(alpha, xbar, ybar, c.n, (1.0, 1.0), eps / 3, np.random.default_rng(6))
    want3 = math.sqrt(2) * 3 * (1 + 0.5) / (n * eps)  # Delta3 = (1 + |alpha~|) / n
    assert np.std(beta - (ybar - 0.5 * xbar)) == pytest.approx(want3, rel=0.03)


def test_noisy_stats_reasons_and_meta():
    x = np.r_[0.5, np.full(20 * 50, 0.4)]  # one cell of 1, then 50 cells without spread in x
    c = _cells(np.r_[1, np.full(50, 20)], x=x)
    df, meta = noisy_stats_fn(c, statistic="p25", epsilon=1.0, rng=np.random.default_rng(7))
    assert df.reason[0] == "N < 2"
    assert 5 < (df.reason == "noisy variance <= 0").sum() < 45  # nvar = 0: noisy <= 0 half the time
    assert meta["neighbours"] == "replace_one" and meta["epsilon_add_remove_equivalent"] == 0.5
    _, meta_s = noisy_stats_fn(c, statistic="slope", epsilon=1.0, rng=np.random.default_rng(7))
    assert meta_s["epsilon_spent"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------ DP Theil-Sen
def test_exp_mech_median_concentrates_at_large_epsilon():
    rng = np.random.default_rng(8)
    v = rng.uniform(0, 1, 201)
    s = np.sort(v)
    draws = [_theilsen.exp_mech_median(v, lo=-0.5, hi=1.5, epsilon=50.0, rng=rng) for _ in range(300)]
    inside = (np.array(draws) >= s[100 - 3]) & (np.array(draws) <= s[100 + 3])
    assert inside.mean() > 0.99


def test_exp_mech_median_uniform_at_tiny_epsilon():
    rng = np.random.default_rng(9)
    v = rng.uniform(0.4, 0.6, 50)
    draws = np.array([_theilsen.exp_mech_median(v, lo=-0.5, hi=1.5, epsilon=1e-6, rng=rng) for _ in range(4000)])
    counts, _ = np.histogram(draws, bins=8, range=(-0.5, 1.5))
    assert counts.min() > 400 and counts.max() < 600  # uniform: 500 per bin


def test_wide_median_gives_ties_a_band():
    rng = np.random.default_rng(10)
    v = np.full(41, 0.5)
    plain = np.array([_theilsen.exp_mech_median(v, lo=-0.5, hi=1.5, epsilon=5.0, rng=rng) for _ in range(200)])
    wide = np.array([_theilsen.exp_mech_median(v, lo=-0.5, hi=1.5, epsilon=5.0, rng=rng, width=0.01)
                     for _ in range(200)])
    assert np.all(np.abs(wide - 0.5) <= 0.01 + 1e-12)
    assert np.mean(np.abs(plain - 0.5) > 0.1) > 0.5  # all values tied: the plain median has no band


def test_pair_estimates_and_epsilon_per_variant(monkeypatch):
    x, y = np.array([0.0, 1.0, 1.0]), np.array([0.0, 1.0, 0.5])
    i, j = np.triu_indices(3, 1)
    np.testing.assert_allclose(_theilsen.pair_estimates(x, y, i, j, x0=0.25), [0.25, 0.125])  # (1,2) dropped
    seen = []
    monkeypatch.setattr(_theilsen, "exp_mech_median",
                        lambda v, **kw: seen.append((v.size, kw["epsilon"], kw["width"])) or 0.5)
    c = _cells([10, 7])
    dp_theil_sen(c, statistic="p25", epsilon=3.0, rng=np.random.default_rng(0))
    assert seen == [(45, 3.0 / 9, 0.0), (21, 3.0 / 6, 0.0)]
    seen.clear()
    _, meta = dp_theil_sen(c, statistic="slope", epsilon=3.0, rng=np.random.default_rng(0),
                           config=TheilSenConfig(variant="matchings", k=4, wide=True))
    assert seen == [(20, 0.75, 0.01), (12, 0.75, 0.01)]
    assert meta["value_range"] == (-4.0, 4.0) and meta["neighbours"] == "replace_one"
    with pytest.raises(ReleaseError, match="k"):
        dp_theil_sen(c, statistic="p25", epsilon=1.0, rng=np.random.default_rng(0),
                     config=TheilSenConfig(variant="matchings"))


def test_theil_sen_small_cells_not_released():
    df, _ = dp_theil_sen(_cells([1, 5]), statistic="p25", epsilon=1.0, rng=np.random.default_rng(0))
    assert df.reason[0] == "N < 2: no pairs" and df.released[1] and df.noise_sd.isna().all()


# ------------------------------------------------------------------ DP-GD
def test_dp_gd_gaussian_noise_sd_and_accounting():
    rng = np.random.default_rng(11)
    sums = np.zeros((20000, 2))
    noisy = dp_gd._gaussian_sum(sums, sigma=3.0, clip=0.7, rng=rng)
    assert np.std(noisy) == pytest.approx(3.0 * 0.7, rel=0.02)
    c = _cells([30, 40])
    eps, delta, T = 2.0, 1e-5, 50
    _, meta = dp_gradient_descent(c, statistic="p25", epsilon=eps, delta=delta, rng=rng,
                                  config=DPGDConfig(iterations=T))
    # 0.1 epsilon to the count, 0.15 to the interval's design statistics, 0.75 to the steps
    sigma = calibrate_noise_multiplier(target_epsilon=0.75 * eps, sample_rate=1.0, steps=T, delta=delta)
    assert meta["noise_multiplier"] == sigma and meta["gradient_noise_sd"] == sigma * 1.0
    total = meta["epsilon_count"] + meta["epsilon_interval"] + meta["epsilon_gradient"]
    assert 0.99 * eps <= total <= eps and meta["neighbours"] == "add_remove"


def test_dp_gd_not_released_on_noisy_count():
    df, _ = dp_gradient_descent(_cells(np.full(200, 3)), statistic="slope", epsilon=0.5, delta=1e-5,
                                rng=np.random.default_rng(12), config=DPGDConfig(iterations=5))
    assert (df.reason == "noisy n < 3").any() and set(df.reason) <= {"", "noisy n < 3"}


# ------------------------------------------------------------------ DP-SGD by the engine
def test_squared_loss_engine_clipping_and_noise():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1).double()
    x = torch.linspace(-0.5, 0.5, 9, dtype=torch.float64).reshape(-1, 1)
    y = torch.linspace(0.0, 2.0, 9, dtype=torch.float64)
    eng = SquaredLossLinearEngine(model, max_grad_norm=0.3, noise_multiplier=0.0, expected_batch_size=3.0,
                                    generator=torch.Generator().manual_seed(0))
    eng(x, y)
    ref = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(9):  # reference: autograd per example, flat clipping
        g = torch.autograd.grad(0.5 * (model(x[i:i + 1]).squeeze() - y[i]) ** 2, list(model.parameters()))
        norm = torch.sqrt(sum(t.square().sum() for t in g))
        for r, t in zip(ref, g):
            r += t * min(1.0, 0.3 / (float(norm) + 1e-6))
    for p, r in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, r / 3.0)
    eng = SquaredLossLinearEngine(model, max_grad_norm=0.3, noise_multiplier=2.0, expected_batch_size=4.0,
                                    generator=torch.Generator().manual_seed(1))
    draws = []
    for _ in range(3000):  # empty batches: noise only, N(0, (sigma C)^2) / B
        eng(x[:0], y[:0])
        draws.append(float(model.bias.grad))
    assert np.std(draws) == pytest.approx(2.0 * 0.3 / 4.0, rel=0.05)


def test_dp_sgd_epsilon_matches_target():
    eps, delta, T, q = 1.0, 1e-5, 40, 0.2
    df, meta = dp_sgd_engine(_cells([40, 60]), statistic="p75", epsilon=eps, delta=delta,
                             rng=np.random.default_rng(13), config=DPSGDConfig(steps=T, sample_rate=q))
    assert meta["noise_multiplier"] == calibrate_noise_multiplier(target_epsilon=0.75 * eps, sample_rate=q,
                                                                  steps=T, delta=delta)
    assert meta["epsilon_gradient"] == rdp_epsilon(sample_rate=q, noise_multiplier=meta["noise_multiplier"],
                                                   steps=T, delta=delta)
    assert 0.99 * eps <= meta["epsilon_count"] + meta["epsilon_interval"] + meta["epsilon_gradient"] <= eps
    assert list(df.columns) == COLUMNS


# ------------------------------------------------------------------ consistency at huge epsilon
CLEAN = {"ns": [150, 200, 250], "noise": 0.01}


@pytest.mark.parametrize("stat", ["p25", "slope"])
@pytest.mark.parametrize("method,kwargs,tol", [
    (sufficient_stats_laplace, {}, 1e-4),
    (noisy_stats_fn, {}, 1e-4),
    (dp_theil_sen, {}, 5e-3),
    (dp_theil_sen, {"config": TheilSenConfig(variant="matchings", k=20, wide=True)}, 2e-2),
    (dp_gradient_descent, {"delta": 1e-5, "config": DPGDConfig(iterations=1000)}, 1e-3),
    (dp_sgd_engine, {"delta": 1e-5, "config": DPSGDConfig(steps=400, sample_rate=0.5)}, 2e-3),
])
def test_huge_epsilon_converges_to_ols(method, kwargs, tol, stat):
    c = _cells(CLEAN["ns"], noise=CLEAN["noise"], seed=14)
    df, meta = method(c, statistic=stat, epsilon=1e6, rng=np.random.default_rng(15), **kwargs)
    assert df.released.all()
    scale = 1.0 if stat == "p25" else 4.0  # slope errors are larger
    np.testing.assert_allclose(df.theta_released, _ols(c, stat), atol=tol * scale)
    assert meta["epsilon"] == 1e6 and meta["neighbours"] in NEIGHBOURS


def test_bad_inputs():
    c = _cells([10, 10])
    with pytest.raises(ReleaseError, match="statistic"):
        noisy_stats_fn(c, statistic="p50", epsilon=1.0, rng=np.random.default_rng(0))
    with pytest.raises(ReleaseError, match="epsilon"):
        sufficient_stats_laplace(c, statistic="p25", epsilon=0.0, rng=np.random.default_rng(0))
    with pytest.raises(ReleaseError, match="delta"):
        dp_gradient_descent(c, statistic="p25", epsilon=1.0, delta=1.5, rng=np.random.default_rng(0))
    with pytest.raises(ReleaseError, match="k"):
        suppression(c, statistic="p25", k=0)
