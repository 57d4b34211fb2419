"""DP-MOS (docs/dp_mos.md): the stability bounds against brute force, the sensitivity of every
released quantity, the composition of the split, the end-to-end run, and a likelihood-ratio test
of the privacy claim on a small example (with MOS as the mutation it must catch)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from dptrain.release.cells import Domain, ReleaseError, make_cells, ols, statistic
from dptrain.release.dp_mos import (
    DEFAULT_SPLIT,
    DPMOSConfig,
    _se_stats,
    chi_candidates,
    exp_mech_quantile,
    release_dp_mos,
    stage_epsilons,
)
from dptrain.release.dp_mos import (
    test_threshold as pass_threshold,
)
from dptrain.release.mos import release_mos
from dptrain.release.noise import add_noise
from dptrain.release.sensitivity import local_sensitivity
from dptrain.release.stability import distance_to_instability, stability_bounds, window_min_sxx

UNIT = Domain()
WIDE = Domain(x_lo=-2.0, x_hi=3.0, y_lo=10.0, y_hi=12.0)
STATS = ("p25", "p75", "slope")


def cells_of(groups, domain=UNIT):
    x = np.concatenate([np.asarray(g[0], float) for g in groups])
    y = np.concatenate([np.asarray(g[1], float) for g in groups])
    codes = np.repeat(np.arange(len(groups)), [len(g[0]) for g in groups])
    return make_cells(x, y, codes, keys=pd.DataFrame({"g": np.arange(len(groups))}), domain=domain)


def random_cell(rng, n, domain=UNIT, *, spread=None):
    wx, wy = domain.x_hi - domain.x_lo, domain.y_hi - domain.y_lo
    s = rng.uniform(0.2, 1.0) if spread is None else spread
    lo = rng.uniform(0, 1 - s)
    x = domain.x_lo + wx * rng.uniform(lo, lo + s, n)
    y = domain.y_lo + wy * np.clip(0.3 + 0.3 * (x - domain.x_lo) / wx + 0.2 * rng.standard_normal(n), 0, 1)
    return x, y


def theta_of(x, y, stat, domain):
    return float(statistic(ols(cells_of([(x, y)], domain)), stat, domain)[0])


def brute_ls(x, y, stat, domain, grid=41):
    """max |theta(D') - theta(D)| over every removal and a grid of additions (y at its ends)."""
    t0 = theta_of(x, y, stat, domain)
    out = 0.0
    for i in range(len(x)):
        out = max(out, abs(theta_of(np.delete(x, i), np.delete(y, i), stat, domain) - t0))
    for xs in np.linspace(domain.x_lo, domain.x_hi, grid):
        for ys in (domain.y_lo, domain.y_hi):
            out = max(out, abs(theta_of(np.append(x, xs), np.append(y, ys), stat, domain) - t0))
    return out


def neighbours(x, y, rng, domain, extra=6):
    """Every removal and some additions (the box corners and random points)."""
    for i in range(len(x)):
        yield np.delete(x, i), np.delete(y, i)
    corners = [(domain.x_lo, domain.y_lo), (domain.x_hi, domain.y_hi), (domain.x_lo, domain.y_hi),
               (domain.x_hi, domain.y_lo)]
    pts = corners + [(rng.uniform(domain.x_lo, domain.x_hi), rng.uniform(domain.y_lo, domain.y_hi))
                     for _ in range(extra)]
    for px, py in pts:
        yield np.append(x, px), np.append(y, py)


# ---------------------------------------------------------------- the stability bounds
def test_window_min_sxx_is_the_minimum_over_every_subset():
    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(4, 10))
        x = rng.uniform(0, 1, n) if trial % 3 else np.round(rng.uniform(0, 1, n), 1)  # ties too
        got = window_min_sxx(x, 3)
        for k in range(min(3, n - 2) + 1):
            brute = min(np.var(x[list(c)]) * (n - k) for c in itertools.combinations(range(n), n - k))
            assert got[k] <= brute + 1e-12
            assert got[k] >= brute - 1e-8 * (np.var(x) * n + 1.0)  # the bound's own rounding slack


