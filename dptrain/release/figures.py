"""Figures of the release study (Chetty & Friedman 2019, Figures 1-3, plus error and tail plots).

Each function draws one figure with matplotlib's object-oriented API on the Agg canvas (no
pyplot, no global backend switch, no display needed), writes one PNG to ``path`` (parent
folders created) and returns the path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dptrain.release.cells import Domain, ReleaseError, ols_line

if TYPE_CHECKING:  # annotations only; matplotlib is imported where a figure is made (_figure)
    from matplotlib.figure import Figure

__all__ = [
    "change_grid",
    "plot_downstream_slopes",
    "plot_error_vs_n",
    "plot_local_sensitivity_cell",
    "plot_ls_vs_n",
    "plot_tail_vs_epsilon",
    "refit_statistic",
]

_UNIT_SQUARE = Domain()


def _figure(**kwargs) -> Figure:
    """A matplotlib Figure on no display. matplotlib (~0.5 s to import) is imported here, the
    one boundary where figures begin: a release run without its private evaluation never needs it."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _save(fig: Figure, path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(p, dpi=110)
    return p


def _ols_stat(n, sx, sy, sxx, sxy, statistic: str, x0: float):
    """OLS statistic from (broadcastable) sufficient sums (``cells.ols_line``): an exact refit of
    the cell with one point added, not a linearisation."""
    a, b = ols_line(n, sx, sy, sxx, sxy)
    return b if statistic == "slope" else a + b * x0


def refit_statistic(
    x: np.ndarray,
    y: np.ndarray,
    xs: np.ndarray,
    ys: np.ndarray,
    *,
    statistic: str | Callable[[np.ndarray, np.ndarray], float],
    domain: Domain,
) -> np.ndarray:
    """theta of the cell with one point (xs, ys) added, for every pair of the broadcast grid.

    ``statistic`` is ``"p25"``, ``"p75"``, ``"slope"`` (OLS refit from the updated sums) or a
    callable f(x, y) -> float, refitted point by point on the augmented data."""
    xs, ys = np.broadcast_arrays(np.asarray(xs, float), np.asarray(ys, float))
    if callable(statistic):
        return np.vectorize(lambda a, b: statistic(np.append(x, a), np.append(y, b)))(xs, ys)
    if statistic not in ("p25", "p75", "slope"):
        raise ReleaseError(
            f"statistic={statistic!r} is not allowed: p25, p75, slope, or a callable f(x, y)"
        )
    x0 = 0.0 if statistic == "slope" else domain.x0(statistic)
    return _ols_stat(
        x.size + 1,
        x.sum() + xs,
        y.sum() + ys,
        (x * x).sum() + xs * xs,
        (x * y).sum() + xs * ys,
        statistic,
        x0,
    )


