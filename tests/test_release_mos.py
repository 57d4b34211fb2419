"""Tests of dptrain.release.mos: chi, MOS noise infusion, epsilon accounting, refusals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dptrain.release.cells import Domain, ReleaseError, make_cells, ols, standard_error, statistic
from dptrain.release.mos import NOT_DP, MOSConfig, MOSInputs, chi, release_mos

try:
    from dptrain.release.sensitivity import local_sensitivity, se_local_sensitivity
except ImportError:  # pragma: no cover - the sensitivity module is written alongside
    local_sensitivity = se_local_sensitivity = None

needs_sensitivity = pytest.mark.skipif(local_sensitivity is None, reason="dptrain.release.sensitivity not available")


def mos(c, *, statistic, epsilon, sensitivity=None, se_sensitivity=None, neighbors="add_remove",
        noise="laplace", epsilon_split=(1, 1, 1), chi_groups=None, **kw):
    """release_mos with the settings as keywords: precomputed sensitivities go in MOSInputs, the
    MOS settings in MOSConfig."""
    return release_mos(c, statistic=statistic, epsilon=epsilon,
                       precomputed=MOSInputs(sensitivity=sensitivity, se_sensitivity=se_sensitivity),
                       config=MOSConfig(neighbors=neighbors, noise=noise, epsilon_split=epsilon_split,
                                        chi_groups=chi_groups), **kw)


def make_data(sizes, *, seed=0, flat=()):
    """Cells of the given sizes; cells listed in ``flat`` have no spread in x."""
    rng = np.random.default_rng(seed)
    codes = np.repeat(np.arange(len(sizes)), sizes)
    x = rng.uniform(0, 1, codes.size)
    for c in flat:
        x[codes == c] = 0.5
    y = np.clip(0.2 + 0.5 * x + 0.15 * rng.standard_normal(codes.size), 0, 1)
    keys = pd.DataFrame({"cell": [f"c{i}" for i in range(len(sizes))]})
    return make_cells(x, y, codes, keys=keys, domain=Domain())


def identical_cells(g, n, seed=0):
    """g cells holding the same n rows (so theta, SE and LS are equal across cells)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n)
    y = np.clip(0.3 + 0.4 * x + 0.1 * rng.standard_normal(n), 0, 1)
    keys = pd.DataFrame({"cell": np.arange(g)})
    return make_cells(np.tile(x, g), np.tile(y, g), np.repeat(np.arange(g), n), keys=keys, domain=Domain())


def stub(ls, reason=None):
    """A Sensitivity-like object with hand-chosen LS (so chi is known exactly)."""
    ls = np.asarray(ls, dtype=float)
    r = np.array([""] * ls.size, dtype=object) if reason is None else np.asarray(reason, dtype=object)
    return SimpleNamespace(ls=ls, reason=r, beat_corners=np.zeros(ls.size, dtype=bool))


# ---------------------------------------------------------------- chi


def test_chi_hand_computed_ignores_infinite_ls():
    ls = np.array([0.1, 0.2, np.inf, 0.05])
    n = np.array([10, 4, 2, 30])
    # n * ls = 1.0, 0.8, (skipped), 1.5
    assert np.allclose(chi(ls, n), 1.5)


def test_chi_by_groups():
    ls = np.array([0.1, 0.2, np.inf, 0.05, np.inf])
    n = np.array([10, 4, 2, 30, 1])
    out = chi(ls, n, np.array([0, 0, 1, 1, 2]))
    assert np.allclose(out[:4], [1.0, 1.0, 1.5, 1.5])
    assert np.isnan(out[4])  # a group without any finite LS
    lab = chi(ls[:4], n[:4], np.array(["CA", "CA", "NY", "NY"]))
    assert np.allclose(lab, [1.0, 1.0, 1.5, 1.5])
    with pytest.raises(ReleaseError, match="chi_groups"):
        chi(ls, n, np.array([0, 1]))


# ---------------------------------------------------------------- release