@pytest.mark.parametrize("domain", [UNIT, WIDE], ids=["unit", "wide"])
@pytest.mark.parametrize("stat", STATS)
def test_a0_bounds_the_local_sensitivity(stat, domain):
    rng = np.random.default_rng(1)
    groups = [random_cell(rng, int(n), domain) for n in rng.integers(5, 60, 40)]
    groups.append(random_cell(rng, 30, domain, spread=0.05))  # concentrated x: a large LS
    xo, yo = random_cell(rng, 20, domain, spread=0.02)  # ... and one high-leverage row: removing it
    groups.append((np.append(xo, domain.x_hi), np.append(yo, domain.y_lo)))  # leaves almost no spread
    cells = cells_of(groups, domain)
    a = stability_bounds(cells, statistic=stat, k_max=2)
    exact = local_sensitivity(cells, statistic=stat, neighbors="add_remove").ls
    ok = np.isfinite(exact)
    assert ok.sum() >= 35
    assert np.all(a[ok, 0] >= exact[ok] * (1 - 1e-9))
    assert np.median(a[ok, 0] / exact[ok]) < 4.0  # a bound, but not a useless one
    for g in range(6):  # and against brute-force refits, independently of the closed forms
        assert a[g, 0] >= brute_ls(*groups[g], stat, domain) * (1 - 1e-9)


@pytest.mark.parametrize("stat", STATS)
def test_a1_bounds_every_neighbours_local_sensitivity(stat):
    rng = np.random.default_rng(2)
    for _ in range(8):
        x, y = random_cell(rng, int(rng.integers(8, 25)))
        a = stability_bounds(cells_of([(x, y)]), statistic=stat, k_max=2)[0]
        for xn, yn in neighbours(x, y, rng, UNIT, extra=3):
            ls = local_sensitivity(cells_of([(xn, yn)]), statistic=stat).ls[0]
            assert a[1] >= ls * (1 - 1e-9)


@pytest.mark.parametrize("domain", [UNIT, WIDE], ids=["unit", "wide"])
@pytest.mark.parametrize("stat", STATS)
def test_bounds_dominate_a_neighbours_at_one_step_less(stat, domain):
    """(b) A_k(D) >= A_{k-1}(D'): what makes the distance to instability change by at most 1."""
    rng = np.random.default_rng(3)
    k_max = 12
    for trial in range(12):
        x, y = random_cell(rng, int(rng.integers(6, 40)), domain, spread=0.1 if trial % 4 == 0 else None)
        a = stability_bounds(cells_of([(x, y)], domain), statistic=stat, k_max=k_max)[0]
        for xn, yn in neighbours(x, y, rng, domain):
            an = stability_bounds(cells_of([(xn, yn)], domain), statistic=stat, k_max=k_max)[0]
            assert np.all(a[1:] >= an[:-1] * (1 - 1e-9)), (trial, a, an)
            for delta in np.quantile(a[np.isfinite(a)], [0.1, 0.5, 0.9]) if np.isfinite(a).any() else []:
                d = distance_to_instability(a[None, :], np.array([delta]))[0]
                dn = distance_to_instability(an[None, :], np.array([delta]))[0]
                assert abs(int(d) - int(dn)) <= 1


def test_bounds_are_infinite_where_ols_breaks():
    cells = cells_of([([0.1, 0.2, 0.3], [0.1, 0.5, 0.2]), ([0.5] * 10, list(np.linspace(0, 1, 10)))])
    a = stability_bounds(cells, statistic="p25", k_max=3)
    assert np.isinf(a).all()  # N = 3 (a removal leaves 2 rows); no spread in x