def change_grid(
    x: np.ndarray, y: np.ndarray, *, statistic, domain: Domain = _UNIT_SQUARE, grid: int = 81
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Change of the statistic when adding one point, by direct refit on the augmented cell.

    Returns (gx, gy, delta, ends): grid axes over the domain, delta[i, j] for the point
    (gx[j], gy[i]), and ends[k, j] for (gx[j], y* = y_lo if k == 0 else y_hi)."""
    if not callable(statistic) and statistic not in ("p25", "p75", "slope"):
        raise ReleaseError(
            f"statistic={statistic!r} is not allowed: p25, p75, slope, or a callable f(x, y)"
        )
    if x.size < 3:
        raise ReleaseError(f"the cell has {x.size} points; allowed: >= 3 for an OLS refit")
    if callable(statistic):
        base = float(statistic(x, y))
    else:
        x0 = 0.0 if statistic == "slope" else domain.x0(statistic)
        sums = (x.sum(), y.sum(), (x * x).sum(), (x * y).sum())
        base = float(_ols_stat(x.size, *sums, statistic, x0))
    gx = np.linspace(domain.x_lo, domain.x_hi, grid)
    gy = np.linspace(domain.y_lo, domain.y_hi, grid)
    def refit(ys):
        return refit_statistic(x, y, gx[None, :], ys, statistic=statistic, domain=domain)

    return gx, gy, refit(gy[:, None]) - base, refit(np.array([[domain.y_lo], [domain.y_hi]])) - base


def plot_local_sensitivity_cell(
    x: np.ndarray,
    y: np.ndarray,
    *,
    statistic,
    domain: Domain = _UNIT_SQUARE,
    path: str | Path,
    grid: int = 81,
) -> Path:
    """The paper's Figure 1 for one cell: the change of the statistic when one point (x*, y*) is
    added, over a grid of the domain (left: heatmap with the cell's points and fitted line; right:
    the change along x* at y* = the domain's ends, where the supremum over y* lies for OLS).

    ``statistic``: "p25", "p75", "slope" or a callable f(x, y) -> float (refitted per point)."""
    x = np.clip(np.asarray(x, float), domain.x_lo, domain.x_hi)
    y = np.clip(np.asarray(y, float), domain.y_lo, domain.y_hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        gx, _, delta, ends = change_grid(x, y, statistic=statistic, domain=domain, grid=grid)
    # a cell whose x has no spread inside the domain (e.g. every x clipped onto its edge) has no
    # OLS line: the figure says so instead of failing on an all-NaN grid
    defined = bool(np.isfinite(delta).any())
    b, a = np.polyfit(x, y, 1) if np.ptp(x) > 0 else (np.nan, np.nan)
    name = statistic if isinstance(statistic, str) else getattr(statistic, "__name__", "statistic")
    fig = _figure(figsize=(11, 4.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    lim = float(np.nanmax(np.abs(delta))) if defined else 1.0
    im = ax1.imshow(
        delta,
        origin="lower",
        aspect="auto",
        cmap="RdBu_r",
        vmin=-lim,
        vmax=lim,
        extent=(domain.x_lo, domain.x_hi, domain.y_lo, domain.y_hi),
    )
    fig.colorbar(im, ax=ax1, label=f"change in {name} when adding (x*, y*)")
    ax1.scatter(x, y, s=10, c="k", alpha=0.6, label=f"cell (N={x.size})")
    ax1.plot(gx, a + b * gx, "k-", lw=1.5, label="OLS fit")
    ax1.set(xlabel="x*", ylabel="y*", title=f"Adding one point: change in {name}")
    ax1.legend(loc="upper left", fontsize=8)
    for row, lab in zip(ends, (f"y* = {domain.y_lo:g}", f"y* = {domain.y_hi:g}")):
        ax2.plot(gx, row, label=lab)
    ax2.axhline(0, color="grey", lw=0.8)
    if np.isfinite(ends).any():
        k = np.unravel_index(np.nanargmax(np.abs(ends)), ends.shape)
        ax2.plot(gx[k[1]], ends[k], "ro", label=f"max |change| on grid = {abs(ends[k]):.3g}")
    else:
        ax2.text(0.5, 0.5, f"{name} is undefined for this cell\n(x has no spread inside the domain)",
                 ha="center", va="center", transform=ax2.transAxes)
    ax2.set(xlabel="x*", ylabel=f"change in {name}", title="At the ends of the y domain")
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=8)
    return _save(fig, path)


def plot_ls_vs_n(n: np.ndarray, ls: np.ndarray, chi: float, *, path: str | Path) -> Path:
    """The paper's Figure 2: LS_g against N_g with the envelope chi / N (left, log-log) and
    N_g LS_g against N_g with the horizontal line chi (right). Cells with infinite LS are left
    out (their count is in the title); when no cell has a finite LS the axes say so."""
    n, ls = np.asarray(n, float), np.asarray(ls, float)
    ok = np.isfinite(ls) & (n > 0)
    fig = _figure(figsize=(11, 4.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.set(xlabel="N", ylabel="local sensitivity LS",
            title=f"LS against N ({int((~ok).sum())} cells with infinite LS not shown)")
    ax2.set(xlabel="N", ylabel="N x LS", title="N x LS against N")
    if not ok.any():
        for ax in (ax1, ax2):
            ax.text(0.5, 0.5, "no cell has a finite local sensitivity\n(no cell can be released)", ha="center",
                    va="center", transform=ax.transAxes)
        return _save(fig, path)
    grid = np.geomspace(max(n[ok].min(), 1.0), n[ok].max(), 200)
    ax1.scatter(n[ok], ls[ok], s=6, alpha=0.5, label="cells")
    ax2.scatter(n[ok], n[ok] * ls[ok], s=6, alpha=0.5, label="cells")
    if np.isfinite(chi):
        ax1.plot(grid, chi / grid, "r-", label=f"chi / N (chi = {chi:.3g})")
        ax2.axhline(chi, color="r", label=f"chi = max N LS = {chi:.3g}")
    ax1.set(xscale="log", yscale="log")
    ax2.set(xscale="log")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    return _save(fig, path)


def plot_error_vs_n(
    errors: Mapping[str, tuple[np.ndarray, np.ndarray]], *, path: str | Path, n_bins: int = 15
) -> Path:
    """Mean |error| in log-spaced bins of N, one line per method (log x axis).

    ``errors`` maps a method to (n, abs_error) per cell; non-finite errors (unreleased) are left
    out of the means."""
    finite_n = np.concatenate([np.asarray(v[0], float) for v in errors.values()] or [np.ones(1)])
    finite_n = finite_n[finite_n > 0]
    edges = (
        np.geomspace(finite_n.min(), finite_n.max() * 1.0001, n_bins + 1)
        if finite_n.size
        else np.array([1.0, 2.0])
    )
    fig = _figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    ax.set_xlim(edges[0], edges[-1])  # explicit limits: a log axis with no finite point (nothing released) fails
    for name, (n, err) in errors.items():
        n, err = np.asarray(n, float), np.abs(np.asarray(err, float))
        ok = np.isfinite(err) & (n > 0)
        k = np.clip(np.digitize(n[ok], edges) - 1, 0, n_bins - 1)
        cnt = np.bincount(k, minlength=n_bins)
        mean = np.bincount(k, err[ok], minlength=n_bins) / np.maximum(cnt, 1)
        mid = np.sqrt(edges[:-1] * edges[1:])
        ax.plot(mid[cnt > 0], mean[cnt > 0], "o-", ms=3, label=name)
    ax.set(
        xscale="log",
        xlabel="cell size N",
        ylabel="mean |error| (binned)",
        title="Error against cell size",
    )
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_downstream_slopes(
    slopes: Mapping[str, float], truth_slope: float, *, path: str | Path
) -> Path:
    """The point of the paper's Figure 3: the slope of released estimates on a cell covariate,
    one bar per method (e.g. suppression vs noise infusion), with the true slope as a line."""
    fig = _figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    names = list(slopes)
    ax.bar(range(len(names)), [slopes[k] for k in names], color="tab:blue", alpha=0.8)
    ax.axhline(truth_slope, color="r", ls="--", label=f"true slope = {truth_slope:.3g}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set(ylabel="slope of released estimate on covariate", title="Downstream slopes")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_tail_vs_epsilon(
    eps: Sequence[float], shares: Mapping[str, Sequence[float]], *, path: str | Path
) -> Path:
    """Tail classification share (true top quintile released in the top quintile) against
    epsilon, one line per method (log x axis)."""
    fig = _figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, s in shares.items():
        if len(s) != len(eps):
            raise ReleaseError(
                f"plot_tail_vs_epsilon: shares[{name!r}] has {len(s)} values but eps has {len(eps)}"
            )
        ax.plot(eps, s, "o-", label=name)
    ax.axhline(0.2, color="grey", ls=":", label="chance (0.2)")
    if len(eps) and min(eps) > 0:  # explicit limits: a log axis with no finite point (nothing released) fails
        ax.set_xlim(min(eps) / 1.5, max(eps) * 1.5)
    if not any(np.isfinite(np.asarray(s, float)).any() for s in shares.values()):
        ax.text(0.5, 0.5, "no method classified any cell\n(no cell was released)", ha="center", va="center",
                transform=ax.transAxes)
    ax.set(
        xscale="log",
        ylim=(0, 1.02),
        xlabel="epsilon",
        ylabel="share of true top quintile classified",
        title="Tail classification against epsilon",
    )
    ax.legend(fontsize=8)
    return _save(fig, path)