def test_noise_sd_reported_and_matched_empirically():
    g, n, eps = 4000, 20, 1.0
    c = identical_cells(g, n)
    ls = np.full(g, 0.5 / n)  # chi = 0.5
    rel = mos(c, statistic="p25", epsilon=eps, seed=1, sensitivity=stub(ls), se_sensitivity=stub(ls / 10))
    f = rel.frame
    expected_sd = np.sqrt(2) * 0.5 / (eps * n)
    assert np.allclose(f["noise_sd"], expected_sd, rtol=1e-5)  # only the 2^-20 grid inflation
    assert np.allclose(f["chi"], 0.5) and np.allclose(rel.chi_table["chi"], 0.5)
    theta = statistic(ols(c), "p25", c.domain)
    err = f["theta_released"].to_numpy() - theta
    assert abs(err.std() / expected_sd - 1) < 0.05
    assert abs(err.mean()) < 4 * expected_sd / np.sqrt(g)
    n_err = f["n_released"].to_numpy() - n
    assert np.all(n_err == np.rint(n_err))  # N~ on the integer grid
    assert abs(n_err.std() / (np.sqrt(2) / eps) - 1) < 0.06


def test_independent_draws_for_theta_se_and_n():
    g, n = 4000, 25
    c = identical_cells(g, n, seed=3)
    # a shared draw (the Stata code reuses one for theta and N) would give correlation 1
    ls = np.full(g, 1.0 / n)
    rel = mos(c, statistic="slope", epsilon=1.0, seed=2, sensitivity=stub(ls), se_sensitivity=stub(ls))
    f = rel.frame
    fit = ols(c)
    d_theta = f["theta_released"].to_numpy() - statistic(fit, "slope", c.domain)
    d_n = f["n_released"].to_numpy() - n
    se = standard_error(fit, "slope", c.domain)
    d_se2 = f["se_released"].to_numpy() ** 2 - f["noise_sd"].to_numpy() ** 2 - se ** 2
    lim = 4 / np.sqrt(g)
    assert abs(np.corrcoef(d_theta, d_n)[0, 1]) < lim
    assert abs(np.corrcoef(d_theta, d_se2)[0, 1]) < lim


def test_se_released_formula_from_noised_se():
    c = make_data([30, 40, 50, 60])
    ls = np.array([0.05, 0.04, 0.03, 0.02])
    # a huge epsilon for the SE makes SE_noised = SE (to ~1e-9), exposing the formula
    rel = mos(c, statistic="p75", epsilon={"theta": 0.5, "se": 1e9, "n": 1.0}, seed=0,
                      sensitivity=stub(ls), se_sensitivity=stub(ls / 5))
    f = rel.frame
    se = standard_error(ols(c), "p75", c.domain)
    chi_t = (ls * c.n).max()
    sd = np.sqrt(2) * chi_t / (0.5 * c.n)
    assert np.allclose(f["noise_sd"], sd, rtol=1e-5)
    assert np.allclose(f["se_released"], np.sqrt(se ** 2 + f["noise_sd"] ** 2), rtol=1e-7)
    assert np.allclose(f["se_released"], np.sqrt(se ** 2 + sd ** 2), rtol=1e-5)
    assert np.allclose(f["chi_se"], (ls / 5 * c.n).max())


def test_seeded_reproducibility():
    c = make_data([20, 30, 40, 50, 60], seed=4)
    ls = stub(np.full(5, 0.01))
    kw = dict(statistic="p25", epsilon=1.0, sensitivity=ls, se_sensitivity=ls)
    a = mos(c, seed=9, **kw).frame
    b = mos(c, seed=9, **kw).frame
    d = mos(c, seed=10, **kw).frame
    e = mos(c, seed=None, **kw)
    pd.testing.assert_frame_equal(a, b)
    assert not a["theta_released"].equals(d["theta_released"])
    seeded = mos(c, seed=9, **kw).info["rng"]
    assert "CSPRNG" in e.info["rng"] and "REPRODUCIBLE" in seeded
    assert "9" not in seeded  # the info never echoes the seed (whoever knows it removes the noise)
    g = mos(c, rng=np.random.default_rng(9), **kw)  # a caller's stream (a release run's Randomness)
    assert "supplied by the caller" in g.info["rng"]