# ---------------------------------------------------------------- the other released quantities
def test_se_statistics_sensitivities_brute_force():
    """sum(x - x_lo), Sxx and Syy move by at most wx, wx^2, wy^2 between neighbours."""
    rng = np.random.default_rng(4)
    wx, wy = WIDE.x_hi - WIDE.x_lo, WIDE.y_hi - WIDE.y_lo

    def stats(x, y):
        c = cells_of([(x, y)], WIDE)
        n = c.n[0]
        return np.array([c.sx[0] - WIDE.x_lo * n, c.sxx[0] - c.sx[0] ** 2 / n, c.syy[0] - c.sy[0] ** 2 / n])

    worst = np.zeros(3)
    for _ in range(15):
        x, y = random_cell(rng, int(rng.integers(3, 30)), WIDE)
        s0 = stats(x, y)
        for xn, yn in neighbours(x, y, rng, WIDE, extra=10):
            worst = np.maximum(worst, np.abs(stats(xn, yn) - s0))
    bound = np.array([wx, wx * wx, wy * wy])
    assert np.all(worst <= bound * (1 + 1e-12))
    assert np.all(worst >= 0.2 * bound)  # the bound is attained in order of magnitude


def test_se_statistics_noise_scales():
    cells = cells_of([random_cell(np.random.default_rng(5), 50, WIDE)], WIDE)
    s = _se_stats(cells, 0.6, np.random.default_rng(0))
    wx, wy = 5.0, 2.0
    for key, sens in (("sx", wx), ("sxx", wx * wx), ("syy", wy * wy)):
        assert s[key + "_scale"] == pytest.approx(sens / 0.2, rel=2.0**-20 / 0.2)  # the grid inflation
        assert s[key + "_scale"] >= sens / 0.2


def test_chi_mechanism_rank_utility_has_sensitivity_one():
    rng = np.random.default_rng(6)
    cand = chi_candidates(cells_of([random_cell(rng, 10)]), "p25")
    v = rng.lognormal(2, 1, 50)
    for _ in range(20):
        w = v.copy()
        w[rng.integers(50)] = rng.choice([0.0, np.inf, rng.lognormal(2, 3)])
        c1 = np.searchsorted(np.sort(v), cand, side="right")
        c2 = np.searchsorted(np.sort(w), cand, side="right")
        assert np.max(np.abs(c1 - c2)) <= 1
    # concentrates at the quantile when epsilon is large, and stays on the public grid
    draws = [exp_mech_quantile(v, cand, q=0.75, epsilon=200.0, rng=rng) for _ in range(20)]
    assert set(draws) <= set(cand)
    target = np.quantile(v, 0.75)
    assert all(target / 1.2 <= d <= target * 1.2 for d in draws)


def test_test_threshold_tail_is_at_most_delta():
    for eps, delta in ((0.5, 1e-6), (1.0, 1e-6), (4.0, 1e-9), (8.0, 1e-3)):
        t = pass_threshold(eps, delta)
        q = math.exp(-eps)
        assert q ** t / (1 + q) <= delta < q ** (t - 1) / (1 + q) or t == 1
    # and the sampler's tail matches P(K >= m) = q^m / (1 + q)
    k = add_noise(np.zeros(400_000), 1.0, kind="laplace", rng=np.random.default_rng(7), step=1.0)
    for m in (1, 2, 4):
        assert np.mean(k >= m) == pytest.approx(math.exp(-m) / (1 + math.exp(-1)), rel=0.05)


def test_split_composition_and_refusals():
    eps = stage_epsilons(2.0, DEFAULT_SPLIT)
    assert sum(eps.values()) == pytest.approx(6.0)  # 3 epsilon by default, as MOS
    with pytest.raises(ReleaseError, match="release.dp_mos_split"):
        stage_epsilons(1.0, {"n": 1.0, "theta": 1.0})
    with pytest.raises(ReleaseError, match=r"release.dp_mos_split.test=0"):
        stage_epsilons(1.0, {**DEFAULT_SPLIT, "test": 0})


# ---------------------------------------------------------------- the release
def study_cells(seed=0, sizes=(60, 120, 250, 500), copies=25):
    rng = np.random.default_rng(seed)
    ns = np.repeat(sizes, copies)
    return cells_of([random_cell(rng, int(n)) for n in ns]), ns


