"""dptrain.release.sensitivity: closed-form local sensitivity vs brute-force refits (docs/release.md sections 2-4)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dptrain.release.cells import Domain, ReleaseError, make_cells
from dptrain.release.sensitivity import (
    brute_force_cells,
    brute_force_local_sensitivity,
    local_sensitivity,
    ols_se_fn,
    ols_statistic_fn,
    se_local_sensitivity,
)

DOM = Domain()
STATS = ("p25", "p75", "slope")


def cells_of(groups, domain=DOM, extra_empty=0):
    """Cells from a list of (x, y) arrays (cell g = groups[g]); ``extra_empty`` empty cells."""
    x = np.concatenate([np.asarray(g[0], float) for g in groups])
    y = np.concatenate([np.asarray(g[1], float) for g in groups])
    codes = np.concatenate([np.full(len(g[0]), i) for i, g in enumerate(groups)])
    G = len(groups) + extra_empty
    return make_cells(x, y, codes, keys=pd.DataFrame({"cell": np.arange(G)}), domain=domain)


def random_groups(seed=0):
    """Cells of sizes 3..40: uniform x, all x equal but one, two distinct values, x clustered near
    one interior point, x clustered at the domain edge; y uniform or linear + noise."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (3, 4, 5, 7, 10, 16, 25, 40):
        for kind in ("uniform", "one_off", "two_vals", "cluster", "edge"):
            if kind == "uniform":
                x = rng.random(n)
            elif kind == "one_off":
                x = np.full(n, rng.random())
                x[rng.integers(n)] = rng.random()
            elif kind == "two_vals":
                x = rng.choice(rng.random(2), n)
                x[:2] = np.sort(np.unique(x)) if np.unique(x).size == 2 else [0.2, 0.8]
            elif kind == "cluster":
                x = 0.5 + 1e-3 * rng.standard_normal(n)
            else:
                x = 0.98 + 0.02 * rng.random(n)
            noisy_line = np.clip(0.2 + 0.5 * x + 0.1 * rng.standard_normal(n), 0, 1)
            y = rng.random(n) if rng.random() < 0.5 else noisy_line
            out.append((x, y))
    return out


# ------------------------------------------------------- exact refits, vectorised over points


def _added(x, y, xs, ys):
    """OLS of the cell plus one point (xs, ys) (arrays, broadcast), from sums about the cell's own
    means (exact refit; shift-invariant so no cancellation): (n', xbar', ybar', S', b', RSS')."""
    xc, yc = x.mean(), y.mean()
    u, d = x - xc, y - yc
    su, sd, suu, sud, sdd = u.sum(), d.sum(), u @ u, u @ d, d @ d
    us, ds = xs - xc, ys - yc
    n1 = x.size + 1.0
    mu, md = (su + us) / n1, (sd + ds) / n1
    S = suu + us * us - n1 * mu * mu
    Sxy = sud + us * ds - n1 * mu * md
    Syy = sdd + ds * ds - n1 * md * md
    b = Sxy / S
    return n1, xc + mu, yc + md, S, b, Syy - b * Sxy


def _theta(f, stat):
    n, xb, yb, S, b, _ = f
    return b if stat == "slope" else yb + b * (DOM.x0(stat) - xb)


def _se(f, stat):
    n, xb, yb, S, b, rss = f
    s2 = np.maximum(rss, 0) / (n - 2)
    if stat == "slope":
        return np.sqrt(s2 / S)
    return np.sqrt(s2 * (1 / n + (DOM.x0(stat) - xb) ** 2 / S))


def brute_add(x, y, stat, *, se=False, ny=5):
    """max |change| over added points: a dense x grid (2001 uniform + 2001 around xbar on the cell's
    own scale), then zoomed 2001-point grids around the 3 best local maxima; y* on ``ny`` points
    (and, for the SE, also y* = the fitted value clipped to the domain)."""
    val = (lambda f: _se(f, stat)) if se else (lambda f: _theta(f, stat))
    base = ols_se_fn(stat, DOM)(x, y) if se else ols_statistic_fn(stat, DOM)(x, y)
    xbar, S = x.mean(), ((x - x.mean()) ** 2).sum()
    b = ((x - xbar) * (y - y.mean())).sum() / S

    def score(xs):
        ys = np.linspace(0, 1, ny)[:, None] * np.ones_like(xs)
        if se:
            ys = np.vstack([ys, np.clip(y.mean() + b * (xs - xbar), 0, 1)])
        return np.abs(val(_added(x, y, xs[None, :], ys)) - base).max(axis=0)

    sig = np.sqrt(S * (1 + 1 / x.size))
    xs = np.concatenate([np.linspace(0, 1, 2001), xbar + sig * np.linspace(-12, 12, 2001)])
    xs = np.unique(np.clip(xs, 0, 1))
    v = score(xs)
    last = xs.size - 1
    peaks = [k for k in range(xs.size) if v[k] >= v[max(k - 1, 0)] and v[k] >= v[min(k + 1, last)]]
    best = v.max()
    for k in sorted(peaks, key=lambda k: -v[k])[:3]:
        best = max(best, score(np.linspace(xs[max(k - 1, 0)], xs[min(k + 1, last)], 2001)).max())
    return best