def test_no_true_values_in_frame():
    c = make_data([20, 30, 40], seed=5)
    rel = mos(c, statistic="p25", epsilon=1.0, seed=0,
                      sensitivity=stub([0.02, 0.01, 0.01]), se_sensitivity=stub([0.01, 0.01, 0.01]))
    f = rel.to_frame()
    assert list(f.columns) == ["cell", "group", "released", "reason", "theta_released", "se_released",
                               "n_released", "noise_sd", "ci_low", "ci_high", "chi", "chi_se"]
    fit = ols(c)
    truths = [statistic(fit, "p25", c.domain), standard_error(fit, "p25", c.domain), c.n]
    for col in ("theta_released", "se_released", "n_released"):
        for t in truths:
            assert not np.any(f[col].to_numpy() == t)
    f.loc[0, "theta_released"] = 0.0  # to_frame is a copy
    assert rel.frame.loc[0, "theta_released"] != 0.0


def test_undefined_cells_not_released_with_reason_stub():
    c = make_data([2, 5, 30, 40], flat=[1])  # cell 0: n < 3; cell 1: no spread in x
    ls = np.array([np.inf, np.inf, 0.01, 0.02])
    rel = mos(c, statistic="slope", epsilon=1.0, seed=0,
                      sensitivity=stub(ls, ["n < 3", "no spread in x", "", ""]), se_sensitivity=stub(ls))
    f = rel.frame
    assert f["released"].tolist() == [False, False, True, True]
    assert f["reason"].tolist() == ["n < 3", "no spread in x", "", ""]
    assert f.loc[:1, ["theta_released", "se_released", "n_released", "noise_sd"]].isna().all().all()
    assert np.allclose(f["chi"], 0.8)  # 40 * 0.02; the infinite cells do not drive chi
    # without a reason from the sensitivity, the OLS failure is named
    rel2 = mos(c, statistic="slope", epsilon=1.0, seed=0, sensitivity=stub(ls), se_sensitivity=stub(ls))
    assert rel2.frame["reason"].tolist()[:2] == ["n < 3", "no spread in x"]
    assert rel.info["released"] == 2 and rel.info["cells"] == 4


def test_chi_groups_in_release():
    c = make_data([20, 40, 20, 40], seed=6)
    ls = np.array([0.01, 0.01, 0.05, 0.05])
    rel = mos(c, statistic="p25", epsilon=2.0, seed=0, chi_groups=np.array(["a", "a", "b", "b"]),
                      sensitivity=stub(ls), se_sensitivity=stub(ls))
    assert np.allclose(rel.frame["chi"], [0.4, 0.4, 2.0, 2.0])
    t = rel.chi_table.set_index("group")
    assert np.isclose(t.loc["a", "chi"], 0.4) and np.isclose(t.loc["b", "chi"], 2.0)
    assert np.allclose(rel.frame["noise_sd"], np.sqrt(2) * np.array([0.4, 0.4, 2.0, 2.0]) / (2.0 * c.n), rtol=1e-5)


def test_epsilon_accounting():
    c = make_data([20, 30], seed=7)
    ls = stub([0.01, 0.01])
    kw = dict(statistic="p25", seed=0, sensitivity=ls, se_sensitivity=ls)
    e = mos(c, epsilon=0.5, **kw).epsilon
    assert (e["theta"], e["se"], e["n"], e["total_per_cell"], e["total"]) == (0.5, 0.5, 0.5, 1.5, 1.5)
    e = mos(c, epsilon={"theta": 1.0, "se": 0.25, "n": 0.5}, **kw).epsilon
    assert e["total_per_cell"] == 1.75 and e["total"] == 1.75  # parallel over disjoint cells
    e = mos(c, epsilon=1.0, epsilon_split=(2, 1, 0.5), **kw).epsilon
    assert (e["theta"], e["se"], e["n"]) == (2.0, 1.0, 0.5)
    info = mos(c, epsilon=1.0, **kw).info["epsilon_accounting"]
    assert "sequential" in info and "parallel" in info