def test_release_columns_reasons_and_coverage():
    cells, ns = study_cells()
    truth_fit = None
    rel = release_dp_mos(cells, statistic="p25", epsilon=8.0, delta=1e-6, rng=np.random.default_rng(1))
    f = rel.frame
    assert list(f.columns) == ["released", "reason", "theta_released", "se_released", "n_released", "noise_sd",
                               "ci_low", "ci_high", "chi"]
    assert set(f["reason"]) <= {"", "noisy N below the eligibility threshold",
                                "failed the private stability test (above chi or unstable)"}
    assert f["released"].mean() > 0.6 and f.loc[ns >= 250, "released"].mean() > 0.7  # chi: the 75% point
    assert np.isfinite(f["n_released"]).all()  # N~ is released for every listed cell
    theta = statistic(ols(cells), "p25", cells.domain)
    r = f["released"].to_numpy()
    scale = f["noise_sd"].to_numpy() / math.sqrt(2)
    np.testing.assert_allclose(scale[r], rel.chi / f["n_released"].to_numpy()[r] / 8.0, rtol=2e-6)
    assert truth_fit is None and np.all(np.abs(f["theta_released"][r] - theta[r]) < 40 * scale[r])
    assert rel.epsilon["total"] == pytest.approx(24.0) and rel.delta == 1e-6


def test_interval_covers_the_true_line_at_its_nominal_rate():
    """Cells with a known population line (y = 0.3 + 0.3 x + 0.15 Z, no clipping in practice): the
    released 95% intervals hold the true p25 in 93-97% of the cells that have one."""
    rng = np.random.default_rng(3)
    ns = np.repeat([300, 600, 1200], 80)
    groups = []
    for n in ns:
        lo = rng.uniform(0, 0.4)
        x = rng.uniform(lo, lo + 0.6, n)
        groups.append((x, 0.3 + 0.3 * x + 0.15 * rng.standard_normal(n)))
    cells = cells_of(groups)
    truth = 0.3 + 0.3 * 0.25
    hits, total = 0, 0
    for seed in range(4):
        f = release_dp_mos(cells, statistic="p25", epsilon=4.0, delta=1e-6, rng=np.random.default_rng(seed)).frame
        lo, hi = f["ci_low"].to_numpy(), f["ci_high"].to_numpy()
        ok = np.isfinite(lo)
        hits += int(np.sum((lo[ok] <= truth) & (truth <= hi[ok])))
        total += int(ok.sum())
    assert total > 500
    assert 0.93 <= hits / total <= 0.97, hits / total


def test_release_is_reproducible_from_the_stream_and_fresh_otherwise():
    cells, _ = study_cells(copies=5)
    a = release_dp_mos(cells, statistic="slope", epsilon=8.0, delta=1e-6, rng=np.random.default_rng(9)).frame
    b = release_dp_mos(cells, statistic="slope", epsilon=8.0, delta=1e-6, rng=np.random.default_rng(9)).frame
    c = release_dp_mos(cells, statistic="slope", epsilon=8.0, delta=1e-6, rng=np.random.default_rng(10)).frame
    pd.testing.assert_frame_equal(a, b)
    assert not a["theta_released"].equals(c["theta_released"])


def test_bad_settings_are_refused():
    cells, _ = study_cells(copies=2)
    rng = np.random.default_rng(0)
    with pytest.raises(ReleaseError, match="release.dp_mos_chi_quantile"):
        release_dp_mos(cells, statistic="p25", epsilon=1.0, delta=1e-6, rng=rng, config=DPMOSConfig(chi_quantile=0))
    with pytest.raises(ReleaseError, match="release.delta"):
        release_dp_mos(cells, statistic="p25", epsilon=1.0, delta=1.5, rng=rng)