def brute_remove(x, y, fn):
    base = fn(x, y)
    vals = [fn(np.delete(x, i), np.delete(y, i)) for i in range(x.size)]
    return np.inf if not np.all(np.isfinite(vals)) else max(abs(v - base) for v in vals)


# ---------------------------------------------------------------- closed forms vs brute force


@pytest.fixture(scope="module")
def groups():
    return random_groups(0)


@pytest.mark.parametrize("stat", STATS)
def test_theta_add_is_exact_sup(groups, stat):
    s = local_sensitivity(cells_of(groups), statistic=stat, neighbors="add")
    assert np.all(np.isnan(s.ls_remove)) and np.array_equal(s.ls, s.ls_add)
    for g, (x, y) in enumerate(groups):
        if s.reason[g]:
            assert s.reason[g] == "no spread in x" and np.ptp(x) == 0
            continue
        brute = brute_add(x, y, stat)
        assert brute <= s.ls_add[g] * (1 + 1e-9) + 1e-12, (g, brute, s.ls_add[g])
        assert s.ls_add[g] <= brute * (1 + 1e-6) + 1e-12, (g, brute, s.ls_add[g])
        assert s.ls_corners[g] <= s.ls_add[g]
        assert s.beat_corners[g] == (s.ls_add[g] > s.ls_corners[g] * (1 + 1e-9))


@pytest.mark.parametrize("stat", STATS)
def test_theta_remove_equals_refits(groups, stat):
    s = local_sensitivity(cells_of(groups), statistic=stat, neighbors="add_remove")
    fn = ols_statistic_fn(stat, DOM)
    for g, (x, y) in enumerate(groups):
        brute = brute_remove(x, y, fn)
        if np.isinf(brute):
            assert np.isinf(s.ls[g]) and s.reason[g] == "no spread in x after removing one row"
            continue
        np.testing.assert_allclose(s.ls_remove[g], brute, rtol=1e-8, atol=1e-13)
        assert s.ls[g] == max(s.ls_add[g], s.ls_remove[g]) and s.reason[g] == ""


@pytest.mark.parametrize("stat", STATS)
def test_se_add_matches_dense_brute_force(groups, stat):
    sub = [g for g in groups if np.ptp(g[0]) > 0][::2]
    s = se_local_sensitivity(cells_of(sub), statistic=stat, neighbors="add")
    for g, (x, y) in enumerate(sub):
        brute = brute_add(x, y, stat, se=True, ny=41)
        assert brute <= s.ls_add[g] * (1 + 1e-7) + 1e-12, (g, brute, s.ls_add[g])
        assert s.ls_add[g] <= brute * (1 + 1e-6) + 1e-12, (g, brute, s.ls_add[g])
        assert s.ls_corners[g] <= s.ls_add[g]


@pytest.mark.parametrize("stat", STATS)
def test_se_remove_equals_refits(groups, stat):
    s = se_local_sensitivity(cells_of(groups), statistic=stat, neighbors="add_remove")
    fn = ols_se_fn(stat, DOM)
    for g, (x, y) in enumerate(groups):
        if x.size == 3 and np.ptp(x) > 0:
            assert np.isinf(s.ls[g]) and s.reason[g] == "n < 4: SE undefined after removing one row"
            continue
        brute = brute_remove(x, y, fn)
        if np.isinf(brute):
            assert np.isinf(s.ls[g]) and s.reason[g] != ""
            continue
        np.testing.assert_allclose(s.ls_remove[g], brute, rtol=1e-8, atol=1e-13)


def test_public_brute_force_agrees(groups):
    sub = [groups[i] for i in (5, 6, 18, 30)]
    cells = cells_of(sub)
    for fn, closed in ((ols_statistic_fn("p25", DOM), local_sensitivity(cells, statistic="p25")),
                       (ols_se_fn("slope", DOM), se_local_sensitivity(cells, statistic="slope"))):
        brute = brute_force_cells(cells, stat_fn=fn, grid=21)
        assert np.array_equal(np.isinf(brute), np.isinf(closed.ls))
        fin = np.isfinite(brute)
        assert np.all(brute[fin] <= closed.ls[fin] * (1 + 1e-9) + 1e-12)
        assert np.all(brute[fin] >= closed.ls_corners[fin] * (1 - 1e-9))  # corners are on the grid


