"""The figures of a release run's PRIVATE evaluation (PNG files under <run>/private/evaluation/): they
show exact private values (a real cell's raw rows, each cell's N, errors against exact estimates)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from dptrain.release import figures
from dptrain.release.cells import Cells
from dptrain.release.evaluate import evaluate_release
from dptrain.release.methods.base import MethodResult
from dptrain.release.methods.mos import mos_sensitivities
from dptrain.release.prepared import ReleaseRun

log = logging.getLogger(__name__)


def example_cell(cells: Cells, ls: np.ndarray) -> int | None:
    """A small cell with a finite LS (size closest to 15) for the Figure-1 style plot; failing
    that, a cell with at least 3 rows (its figure says the statistic is undefined); None when no
    cell has 3 rows (the least an OLS refit needs)."""
    for ok in (np.isfinite(ls) & (cells.n >= 5), np.isfinite(ls) & (cells.n >= 3), cells.n >= 3):
        idx = np.flatnonzero(ok)
        if idx.size:
            return int(idx[np.argmin(np.abs(cells.n[idx] - 15))])
    return None


def _downstream(frames: dict[str, pd.DataFrame], common: dict) -> tuple[dict[str, float], float]:
    slopes, truth_slope = {}, float("nan")
    for name, frame in frames.items():
        row = evaluate_release(released=frame, **common).query("band == 'all'").iloc[0]
        slopes[name], truth_slope = float(row["slope_released"]), float(row["slope_truth"])
    return slopes, truth_slope


def write_figures(out_dir: Path, *, run: ReleaseRun, reference: MethodResult, frames: dict[str, pd.DataFrame],
                  common: dict, tail_fn: Callable[[float], dict[str, float]]) -> list[Path]:
    """fig1_local_sensitivity.png and fig2_ls_vs_n.png (the ``reference`` MOS release's LS and chi),
    error_vs_n.png, downstream_slopes.png (when a cell covariate is known), tail_vs_epsilon.png."""
    r = run.spec
    cells = run.est.cells
    sens = mos_sensitivities(run.est, r)[0]
    out = []
    g = example_cell(cells, sens.ls)
    if g is not None:
        rows = cells.codes == g
        out.append(figures.plot_local_sensitivity_cell(cells.x[rows], cells.y[rows], statistic=r.statistic,
                                                       domain=cells.domain,
                                                       path=out_dir / "fig1_local_sensitivity.png"))
    chi_values = reference.detail.chi_table["chi"].to_numpy(dtype=float) if len(reference.detail.chi_table) else []
    chi_max = float(np.nanmax(chi_values)) if np.isfinite(chi_values).any() else float("nan")
    out.append(figures.plot_ls_vs_n(cells.n, sens.ls, chi_max, path=out_dir / "fig2_ls_vs_n.png"))
    ref = common["truth"] if common["truth"] is not None else common["ols_theta"]
    errors = {name: (cells.n, frame["theta_released"].to_numpy() - ref) for name, frame in frames.items()}
    out.append(figures.plot_error_vs_n(errors, path=out_dir / "error_vs_n.png"))
    if common["covariate"] is not None:
        slopes, truth_slope = _downstream(frames, common)
        out.append(figures.plot_downstream_slopes(slopes, truth_slope, path=out_dir / "downstream_slopes.png"))
    eps = list(r.tail_epsilons)
    per_eps = [tail_fn(e) for e in eps]
    shares = {name: [d[name] for d in per_eps] for name in per_eps[0]} if per_eps else {}
    out.append(figures.plot_tail_vs_epsilon(eps, shares, path=out_dir / "tail_vs_epsilon.png"))
    log.info("figures: %s", ", ".join(p.name for p in out))
    return out