# ---------------------------------------------------------------- a statistical test of the claim
def _outlier_pair():
    """D: 24 cells of 200 rows and cell 0 with 2 rows (no OLS after a removal: no finite LS, so it
    is in neither chi); D': the same plus ONE row in cell 0, whose 3-row line far from x0 then has a
    huge N LS: under MOS that one row sets chi (6.2 -> 90) for every cell."""
    rng = np.random.default_rng(11)
    groups = [random_cell(rng, 200, spread=0.6) for _ in range(24)]
    groups[0] = (np.array([0.90, 0.92]), np.array([0.2, 0.9]))
    d = cells_of(groups)
    d_prime = cells_of([(np.array([0.90, 0.92, 0.91]), np.array([0.2, 0.9, 0.1])), *groups[1:]])
    return d, d_prime


def _event_rate(fn, cells, reps, seed, tau):
    """Share of runs where cell 5's released theta is more than tau from its exact value."""
    theta5 = statistic(ols(cells), "p25", cells.domain)[5]
    hits = 0
    for r in range(reps):
        val = fn(cells, np.random.default_rng([seed, r]))
        hits += int(np.isfinite(val) and abs(val - theta5) > tau)
    return hits / reps


@pytest.mark.slow  # about 25 s; CI runs the slow suite too
def test_likelihood_ratio_of_one_row_is_within_the_claim_and_mos_fails_it():
    """One row added to cell 0 may change what happens to cell 5 only through cell 0's noisy N (its
    eligibility) and chi: P_D'(E) <= exp(eps_n + eps_chi) P_D(E) for E = {|theta~_5 - theta_5| > tau}.
    MOS takes chi as the max of N LS over cells, so the same row multiplies cell 5's noise."""
    d, dp = _outlier_pair()
    eps = 4.0
    split = stage_epsilons(eps, DEFAULT_SPLIT)
    eps_chi = split["n"] + split["chi"]  # 2.0: what links cell 0 to cell 5
    cache = {}

    def dpmos(cells, rng):
        key = id(cells)
        if key not in cache:
            cache[key] = stability_bounds(cells, statistic="p25", k_max=60)
        rel = release_dp_mos(cells, statistic="p25", epsilon=eps, delta=1e-6, rng=rng,
                             bounds=lambda k: cache[key], config=DPMOSConfig(refuse_small_groups=False))
        return rel.frame["theta_released"].iloc[5]

    def mos(cells, rng):
        return release_mos(cells, statistic="p25", epsilon=eps, rng=rng).frame["theta_released"].iloc[5]

    reps, tau = 600, 0.05
    p_d, p_dp = _event_rate(dpmos, d, reps, 1, tau), _event_rate(dpmos, dp, reps, 2, tau)
    assert 0.05 < p_d < 0.95  # the event is neither rare nor sure: the test has power both ways
    sd = math.sqrt((p_d * (1 - p_d) * math.exp(2 * eps_chi) + p_dp * (1 - p_dp)) / reps)
    assert p_dp <= math.exp(eps_chi) * p_d + 4 * sd  # P_D'(E) <= e^eps_chi P_D(E), within sampling error
    assert (1 - p_d) <= math.exp(eps_chi) * (1 - p_dp) + 4 * sd  # and for the complement, the other way
    # the mutation: MOS's chi is set by the added row, so cell 5's noise jumps (ratio far above e^(3 eps))
    m_d, m_dp = _event_rate(mos, d, 300, 3, tau), _event_rate(mos, dp, 300, 4, tau)
    assert m_d < 0.03 and m_dp > 0.4  # a likelihood ratio above 13 > e^2: one row of another cell moves it


def test_release_json_states_the_end_to_end_guarantee(tmp_path):
    from hydra import compose, initialize_config_module

    from dptrain.tasks.registry import register_configs
    from dptrain.tasks.release import run_task

    register_configs()
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=mos_atlas", "release.method=dp_mos",
                                                       "release.epsilon_per_statistic=4", "data.n_cells=300",
                                                       "release.private_evaluation=false"])
    run_task(cfg, run_dir=tmp_path)
    info = json.loads((tmp_path / "release.json").read_text())
    assert info["method"] == "dp_mos" and info["neighbours"] == "add_remove"
    assert info["epsilon"] == pytest.approx(12.0) and info["delta"] == pytest.approx(1e-6)
    assert info["epsilon_split"] == {k: pytest.approx(4.0 * v) for k, v in DEFAULT_SPLIT.items()}
    assert "conditional" not in json.dumps(info)
    assert "end to end" in info["guarantee"]
    frame = pd.read_csv(tmp_path / "release.csv")
    assert {"ci_low", "ci_high", "chi", "n_released"} <= set(frame.columns)
    assert frame["chi"].nunique() == 1 and frame["chi"].iloc[0] == pytest.approx(info["chi"])