def test_brute_force_inf_when_stat_fails():
    x, y = np.array([0.1, 0.5, 0.9]), np.array([0.2, 0.4, 0.3])

    def boom(xx, yy):
        if xx.size > 3:
            raise RuntimeError("no")
        return 1.0

    bf = brute_force_local_sensitivity
    assert bf(x, y, stat_fn=boom, domain=DOM, neighbors="add", grid=3) == np.inf
    assert bf(x, y, stat_fn=lambda a, b: float(a.size), domain=DOM, grid=3) == 1.0


# ---------------------------------------------------------------- hand-computed cells


def test_hand_cells():
    # Cell A: (0,0),(0.5,0.5),(1,1): n=3, xbar=ybar=0.5, S=0.5, b=1, residuals 0: removal moves 0.
    #   p25: alpha=S/n=1/6, beta=x0-xbar=-1/4, q0=S(1+1/n)=2/3; d_add=(y*-0.5-u)(1/6-u/4)/(u^2+2/3).
    #   Corner (0,1): u=-1/2, e*=1 -> (7/24)/(11/12) = 7/22. Stationary quadratics
    #   (y*=1: 21u^2+12u-14=0, y*=0: 3u^2+36u-2=0) give |d| < 7/22 in range -> LS = 7/22, no beat.
    #   slope: d_add = u e*/(u^2+2/3); corners (0,1),(1,0): (1/2)/(11/12) = 6/11 = LS.
    # Cell B: (0,0),(0.5,1),(1,0): xbar=0.5, ybar=1/3, S=0.5, b=0, residuals -1/3, 2/3, -1/3.
    #   p25 removal: drop (0,0) -> line 2-2x, p25 = 3/2: change 7/6 (formula: (1/3)(7/12)/(1/6)).
    #   p25 add, y*=1 (r=2/3): p2=0, p1=-1/6, p0=1/9 -> 3u^2-4u-2=0, u=(2-sqrt10)/3 in range:
    #   d = (2/3)(sqrt10/12)/((20-4 sqrt10)/9) = sqrt10/(40-8 sqrt10) = 0.21509 > corner 7/33.
    #   slope removal: drop (0,0) -> slope -2, change 2.
    cells = cells_of([([0, 0.5, 1], [0, 0.5, 1]), ([0, 0.5, 1], [0, 1, 0])])
    p25 = local_sensitivity(cells, statistic="p25")
    r10 = np.sqrt(10)
    np.testing.assert_allclose(p25.ls_add, [7 / 22, r10 / (40 - 8 * r10)], rtol=1e-12)
    np.testing.assert_allclose(p25.ls_corners, [7 / 22, 7 / 33], rtol=1e-12)
    np.testing.assert_allclose(p25.ls_remove, [0, 7 / 6], atol=1e-14, rtol=1e-12)
    np.testing.assert_allclose(p25.ls, [7 / 22, 7 / 6], rtol=1e-12)
    assert p25.beat_corners.tolist() == [False, True] and p25.reason.tolist() == ["", ""]
    slope = local_sensitivity(cells, statistic="slope")
    np.testing.assert_allclose(slope.ls_add, [6 / 11, 4 / 11], rtol=1e-12)
    np.testing.assert_allclose(slope.ls, [6 / 11, 2], rtol=1e-12)
    # p75 mirrors p25 here (both cells are symmetric under x -> 1 - x, y -> y or 1 - y)
    np.testing.assert_allclose(local_sensitivity(cells, statistic="p75").ls, p25.ls, rtol=1e-12)


