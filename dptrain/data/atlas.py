"""Seeded Atlas-like cell data for the release side (docs/release.md section 7); no download needed.

Three generators, all deterministic given ``seed`` (``numpy.random.default_rng([seed, k])``):

* :func:`simulate_figure2`: the paper's Figure 2 design (Chetty & Friedman 2019): 3 cells for
  each N = 20..299.
* :func:`simulate_atlas`: a richer generator: skewed cell sizes (lognormal, many cells of 1-20
  rows, a few of thousands), a cell covariate ``z`` that shifts the cell's true intercept, a rare
  binary outcome ``y_rare`` whose rate depends on ``z``, and a ``state`` column for chi by group.
* :func:`simulate_rows_fast`: bare arrays (x, y, codes) for the 20M-row benchmark, generated in
  chunks into preallocated arrays.

The cell design is public. A release on simulated data does not need the user to declare its
cells: :func:`design_cells` lists every simulated cell (with its state), whether or not it drew
any row, so the list of cells never depends on the rows (see dptrain.release.cell_domain).

The truth of a cell. Rows of cell g are drawn as x ~ U(x_lo, x_hi) and
y = clip(mu(x) + e, 0, 1) with a latent line mu and Gaussian e. The clipped conditional mean
m(x) = E[y | x] is not a line, so the "true" p25 / p75 / slope of a cell is defined as the
population OLS projection of y on x under the cell's own x distribution,

    slope = Cov(x, m(x)) / Var(x),   line(x0) = E[m(x)] + slope (x0 - E[x]),

which is the quantity per-cell OLS converges to as N grows (x ~ U(x_lo, x_hi) fixed per cell).
It is computed by Gauss-Legendre quadrature with the closed form
E[clip(mu + s Z, 0, 1)] = g(mu) - g(mu - 1), g(t) = t Phi(t / s) + s phi(t / s).
The unclipped latent line is returned beside it (``*_latent`` columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "DESIGN_COLUMNS",
    "AtlasConfig",
    "clipped_mean",
    "design_cells",
    "projection_line",
    "simulate_atlas",
    "simulate_figure2",
    "simulate_rows_fast",
]

_GL_X = np.polynomial.legendre.leggauss(24)
_GL_AB = np.polynomial.legendre.leggauss(16)


def clipped_mean(mu: np.ndarray, sd: float) -> np.ndarray:
    """E[clip(mu + sd Z, 0, 1)] for Z ~ N(0, 1), elementwise (exact closed form)."""
    from scipy.special import ndtr  # data=atlas only

    mu = np.asarray(mu, dtype=np.float64)

    def g(t: np.ndarray) -> np.ndarray:  # E[max(t + sd Z, 0)]
        r = t / sd
        return t * ndtr(r) + sd * np.exp(-0.5 * r * r) / np.sqrt(2.0 * np.pi)

    return g(mu) - g(mu - 1.0)


def projection_line(x_lo: np.ndarray, x_hi: np.ndarray, mean_fn) -> tuple[np.ndarray, np.ndarray]:
    """Population OLS (a, b) of m(x) on x for x ~ U(x_lo, x_hi), per cell.

    Args:
        x_lo, x_hi: per-cell support of x (arrays of length G).
        mean_fn: maps an array of x of shape (G, K) to m(x) of the same shape.
    """
    x_lo = np.asarray(x_lo, dtype=np.float64)[:, None]
    x_hi = np.asarray(x_hi, dtype=np.float64)[:, None]
    t, w = _GL_X
    xs = x_lo + (x_hi - x_lo) * (t[None, :] + 1.0) / 2.0  # (G, K) nodes
    w = w[None, :] / 2.0  # weights of the uniform density, sum to 1
    m = mean_fn(xs)
    ex, em = (w * xs).sum(1), (w * m).sum(1)
    cov = (w * (xs - ex[:, None]) * (m - em[:, None])).sum(1)
    var = (x_hi[:, 0] - x_lo[:, 0]) ** 2 / 12.0
    b = cov / var
    return em - b * ex, b


def _figure2_mean(xs: np.ndarray, sd: float) -> np.ndarray:
    """m(x) = E over intercept, slope ~ U(0, 0.5) iid of E[clip(int + slope x + sd Z, 0, 1)]."""
    t, w = _GL_AB
    nodes, wts = 0.25 * (t + 1.0), w / 2.0  # U(0, 0.5) nodes and weights (sum 1)
    out = np.zeros_like(xs)
    for wa, na in zip(wts, nodes):  # loop over the 16 intercept nodes, not over cells
        out += wa * np.tensordot(
            wts, clipped_mean(na + nodes[:, None, None] * xs[None], sd), axes=1
        )
    return out


def _truth_frame(a: np.ndarray, b: np.ndarray, a_lat: np.ndarray, b_lat: np.ndarray) -> dict:
    return {
        "p25": a + 0.25 * b,
        "p75": a + 0.75 * b,
        "slope": b,
        "p25_latent": a_lat + 0.25 * b_lat,
        "p75_latent": a_lat + 0.75 * b_lat,
        "slope_latent": b_lat,
    }


def simulate_figure2(
    *, seed: int, cells_per_n: int = 3, n_min: int = 20, n_max: int = 299, noise_sd: float = 0.18
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's Figure 2 design (docs/release.md section 7).

    For each N in n_min..n_max, ``cells_per_n`` cells: pr = mean of N draws of U(0, 0.75),
    st = mean of N draws of U(0, 1 - pr), x = st + pr U(0, 1); per observation intercept and
    slope ~ U(0, 0.5) iid; y = clip(intercept + slope x + noise_sd N(0, 1), 0, 1).

    Returns:
        rows: columns ``cell`` (0..G-1, rows sorted by cell), ``x``, ``y``.
        truth: one row per cell in cell order: ``cell, n, st, pr`` (x ~ U(st, st + pr)),
        ``p25, p75, slope`` (population OLS projection of the clipped y on x in that cell; see the
        module docstring) and ``p25_latent, p75_latent, slope_latent`` (the unclipped line
        E[y|x] = 0.25 + 0.25 x: 0.3125, 0.4375, 0.25).
    """
    if not (1 <= n_min <= n_max) or cells_per_n < 1:
        raise ValueError(
            f"simulate_figure2: need 1 <= n_min <= n_max and cells_per_n >= 1, got "
            f"n_min={n_min}, n_max={n_max}, cells_per_n={cells_per_n}"
        )
    rng = np.random.default_rng([int(seed), 21])
    n = np.repeat(np.arange(n_min, n_max + 1), cells_per_n)
    g = n.size
    codes = np.repeat(np.arange(g), n)
    pr = np.bincount(codes, rng.uniform(0.0, 0.75, codes.size), minlength=g) / n
    st = (1.0 - pr) * np.bincount(codes, rng.random(codes.size), minlength=g) / n
    x = st[codes] + pr[codes] * rng.random(codes.size)
    icpt = rng.uniform(0.0, 0.5, codes.size)
    slope = rng.uniform(0.0, 0.5, codes.size)
    y = np.clip(icpt + slope * x + noise_sd * rng.standard_normal(codes.size), 0.0, 1.0)
    rows = pd.DataFrame({"cell": codes, "x": x, "y": y})
    a, b = projection_line(st, st + pr, lambda xs: _figure2_mean(xs, noise_sd))
    truth = pd.DataFrame(
        {
            "cell": np.arange(g),
            "n": n,
            "st": st,
            "pr": pr,
            **_truth_frame(a, b, np.full(g, 0.25), np.full(g, 0.25)),
        }
    )
    return rows, truth