def test_python_api_release_dp_mos():
    from dptrain.release.api import fit_cells

    rng = np.random.default_rng(12)
    frames = []
    for c, n in enumerate([300, 500, 800, 50]):
        x, y = random_cell(rng, n)
        frames.append(pd.DataFrame({"county": c, "x": x, "y": y}))
    df = pd.concat(frames, ignore_index=True)
    keys = pd.DataFrame({"county": [0, 1, 2, 3, 4]})  # county 4 has no rows: listed, not released
    est = fit_cells(df, x="x", y="y", cells=["county"], cell_keys=keys)
    with pytest.raises(ReleaseError, match="too small for a private chi"):
        est.release_dp_mos(statistic="slope", epsilon=8.0, seed=5)  # 5 cells: chi would be nearly random
    rel = est.release_dp_mos(statistic="slope", epsilon=8.0, seed=5, small_groups=True)
    f = rel.to_frame()
    assert list(f["county"]) == [0, 1, 2, 3, 4]
    assert not f["released"].iloc[4] and f["reason"].iloc[4] == "noisy N below the eligibility threshold"
    assert rel.epsilon["total"] == pytest.approx(24.0) and "end to end" in rel.privacy
    assert "5" not in json.dumps({k: v for k, v in rel.info.items() if k == "rng"})  # the seed is not echoed
    again = est.release_dp_mos(statistic="slope", epsilon=8.0, seed=5, small_groups=True).to_frame()
    pd.testing.assert_frame_equal(f, again)


def test_one_chi_per_public_group():
    """release.chi_by: each group's chi is drawn from its own cells (parallel composition); a group of
    cells with much larger stability bounds gets a larger chi, and the other group is unaffected."""
    rng = np.random.default_rng(13)
    calm = [random_cell(rng, 400, spread=0.8) for _ in range(60)]
    wild = [random_cell(rng, 400, spread=0.08) for _ in range(60)]
    cells = cells_of(calm + wild)
    groups = np.array(["calm"] * 60 + ["wild"] * 60)
    rel = release_dp_mos(cells, statistic="p25", epsilon=8.0, delta=1e-6, rng=np.random.default_rng(0),
                         config=DPMOSConfig(chi_groups=groups))
    assert set(rel.chi) == {"calm", "wild"} and rel.chi["wild"] > 2 * rel.chi["calm"]
    np.testing.assert_array_equal(rel.frame["chi"].to_numpy(), np.where(groups == "calm", rel.chi["calm"],
                                                                        rel.chi["wild"]))
    calm_rel = rel.frame["released"].to_numpy()[groups == "calm"]
    assert calm_rel.mean() > 0.6  # the wild group's larger chi does not touch the calm group's cells


@pytest.mark.parametrize(("extra", "needle"), [
    ("release.neighbors=add", "release.neighbors"),
    ("release.noise=normal", "release.noise"),
    ("release.dp_mos_chi_quantile=0", "release.dp_mos_chi_quantile"),
    ("release.dp_mos_split.test=0", "release.dp_mos_split.test"),
])
def test_settings_that_dp_mos_cannot_honour_are_refused(extra, needle, tmp_path):
    from hydra import compose, initialize_config_module

    from dptrain.core.validation import ConfigError
    from dptrain.tasks.registry import register_configs
    from dptrain.tasks.release import run_task

    register_configs()
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=mos_atlas", "release.method=dp_mos",
                                                       "data.n_cells=50", extra])
    with pytest.raises((ConfigError, ReleaseError), match=needle):
        run_task(cfg, run_dir=tmp_path)
    assert not (tmp_path / "release.csv").exists()
