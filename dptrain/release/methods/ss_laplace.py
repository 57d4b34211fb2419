"""Sufficient-statistic perturbation (``release.method=ss_laplace``): Laplace noise on the five
sums of a cell, then OLS on the noisy sums. Pure epsilon-DP, add/remove (docs/release.md section 5).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours
from dptrain.release.cells import Cells
from dptrain.release.methods.base import RELEASE_METHODS, CellFunction
from dptrain.release.methods.common import (
    bootstrap_interval,
    check_epsilon,
    check_statistic,
    method_meta,
    reasons,
    result_frame,
    sampling_sd,
    sigma_bound,
)
from dptrain.release.noise import add_noise, calibrate


def _ols_and_gradient(s: dict[str, np.ndarray], x0: float | None) -> tuple[np.ndarray, np.ndarray, list]:
    """theta from sums (n, sx, sy, sxx, sxy), Sxx, and d theta / d sum for each sum (delta method).

    Not ``cells.ols``: the sums are NOISY (n may be < 3 or Sxx <= 0, which decide release here),
    and the gradient gives the delta-method SD of theta's noise."""
    n, sx, sy, sxx, sxy = (s[key] for key in ("n", "sx", "sy", "sxx", "sxy"))
    with np.errstate(divide="ignore", invalid="ignore"):
        Sxx = sxx - sx * sx / n
        b = (sxy - sx * sy / n) / Sxx
        db = [(sx * sy / n**2 - b * sx * sx / n**2) / Sxx,  # d/dn
              (2 * b * sx - sy) / (n * Sxx), -sx / (n * Sxx), -b / Sxx, 1.0 / Sxx]  # sx, sy, sxx, sxy
        if x0 is None:
            return b, Sxx, db
        d = x0 - sx / n
        theta = sy / n + b * d
        grad = [-sy / n**2 + db[0] * d + b * sx / n**2, db[1] * d - b / n, 1.0 / n + db[2] * d,
                db[3] * d, db[4] * d]
    return theta, Sxx, grad


def _noisy_sums(cells: Cells, eps: float, rng: np.random.Generator) -> tuple[dict, dict, dict]:
    """(noisy sums, Laplace scales, sensitivities) for n, sx, sy, sxx, sxy at epsilon / 5 each."""
    d = cells.domain
    mx, my = max(abs(d.x_lo), abs(d.x_hi)), max(abs(d.y_lo), abs(d.y_hi))
    sens = {"n": 1.0, "sx": mx, "sy": my, "sxx": mx * mx, "sxy": mx * my}
    noisy, scale = {}, {}
    for key, delta_j in sens.items():
        if key == "n":  # integer grid: no rounding, scale exactly 5 / eps
            scale[key], step = 5.0 / eps, 1.0
        else:
            t, step = calibrate(delta_j, eps / 5.0)
            scale[key] = float(t)
        noisy[key] = add_noise(getattr(cells, key), scale[key], kind="laplace", rng=rng, step=step)
    return noisy, scale, sens


#: parametric-bootstrap draws per cell for the interval
N_BOOT = 400
FAILED = "drop"

INTERVAL = (
    "95% basic parametric bootstrap, a post-processing of the noisy sums only: per cell {b} redraws of "
    "Laplace noise of the published scales (laplace_scales) around the noisy sums, OLS on each, the quantiles "
    "of (theta_b - theta~ + G_b) with G_b ~ N(0, s^2) the sampling error, s = sigma_max sqrt(1/n~ + "
    "(x0 - xbar~)^2 / Sxx~) (slope: sigma_max / sqrt(Sxx~)) from the noisy sums, sigma_max = (y_hi - y_lo) / 2 "
    "the public bound on the residual SD (sigma is not released): CONSERVATIVE where sampling error matters "
    "(large epsilon or N: a typical residual SD on [0, 1] is about 0.2, so s is about 2.5x too large) and "
    "conservative too where noise dominates (the noisy Sxx in a denominator gives heavy, skewed tails); redraws "
    "that would not be released (noisy n < 3 or Sxx <= 0) are left out, as the cell itself was released; "
    "assumes a linear conditional mean; costs no epsilon; the bootstrap draws follow the release draws in rng")