def test_hand_se_decrease_branch():
    # Square (0,0),(0,1),(1,0),(1,1): b=0, RSS=1, S=1, SE(slope) = sqrt(RSS/(n-2)/S) = sqrt(1/2).
    # Adding ON the line at x*=0 or 1 (y*=1/2): RSS'=1, S'=1+4(1/4)/5=6/5, SE'=sqrt(1/(3*6/5))
    # = sqrt(1/3.6): the largest change is a DECREASE, sqrt(1/2)-sqrt(1/3.6) = 0.18006, which
    # beats the corners (adding (0,0): RSS'=1+(1/4)(2/3), SE'=sqrt(0.324)). Removing any point
    # leaves slope SE sqrt((1/2)/1/(2/3)) = sqrt(3/4): change 0.1589 < 0.18006.
    cells = cells_of([([0, 0, 1, 1], [0, 1, 0, 1])])
    s = se_local_sensitivity(cells, statistic="slope")
    np.testing.assert_allclose(s.ls_add, np.sqrt(0.5) - np.sqrt(1 / 3.6), rtol=1e-9)
    np.testing.assert_allclose(s.ls_corners, np.sqrt(0.5) - np.sqrt((1 + 1 / 6) / 3.6), rtol=1e-9)
    np.testing.assert_allclose(s.ls_remove, np.sqrt(0.75) - np.sqrt(0.5), rtol=1e-12)
    assert s.beat_corners[0] and s.ls[0] == s.ls_add[0]


# ---------------------------------------------------------------- beat corners, infinities, errors


def test_exact_sup_beats_corners_on_random_data():
    rng = np.random.default_rng(3)
    groups = [(rng.random(n), rng.random(n)) for n in rng.integers(5, 30, 300)]
    s = local_sensitivity(cells_of(groups), statistic="p25", neighbors="add")
    assert s.beat_corners.any() and not s.beat_corners.all()
    assert np.all(s.ls_add >= s.ls_corners)


def test_infinite_cells_and_reasons():
    groups = [
        ([0.2, 0.7], [0.1, 0.9]),                  # n = 2
        ([0.4] * 5, [0.1, 0.2, 0.3, 0.4, 0.5]),    # no spread
        ([0.3, 0.3, 0.3, 0.7], [0.1, 0.5, 0.2, 0.9]),  # removing 0.7 leaves no spread
        ([0.1, 0.5, 0.9], [0.3, 0.2, 0.8]),        # n = 3: theta finite, SE inf under removal
        ([0.1, 0.4, 0.6, 0.9], [0.3, 0.2, 0.8, 0.5]),
    ]
    cells = cells_of(groups, extra_empty=1)
    for stat in STATS:
        ar = local_sensitivity(cells, statistic=stat)
        after = "no spread in x after removing one row"
        assert ar.reason.tolist() == ["n < 3", "no spread in x", after, "", "", "n < 3"]
        assert np.isinf(ar.ls).tolist() == [True, True, True, False, False, True]
        assert np.isfinite(ar.ls_add[2]) and np.isinf(ar.ls_remove[2])
        assert not ar.beat_corners[:2].any()
        add = local_sensitivity(cells, statistic=stat, neighbors="add")
        assert np.isinf(add.ls).tolist() == [True, True, False, False, False, True]
        se = se_local_sensitivity(cells, statistic=stat)
        assert se.reason.tolist() == ["n < 3", "no spread in x", after,
                                      "n < 4: SE undefined after removing one row", "", "n < 3"]
        se_add = se_local_sensitivity(cells, statistic=stat, neighbors="add")
        assert se_add.reason.tolist() == ["n < 3", "no spread in x", "", "", "", "n < 3"]
        assert np.all(np.isfinite(se_add.ls[2:5])) and se_add.ls.dtype == np.float64


def test_bad_settings_raise():
    cells = cells_of([([0, 0.5, 1], [0, 0.5, 1])])
    with pytest.raises(ReleaseError, match=r"release\.neighbors.*add, add_remove"):
        local_sensitivity(cells, statistic="p25", neighbors="replace")
    with pytest.raises(ReleaseError, match=r"release\.statistic.*p25, p75, slope"):
        se_local_sensitivity(cells, statistic="mean")
    with pytest.raises(ReleaseError, match=r"release\.neighbors"):
        brute_force_local_sensitivity(np.zeros(3), np.zeros(3), stat_fn=len, domain=DOM,
                                      neighbors="x")


def test_other_domain_and_vectorised_equals_single():
    dom = Domain(x_lo=-2.0, x_hi=3.0, y_lo=10.0, y_hi=20.0)
    rng = np.random.default_rng(7)
    groups = [(rng.uniform(-2, 3, n), rng.uniform(10, 20, n)) for n in (4, 9, 30)]
    allc = local_sensitivity(cells_of(groups, domain=dom), statistic="p75")
    for g, grp in enumerate(groups):
        one = local_sensitivity(cells_of([grp], domain=dom), statistic="p75")
        np.testing.assert_allclose(one.ls, allc.ls[g], rtol=1e-12)
        fn = ols_statistic_fn("p75", dom)
        bf = brute_force_local_sensitivity(*grp, stat_fn=fn, domain=dom, grid=61)
        assert bf <= allc.ls[g] * (1 + 1e-9)