@dataclass(frozen=True)
class AtlasConfig:
    """The design of :func:`simulate_atlas` (the defaults are ``data=atlas``'s).

    Cell sizes: ``size_median`` exp(``size_sigma`` w), w correlated ``size_z_corr`` with the cell
    covariate z, clipped to [``min_size``, ``max_size``]; ``n_states`` states. The latent line:
    intercept ``intercept`` + ``z_effect`` z + ``cell_sd`` N(0, 1); row noise ``noise_sd``. The
    rare outcome: rate ``rare_rate`` at z = 0, logit slope ``rare_z_effect`` in z."""

    n_states: int = 20
    size_median: float = 25.0  # rows of a cell at w = 0
    size_sigma: float = 1.5  # of log rows
    size_z_corr: float = -0.3  # in (-1, 1): larger cells have lower z
    min_size: int = 1  # rows (0: a cell may have none)
    max_size: int = 5000  # rows
    intercept: float = 0.30  # y (a rank in [0, 1]) at x = 0 and z = 0
    z_effect: float = 0.08  # y per sd of z
    cell_sd: float = 0.03  # y
    noise_sd: float = 0.18  # y, one row's noise around its cell's line
    rare_rate: float = 0.03  # a probability, at z = 0
    rare_z_effect: float = 0.6  # logit per sd of z