@pytest.mark.parametrize("eps", [0, -1.0, np.inf, np.nan, "1", True, {"theta": 1.0, "se": 1.0},
                                 {"theta": 1.0, "se": 0.0, "n": 1.0}])
def test_bad_epsilon_refused_by_name(eps):
    c = make_data([20, 30], seed=8)
    ls = stub([0.01, 0.01])
    with pytest.raises(ReleaseError, match="release.epsilon_per_statistic"):
        mos(c, statistic="p25", epsilon=eps, seed=0, sensitivity=ls, se_sensitivity=ls)


def test_bad_settings_refused_by_name():
    c = make_data([20, 30], seed=8)
    ls = stub([0.01, 0.01])
    kw = dict(epsilon=1.0, seed=0, sensitivity=ls, se_sensitivity=ls)
    with pytest.raises(ReleaseError, match="release.statistic"):
        mos(c, statistic="median", **kw)
    with pytest.raises(ReleaseError, match="release.noise"):
        mos(c, statistic="p25", noise="uniform", **kw)
    with pytest.raises(ReleaseError, match="release.neighbors"):
        mos(c, statistic="p25", neighbors="replace", **kw)
    with pytest.raises(ReleaseError, match="release.epsilon_split"):
        mos(c, statistic="p25", epsilon_split=(1, 0, 1), **kw)


def test_not_dp_sentence_and_normal_noise_caveat():
    c = make_data([20, 30], seed=9)
    ls = stub([0.01, 0.01])
    rel = mos(c, statistic="p25", epsilon=1.0, seed=0, noise="normal", sensitivity=ls, se_sensitivity=ls)
    assert rel.info["privacy"] == NOT_DP
    assert "MOS is NOT differentially private" in NOT_DP and "conditional on chi" in NOT_DP
    assert any("normal" in s and "epsilon" in s for s in rel.info["caveats"])
    assert rel.info["noise"] == "normal" and rel.frame["released"].all()


# ---------------------------------------------------------------- with the real local sensitivity


@needs_sensitivity
def test_real_sensitivity_end_to_end():
    c = make_data([2, 6, 30, 80, 150, 300], flat=[1], seed=10)
    for stat in ("p25", "slope"):
        for nb in ("add", "add_remove"):
            rel = mos(c, statistic=stat, epsilon=1.0, neighbors=nb, seed=3)
            s = local_sensitivity(c, statistic=stat, neighbors=nb)
            f = rel.frame
            assert not f.loc[0, "released"] and not f.loc[1, "released"]
            assert f.loc[0, "reason"] == s.reason[0] == "n < 3"
            assert f.loc[1, "reason"] == s.reason[1] == "no spread in x"
            assert f.loc[2:, "released"].all() and (f.loc[2:, "reason"] == "").all()
            finite = np.isfinite(s.ls) & ols(c).defined
            assert np.isclose(f["chi"].iloc[0], np.max(c.n[finite] * s.ls[finite]))
            assert np.allclose(f.loc[2:, "noise_sd"], np.sqrt(2) * f["chi"].iloc[0] / c.n[2:], rtol=1e-5)
            assert rel.info["neighbors"] == nb and isinstance(rel.info["beat_corners"], int)
            se_s = se_local_sensitivity(c, statistic=stat, neighbors=nb)
            fin = np.isfinite(se_s.ls) & ols(c).defined
            assert np.isclose(f["chi_se"].iloc[0], np.max(c.n[fin] * se_s.ls[fin]))


@needs_sensitivity
def test_real_sensitivity_n3_cell_needs_se():
    """n = 3: theta's LS is finite, but under add_remove the SE is undefined after a removal, so
    the cell (theta, SE and N together) is not released; under add it is."""
    c = make_data([3, 40, 60], seed=11)
    a = mos(c, statistic="p25", epsilon=1.0, neighbors="add_remove", seed=0).frame
    assert not a.loc[0, "released"] and "SE" in a.loc[0, "reason"]
    b = mos(c, statistic="p25", epsilon=1.0, neighbors="add", seed=0).frame
    assert b["released"].all()