def _interval(noisy: dict, scale: dict, *, x0: float | None, sigma_max: float, rng: np.random.Generator,
              n_boot: int = N_BOOT) -> tuple[np.ndarray, np.ndarray]:
    """(ci_low, ci_high) from the NOISY sums, their public Laplace scales and the public sigma bound
    only (module INTERVAL); the redraws use continuous Laplace noise (the grid is 2^-20 of the scale)."""
    theta, Sxx, _ = _ols_and_gradient(noisy, x0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = None if x0 is None else x0 - noisy["sx"] / noisy["n"]
    s = sampling_sd(sigma_max, noisy["n"], d, Sxx)

    def draw(gen: np.random.Generator, idx: np.ndarray, b: int) -> np.ndarray:
        redraw = {key: noisy[key][idx] + gen.laplace(0.0, scale[key], size=(b, idx.size)) for key in noisy}
        theta_b, sxx_b, _ = _ols_and_gradient(redraw, x0)
        ok = (redraw["n"] >= 3) & (sxx_b > 0)
        return np.where(ok, theta_b - theta[idx], np.nan) + s[idx] * gen.standard_normal((b, idx.size))

    return bootstrap_interval(theta, draw, n_boot=n_boot, rng=rng, failed=FAILED)


def sufficient_stats_laplace(cells: Cells, *, statistic: str, epsilon: float,
                             rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    """Sufficient-statistic perturbation: Laplace noise on (n, sum x, sum y, sum x^2, sum xy), then
    OLS on the noisy sums. Pure epsilon-DP, add/remove neighbours.

    epsilon / 5 per statistic; per-statistic add/remove sensitivity over the domain: n 1,
    sum x max|x|, sum y max|y|, sum x^2 max x^2, sum xy max|x| max|y| (all 1 on the unit square,
    so each gets Laplace(5 / epsilon), total L1 sensitivity 5). The noise is grid-snapped
    (noise.calibrate: scale (Delta + gamma) / (epsilon / 5), gamma ~ 2^-20 of it; n on the integer
    grid, scale exactly 5 / epsilon). Not released if noisy n < 3 or noisy Sxx <= 0.
    noise_sd: delta-method SD of theta's noise, evaluated at the NOISY sums (post-processing).
    ci_low / ci_high: a parametric bootstrap on the noisy sums (``INTERVAL``), drawn from ``rng``
    after the release's draws (the release for a given stream is unchanged); no extra epsilon.
    """
    check_statistic(statistic)
    eps = check_epsilon(epsilon)
    d = cells.domain
    noisy, scale, sens = _noisy_sums(cells, eps, rng)
    x0 = None if statistic == "slope" else d.x0(statistic)
    theta, Sxx, grad = _ols_and_gradient(noisy, x0)
    with np.errstate(invalid="ignore"):
        sd = np.sqrt(sum(g * g * 2.0 * scale[key] ** 2 for g, key in zip(grad, sens)))
    reason = reasons(cells.n_cells, [(noisy["n"] < 3, "noisy n < 3"), (~(Sxx > 0), "noisy Sxx <= 0")])
    ci = _interval(noisy, scale, x0=x0, sigma_max=sigma_bound(cells), rng=rng)
    return result_frame(reason, theta, sd, ci=ci), method_meta(
        "sufficient_stats_laplace", statistic, "add_remove", eps, 0.0,
        split="epsilon/5 to each of n, sum x, sum y, sum x^2, sum xy",
        guarantee="epsilon-DP (pure), add/remove",
        reference="the Laplace mechanism (Dwork, McSherry, Nissim, Smith 2006); docs/release.md section 5",
        sensitivities=sens, laplace_scales=scale,
        noise_sd_note="delta-method approximation at the noisy sums",
        interval=INTERVAL.format(b=N_BOOT), interval_sigma_bound=sigma_bound(cells),
        caveats=[("sensitivities use max |x|, |y| over the domain; a domain not centred at 0 pays for "
                  "its offset (centring would be a different, better baseline)")])


RELEASE_METHODS.register("ss_laplace", CellFunction(sufficient_stats_laplace, neighbours=Neighbours.ADD_REMOVE,
                                                   tail_figure=True))