def _atlas_sizes(rng: np.random.Generator, z: np.ndarray, cfg: AtlasConfig) -> np.ndarray:
    corr = cfg.size_z_corr
    w = corr * z + np.sqrt(1.0 - corr * corr) * rng.standard_normal(z.size)
    return np.clip(np.rint(cfg.size_median * np.exp(cfg.size_sigma * w)), cfg.min_size, cfg.max_size).astype(np.int64)


def _atlas_cells(rng: np.random.Generator, n_cells: int, cfg: AtlasConfig) -> dict[str, np.ndarray]:
    """The per-cell design: z, N, state, the latent line, the x support and the rare rate."""
    from scipy.special import expit, logit  # data=atlas only

    z = rng.standard_normal(n_cells)
    n = _atlas_sizes(rng, z, cfg)
    state = rng.integers(0, cfg.n_states, n_cells)
    a_lat = cfg.intercept + cfg.z_effect * z + cfg.cell_sd * rng.standard_normal(n_cells)
    b_lat = rng.uniform(0.1, 0.5, n_cells)
    pr = rng.uniform(0.3, 0.75, n_cells)  # x spread within a cell, about as in the Figure-2 design
    st = (1.0 - pr) * rng.random(n_cells)
    p_rare = expit(logit(cfg.rare_rate) + cfg.rare_z_effect * z)
    return {"n": n, "state": state, "z": z, "st": st, "pr": pr, "a_latent": a_lat, "b_latent": b_lat,
            "p_rare": p_rare}


def _atlas_rows(rng: np.random.Generator, c: dict[str, np.ndarray], noise_sd: float) -> pd.DataFrame:
    codes = np.repeat(np.arange(c["n"].size), c["n"])
    x = c["st"][codes] + c["pr"][codes] * rng.random(codes.size)
    y = np.clip(
        c["a_latent"][codes] + c["b_latent"][codes] * x + noise_sd * rng.standard_normal(codes.size), 0.0, 1.0
    )
    y_rare = (rng.random(codes.size) < c["p_rare"][codes]).astype(np.int8)
    return pd.DataFrame({"cell": codes, "state": c["state"][codes], "x": x, "y": y, "y_rare": y_rare})


