"""NoisyStats (``release.method=noisy_stats``; Alabi et al. 2022, section 2.1): noisy covariance,
variance and intercept. Pure epsilon-DP, replace-one within a cell (docs/release.md section 5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dptrain.neighbours import Neighbours
from dptrain.release.cells import Cells
from dptrain.release.methods.base import RELEASE_METHODS, MethodResult, ReleaseMethod
from dptrain.release.methods.common import (
    ALABI,
    check_epsilon,
    check_statistic,
    method_meta,
    reasons,
    result_frame,
    widths,
)
from dptrain.release.noise import add_noise, calibrate

if TYPE_CHECKING:
    from dptrain.release.api import CellEstimates
    from dptrain.release.settings import ReleaseConfig


def _noisy_moments(cells: Cells, eps: float, rng: np.random.Generator) -> tuple:
    """NoisyStats' first two draws: ncov + Lap(3 (1 - 1/n) wx wy / eps), nvar + Lap(3 (1 - 1/n) wx^2 / eps)
    (grid-snapped); returns (ncov~, nvar~, (t_ncov, t_nvar), (xbar, ybar))."""
    wx, wy = widths(cells)
    n = cells.n
    with np.errstate(divide="ignore", invalid="ignore"):
        xbar, ybar = cells.sx / n, cells.sy / n
        nvar = np.maximum(cells.sxx - n * xbar * xbar, 0.0)
        ncov = cells.sxy - n * xbar * ybar
    with np.errstate(divide="ignore"):
        dl = np.maximum(1.0 - 1.0 / n, 0.0)  # n = 0 (a declared cell without rows): -inf -> 0, no noise needed
    t1, g1 = calibrate(dl * wx * wy, eps / 3.0)
    t2, g2 = calibrate(dl * wx * wx, eps / 3.0)
    ncov_n = add_noise(ncov, t1, kind="laplace", rng=rng, step=g1)
    nvar_n = add_noise(nvar, t2, kind="laplace", rng=rng, step=g2)
    return ncov_n, nvar_n, (t1, t2), (xbar, ybar)


def _noisy_intercept(alpha: np.ndarray, xbar: np.ndarray, ybar: np.ndarray, n: np.ndarray,
                     domain_widths: tuple[float, float], eps3: float, rng: np.random.Generator) -> np.ndarray:
    """(ybar - alpha~ xbar) + Lap(3 Delta3 / eps) = Lap(Delta3 / eps3), Delta3 = (wy + |alpha~| wx) / n
    with ``domain_widths`` = (wx, wy); NaN where alpha~ is NaN."""
    wx, wy = domain_widths
    ok = np.isfinite(alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        d3 = np.where(ok, (wy + np.abs(alpha) * wx) / n, 0.0)
        t3, g3 = calibrate(d3, eps3)
        return np.where(ok, add_noise(ybar - alpha * xbar, t3, kind="laplace", rng=rng, step=g3), np.nan)


def noisy_stats(cells: Cells, *, statistic: str, epsilon: float,
                rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    """NoisyStats (Alabi et al. 2022, section 2.1, Algorithm NoisyStats). Replace-one, n public.

    Our reading, on a domain of widths wx, wy (the paper's unit square: wx = wy = 1):
    Delta = (1 - 1/n) (replace-one sensitivity of ncov = sum (x - xbar)(y - ybar) and of
    nvar = sum (x - xbar)^2 on [0, 1]^2; rescaled by wx wy and wx^2);
    ncov~ = ncov + Lap(3 Delta wx wy / eps), nvar~ = nvar + Lap(3 Delta wx^2 / eps);
    if nvar~ <= 0: nothing is released ("noisy variance <= 0"); else alpha~ = ncov~ / nvar~ and
    the intercept beta~ = (ybar - alpha~ xbar) + Lap(3 Delta3 / eps) with
    Delta3 = (wy + |alpha~| wx) / n (alpha~ is already private: adaptive composition);
    p25/p75 = beta~ + alpha~ x0, slope = alpha~. Each of the three gets epsilon/3; a slope release
    does not draw the intercept and so spends only 2 epsilon / 3 (meta ``epsilon_spent``).
    noise_sd: slope only, delta method at (alpha~, nvar~); NaN for p25/p75 (needs private xbar).
    """
    check_statistic(statistic)
    eps = check_epsilon(epsilon)
    n = cells.n
    ncov_n, nvar_n, (t1, t2), (xbar, ybar) = _noisy_moments(cells, eps, rng)
    ok = nvar_n > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.where(ok, ncov_n / nvar_n, np.nan)
        if statistic == "slope":
            theta = alpha
            sd = np.sqrt(2.0 * t1**2 + alpha**2 * 2.0 * t2**2) / nvar_n
        else:
            beta = _noisy_intercept(alpha, xbar, ybar, n, widths(cells), eps / 3.0, rng)
            theta = beta + alpha * cells.domain.x0(statistic)
            sd = np.nan
    reason = reasons(cells.n_cells, [(n < 2, "N < 2"), (~ok, "noisy variance <= 0")])
    return result_frame(reason, theta, sd), method_meta(
        "noisy_stats", statistic, "replace_one", eps, 0.0,
        split="epsilon/3 each to ncov, nvar and the intercept",
        guarantee="epsilon-DP (pure), replace-one within a cell (each cell's N treated as public)",
        reference=ALABI + ", section 2.1",
        epsilon_spent=2 * eps / 3 if statistic == "slope" else eps,
        laplace_scale_note="ncov: 3 (1 - 1/n) wx wy / eps; nvar: 3 (1 - 1/n) wx^2 / eps; "
                           "intercept: 3 (wy + |alpha~| wx) / (n eps); each inflated by the 2^-20 grid")


class NoisyStats(ReleaseMethod):
    neighbours = Neighbours.REPLACE_ONE
    tail_figure = True

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseConfig) -> MethodResult:
        return MethodResult(*noisy_stats(est.cells, statistic=config.statistic, epsilon=epsilon, rng=rng))


RELEASE_METHODS.register("noisy_stats", NoisyStats())
