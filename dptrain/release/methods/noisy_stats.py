"""NoisyStats (``release.method=noisy_stats``; Alabi et al. 2022, section 2.1): noisy covariance,
variance and intercept. Pure epsilon-DP, replace-one within a cell (docs/release.md section 5).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours
from dptrain.release.cells import Cells
from dptrain.release.methods.base import RELEASE_METHODS, CellFunction
from dptrain.release.methods.common import (
    ALABI,
    bootstrap_interval,
    check_epsilon,
    check_statistic,
    method_meta,
    reasons,
    result_frame,
    sampling_sd,
    sigma_bound,
    widths,
)
from dptrain.release.noise import add_noise, calibrate
from dptrain.release.spec import ReleaseSpec


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


#: parametric-bootstrap draws per cell for the interval
N_BOOT = 400

INTERVAL = (
    "95% basic parametric bootstrap, a post-processing of released quantities only: per cell {b} redraws of "
    "the Laplace noises of the published scales around ncov~ and nvar~ (alpha_b = ncov_b / nvar_b, redraws "
    "with nvar_b <= 0 left out, as the cell itself was released) and, for p25/p75, of the intercept's noise "
    "(scale 3 (wy + |alpha~| wx) / (n eps), public given alpha~), plus a sampling error N(0, s^2), "
    "s = sigma_max sqrt(1/n + d^2 / nvar~) (slope: sigma_max / sqrt(nvar~)), sigma_max = (y_hi - y_lo) / 2 the "
    "public bound on the residual SD (sigma is not released: CONSERVATIVE where sampling error matters, about "
    "2.5x on [0, 1] data with residual SD 0.2); for p25/p75 the error (alpha~ - alpha) d needs d = x0 - xbar, "
    "which is private and not released, so the interval is the union of those at the two extreme d = x0 - x_hi "
    "and x0 - x_lo (worst case over xbar in the domain: conservative again, most when noise dominates); "
    "assumes a linear conditional mean; costs no epsilon; the bootstrap draws follow the release draws in rng")


def _interval(theta: np.ndarray, released: tuple, *, n: np.ndarray, x0: float | None, d_range: tuple[float, float],
              sigma_max: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(ci_low, ci_high) from released or public quantities only (module INTERVAL): theta~ and
    ``released`` = (ncov~, nvar~, the Laplace scales (t_ncov, t_nvar, t_intercept per cell or None
    for the slope)), the public n, x0 and the range of d = x0 - xbar over the domain. Common random
    numbers for both d; N_BOOT draws."""
    ncov_n, nvar_n, (t1, t2, t3) = released
    n_boot = N_BOOT
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = ncov_n / nvar_n
    seed = rng.integers(0, 2**63, size=4)

    def interval_at(d: float | None) -> tuple[np.ndarray, np.ndarray]:
        s = sampling_sd(sigma_max, n, d, nvar_n)

        def draw(gen: np.random.Generator, idx: np.ndarray, b: int) -> np.ndarray:
            shape = (b, idx.size)
            nvar_b = nvar_n[idx] + gen.laplace(0.0, np.broadcast_to(t2, nvar_n.shape)[idx], size=shape)
            ncov_b = ncov_n[idx] + gen.laplace(0.0, np.broadcast_to(t1, ncov_n.shape)[idx], size=shape)
            with np.errstate(divide="ignore", invalid="ignore"):
                err = np.where(nvar_b > 0, ncov_b / nvar_b - alpha[idx], np.nan)
            if d is not None:
                err = err * d + gen.laplace(0.0, np.nan_to_num(t3[idx], posinf=0.0), size=shape)
            return err + s[idx] * gen.standard_normal(shape)

        return bootstrap_interval(theta, draw, n_boot=n_boot, rng=np.random.default_rng(seed), failed="drop")

    if x0 is None:
        return interval_at(None)
    (lo_a, hi_a), (lo_b, hi_b) = interval_at(d_range[0]), interval_at(d_range[1])
    return np.fmin(lo_a, lo_b), np.fmax(hi_a, hi_b)


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
    ci_low / ci_high: a parametric bootstrap on the released noisy moments (``INTERVAL``), drawn from
    ``rng`` after the release's draws (the release for a given stream is unchanged); no extra epsilon.
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
    wx, wy = widths(cells)
    d = cells.domain
    x0 = None if statistic == "slope" else d.x0(statistic)
    with np.errstate(divide="ignore", invalid="ignore"):
        t3 = None if x0 is None else calibrate(np.where(ok, (wy + np.abs(alpha) * wx) / n, 0.0), eps / 3.0)[0]
    ci = _interval(theta, (ncov_n, nvar_n, (t1, t2, t3)), n=n, x0=x0, sigma_max=sigma_bound(cells), rng=rng,
                   d_range=(0.0, 0.0) if x0 is None else (x0 - d.x_hi, x0 - d.x_lo))
    return result_frame(reason, theta, sd, ci=ci), method_meta(
        "noisy_stats", statistic, "replace_one", eps, 0.0,
        split="epsilon/3 each to ncov, nvar and the intercept",
        guarantee="epsilon-DP (pure), replace-one within a cell (each cell's N treated as public)",
        reference=ALABI + ", section 2.1",
        epsilon_spent=2 * eps / 3 if statistic == "slope" else eps,
        laplace_scale_note="ncov: 3 (1 - 1/n) wx wy / eps; nvar: 3 (1 - 1/n) wx^2 / eps; "
                           "intercept: 3 (wy + |alpha~| wx) / (n eps); each inflated by the 2^-20 grid",
        interval=INTERVAL.format(b=N_BOOT), interval_sigma_bound=sigma_bound(cells))


class NoisyStats(CellFunction):
    """NoisyStats: a slope release draws no intercept and so spends 2/3 of its epsilon."""

    def budget(self, epsilon: float, config: ReleaseSpec) -> tuple[float | None, float | None]:
        eps, delta = super().budget(epsilon, config)
        return (2 * eps / 3 if config.statistic == "slope" else eps), delta


RELEASE_METHODS.register("noisy_stats", NoisyStats(noisy_stats, neighbours=Neighbours.REPLACE_ONE, tail_figure=True))