def simulate_atlas(
    *, seed: int, n_cells: int = 2000, config: AtlasConfig = AtlasConfig()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Atlas-like cells with skewed sizes, a cell covariate and a rare outcome (``config``:
    :class:`AtlasConfig`).

    Per cell g: z_g ~ N(0, 1); N_g = clip(round(size_median exp(size_sigma w_g)), min_size,
    max_size) with w_g = size_z_corr z_g + sqrt(1 - size_z_corr^2) N(0, 1) (lognormal: with the
    defaults about 44% of cells have N < 20 and about 5% N <= 2); state_g uniform on
    0..n_states-1; latent line a_g + b_g x with a_g = intercept + z_effect z_g + cell_sd N(0, 1)
    and b_g ~ U(0.1, 0.5); x ~ U(st_g, st_g + pr_g), pr_g ~ U(0.3, 0.75), st_g ~ U(0, 1 - pr_g).
    Per row: y = clip(a_g + b_g x + noise_sd N(0, 1), 0, 1); y_rare ~ Bernoulli(p_g),
    p_g = expit(logit(rare_rate) + rare_z_effect z_g).

    Returns:
        rows: ``cell, state, x, y, y_rare`` (rows sorted by cell; every cell has >= min_size rows:
        with min_size=0 some cells have none, and still appear in ``truth``).
        truth: per cell ``cell, n, state, z, st, pr, a_latent, b_latent, p_rare`` and
        ``p25, p75, slope`` (population OLS projection of the clipped y on x; module docstring)
        and ``p25_latent, p75_latent, slope_latent``. The downstream truth: the slope of p25 on
        z across cells is about 0.08 (z_effect, slightly attenuated by clipping).
    """
    cfg = config
    if n_cells < 2 or not (-1.0 < cfg.size_z_corr < 1.0) or not (0 <= cfg.min_size <= cfg.max_size):
        raise ValueError(
            f"simulate_atlas: need n_cells >= 2, -1 < size_z_corr < 1, 0 <= min_size <= "
            f"max_size; got {n_cells}, {cfg.size_z_corr}, {cfg.min_size}, {cfg.max_size}"
        )
    rng = np.random.default_rng([int(seed), 22])
    c = _atlas_cells(rng, n_cells, cfg)
    rows = _atlas_rows(rng, c, cfg.noise_sd)
    a_lat, b_lat = c["a_latent"], c["b_latent"]
    a, b = projection_line(
        c["st"], c["st"] + c["pr"], lambda xs: clipped_mean(a_lat[:, None] + b_lat[:, None] * xs, cfg.noise_sd)
    )
    truth = pd.DataFrame({"cell": np.arange(n_cells), **c, **_truth_frame(a, b, a_lat, b_lat)})
    return rows, truth


DESIGN_COLUMNS: tuple[str, ...] = ("cell", "state")


def design_cells(truth: pd.DataFrame) -> pd.DataFrame:
    """The simulator's PUBLIC cell design: one row per simulated cell (including cells that drew
    0 rows), with the design columns it has (``cell``, and ``state`` for :func:`simulate_atlas`).
    A release on simulated data lists exactly these cells."""
    cols = [c for c in DESIGN_COLUMNS if c in truth.columns]
    return truth[cols].reset_index(drop=True).copy()


def simulate_rows_fast(
    *, n_rows: int, n_cells: int, seed: int, size_sigma: float = 1.2, chunk: int = 1 << 21
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, codes) for benchmarks: n_rows rows in n_cells cells, memory-lean.

    Cell sizes are lognormal weights (sigma ``size_sigma``) scaled to sum to n_rows, each >= 1.
    Per cell: x ~ U(st, st + pr), y = clip(a + b x + 0.18 N(0, 1), 0, 1) with a ~ U(0.1, 0.5),
    b ~ U(0, 0.5). Rows are sorted by cell. x and y are float64 and codes int32 (n_cells < 2^31),
    filled ``chunk`` rows at a time (no full-length temporaries beyond the outputs): about
    20 bytes per row. Deterministic given (seed, chunk).
    """
    if n_cells < 1 or n_rows < n_cells or n_cells >= 2**31:
        raise ValueError(
            f"simulate_rows_fast: need 1 <= n_cells <= n_rows and n_cells < 2^31, "
            f"got n_rows={n_rows}, n_cells={n_cells}"
        )
    rng = np.random.default_rng([int(seed), 23])
    w = rng.lognormal(0.0, size_sigma, n_cells)
    sizes = np.floor(w / w.sum() * (n_rows - n_cells)).astype(np.int64) + 1
    short = n_rows - int(sizes.sum())  # 0 <= short < n_cells
    sizes[rng.choice(n_cells, size=short, replace=False)] += 1
    codes = np.repeat(np.arange(n_cells, dtype=np.int32), sizes)
    pr = rng.uniform(0.3, 0.75, n_cells)  # x spread within a cell, about as in the Figure-2 design
    st = (1.0 - pr) * rng.random(n_cells)
    a, b = rng.uniform(0.1, 0.5, n_cells), rng.uniform(0.0, 0.5, n_cells)
    x = np.empty(n_rows, dtype=np.float64)
    y = np.empty(n_rows, dtype=np.float64)
    for i in range(0, n_rows, chunk):
        c = codes[i : i + chunk]
        xs, ys = x[i : i + chunk], y[i : i + chunk]
        rng.random(out=xs)
        xs *= pr[c]
        xs += st[c]
        rng.standard_normal(out=ys)
        ys *= 0.18
        ys += a[c] + b[c] * xs
        np.clip(ys, 0.0, 1.0, out=ys)
    return x, y, codes
