"""dptrain.data.atlas: the Figure-2 design, the rich Atlas-like generator, the fast rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dptrain.data.atlas import (
    AtlasConfig,
    clipped_mean,
    design_cells,
    projection_line,
    simulate_atlas,
    simulate_figure2,
    simulate_rows_fast,
)
from dptrain.release.cells import Domain, group_cells, make_cells, ols, standard_error, statistic


@pytest.fixture(scope="module")
def fig2():
    return simulate_figure2(seed=0)


def fit(rows: pd.DataFrame, kind: str):
    g = int(rows["cell"].max()) + 1
    c = make_cells(
        rows["x"],
        rows["y"],
        rows["cell"],
        keys=pd.DataFrame({"cell": np.arange(g)}),
        domain=Domain(),
    )
    f = ols(c)
    return c, statistic(f, kind, c.domain), standard_error(f, kind, c.domain)


def test_figure2_design(fig2):
    rows, truth = fig2
    assert len(truth) == 840 and list(truth["cell"]) == list(range(840))
    assert (
        (truth["n"].value_counts() == 3).all()
        and truth["n"].min() == 20
        and truth["n"].max() == 299
    )
    assert (rows.groupby("cell").size().to_numpy() == truth["n"].to_numpy()).all()
    assert len(rows) == truth["n"].sum()
    assert rows["x"].between(0, 1).all() and rows["y"].between(0, 1).all()
    assert (rows["y"] == 0).any() and (rows["y"] == 1).any()  # clipping happened
    # x ~ U(st, st + pr) inside each cell
    lo, hi = rows.groupby("cell")["x"].min(), rows.groupby("cell")["x"].max()
    assert (lo.to_numpy() >= truth["st"].to_numpy()).all()
    assert (hi.to_numpy() <= (truth["st"] + truth["pr"]).to_numpy()).all()
    # pr is a mean of N draws of U(0, 0.75): concentrated near 0.375
    assert abs(truth["pr"].mean() - 0.375) < 0.01 and truth["pr"].std() < 0.05
    np.testing.assert_allclose(
        truth[["p25_latent", "p75_latent", "slope_latent"]].iloc[0], [0.3125, 0.4375, 0.25]
    )


def test_figure2_seeded(fig2):
    rows, truth = fig2
    rows2, truth2 = simulate_figure2(seed=0)
    pd.testing.assert_frame_equal(rows, rows2)
    pd.testing.assert_frame_equal(truth, truth2)
    assert not np.allclose(
        simulate_figure2(seed=1, n_max=25)[0]["x"], rows2["x"].iloc[: 3 * sum(range(20, 26))]
    )


def test_figure2_ols_matches_truth(fig2):
    rows, truth = fig2
    for kind in ("p25", "slope"):
        _, theta, se = fit(rows, kind)
        big = truth["n"].to_numpy() >= 150
        zs = (theta - truth[kind].to_numpy())[big] / se[big]
        assert abs(zs.mean()) < 4 / np.sqrt(big.sum()), kind  # unbiased for the stated truth
        assert 0.8 < zs.std() < 1.2, kind  # errors at the OLS SE scale


def test_figure2_truth_is_clipped_projection():
    """One huge cell: OLS converges to the clipped projection, not to the unclipped line."""
    rows, truth = simulate_figure2(seed=3, cells_per_n=1, n_min=400_000, n_max=400_000)
    _, theta, se = fit(rows, "p25")
    assert abs(theta[0] - truth["p25"][0]) < 4 * se[0]
    assert abs(theta[0] - truth["p25_latent"][0]) > 5 * se[0]
    _, theta, se = fit(rows, "slope")
    assert abs(theta[0] - truth["slope"][0]) < 4 * se[0]


def test_truth_helpers():
    rng = np.random.default_rng(0)
    mu = np.array([-0.2, 0.0, 0.3, 0.95, 1.3])
    mc = np.clip(mu[:, None] + 0.18 * rng.standard_normal((5, 200_000)), 0, 1).mean(1)
    np.testing.assert_allclose(clipped_mean(mu, 0.18), mc, atol=2e-3)
    a, b = projection_line(np.array([0.1, 0.0]), np.array([0.4, 1.0]), lambda xs: 0.2 + 0.3 * xs)
    np.testing.assert_allclose(a, 0.2)
    np.testing.assert_allclose(b, 0.3)


@pytest.fixture(scope="module")
def atlas():
    return simulate_atlas(seed=0)


def test_atlas_skewed_sizes(atlas):
    rows, truth = atlas
    n = truth["n"].to_numpy()
    assert len(truth) == 2000 and n.min() >= 1
    assert (n < 20).mean() > 0.3 and (n <= 2).mean() > 0.02 and n.max() >= 500
    assert np.median(n) < n.mean()  # right skew
    assert (rows.groupby("cell").size().to_numpy() == n).all()
    assert set(rows.columns) >= {"cell", "state", "x", "y", "y_rare"}
    assert (rows.groupby("cell")["state"].first().to_numpy() == truth["state"].to_numpy()).all()
    assert rows["x"].between(0, 1).all() and rows["y"].between(0, 1).all()
    assert set(np.unique(rows["y_rare"])) <= {0, 1} and rows["y_rare"].mean() < 0.1
    c = group_cells(rows, x="x", y="y", cells=["cell"], domain=Domain())
    assert (c.keys["cell"].to_numpy() == np.arange(2000)).all() and (c.n == n).all()


def test_atlas_covariate_effect(atlas):
    rows, truth = atlas
    z = truth["z"].to_numpy()
    assert 0.07 < np.polyfit(z, truth["p25"], 1)[0] < 0.085  # z shifts the true intercept
    _, theta, _ = fit(rows, "p25")
    big = truth["n"].to_numpy() >= 50
    assert (
        abs(np.polyfit(z[big], theta[big], 1)[0] - np.polyfit(z[big], truth["p25"][big], 1)[0])
        < 0.015
    )
    rate = rows.groupby("cell")["y_rare"].mean().to_numpy()
    assert np.polyfit(z, truth["p_rare"], 1)[0] > 0.01 and np.polyfit(z, rate, 1)[0] > 0.01
    assert rows["y_rare"].mean() == pytest.approx(
        np.average(truth["p_rare"], weights=truth["n"]), abs=0.005
    )
    r2, t2 = simulate_atlas(seed=0)
    pd.testing.assert_frame_equal(rows, r2)
    pd.testing.assert_frame_equal(truth, t2)


def test_rows_fast():
    x, y, codes = simulate_rows_fast(n_rows=50_000, n_cells=1_000, seed=1, chunk=7_000)
    assert x.dtype == np.float64 and y.dtype == np.float64 and codes.dtype == np.int32
    assert x.size == y.size == codes.size == 50_000
    sizes = np.bincount(codes, minlength=1000)
    assert sizes.min() >= 1 and sizes.sum() == 50_000 and sizes.max() > 5 * np.median(sizes)
    assert (0 <= x).all() and (x <= 1).all() and (0 <= y).all() and (y <= 1).all()
    x2, y2, c2 = simulate_rows_fast(n_rows=50_000, n_cells=1_000, seed=1, chunk=7_000)
    assert np.array_equal(x, x2) and np.array_equal(y, y2) and np.array_equal(codes, c2)
    c = make_cells(x, y, codes, keys=pd.DataFrame({"cell": np.arange(1000)}), domain=Domain())
    assert ols(c).defined.mean() > 0.9
    with pytest.raises(ValueError, match="n_cells"):
        simulate_rows_fast(n_rows=5, n_cells=10, seed=0)


def test_design_cells_list_every_simulated_cell_even_without_rows():
    """The simulator's cell design is public: a release on simulated data lists these cells, so
    the list never depends on which cells drew rows (a cell with 0 rows is listed too)."""
    rows, truth = simulate_atlas(seed=3, n_cells=300, config=AtlasConfig(min_size=0, size_median=2.0))
    design = design_cells(truth)
    assert list(design.columns) == ["cell", "state"] and list(design.cell) == list(range(300))
    empty = set(range(300)) - set(rows.cell)
    assert empty and empty <= set(design.cell)  # cells that drew no row are still declared
    assert (design.set_index("cell").state == truth.set_index("cell").state).all()
    _, fig2_truth = simulate_figure2(seed=0, n_max=25)
    assert list(design_cells(fig2_truth).columns) == ["cell"]
