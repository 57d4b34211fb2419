"""DP full-batch gradient descent on the cell's line (``release.method=dp_gd``; Alabi et al. 2022,
section 2.3, DPGradDescent). (epsilon, delta)-DP, add/remove (docs/release.md section 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dptrain.neighbours import Neighbours
from dptrain.privacy.accounting import rdp_epsilon
from dptrain.release.cells import Cells
from dptrain.release.methods.base import RELEASE_METHODS, MethodResult, ReleaseMethod
from dptrain.release.methods.common import (
    ALABI,
    BOX_A,
    BOX_B,
    NO_INTERVAL,
    calibrate_sigma,
    check_delta,
    check_epsilon,
    check_fraction,
    check_int,
    check_statistic,
    method_meta,
    noisy_count,
    reasons,
    result_frame,
    theta_from_unit,
    unit_rows,
)
from dptrain.release.noise import add_noise, grid_step

if TYPE_CHECKING:
    from dptrain.release.api import CellEstimates
    from dptrain.release.settings import ReleaseConfig


INTERVAL = (
    "none: ci_low / ci_high are NaN; theta is the mean of projected iterates of clipped noisy gradient steps; "
    "its noise, and the clipping and non-convergence bias, depend on the private x spread and residuals (not "
    "released), so no interval from released quantities is valid; a parametric bootstrap on synthetic cells "
    "would need the private x distribution and residual SD, or extra epsilon; not built")


@dataclass(frozen=True)
class DPGDConfig:
    """``iterations`` T full-batch steps of size ``lr``; per-example clipping norm
    ``max_grad_norm`` C; ``count_fraction`` of epsilon spent on the noisy count."""

    iterations: int = 100
    lr: float = 0.5
    max_grad_norm: float = 1.0
    count_fraction: float = 0.1


def _gaussian_sum(sums: np.ndarray, *, sigma: float, clip: float, rng: np.random.Generator) -> np.ndarray:
    """sums + N(0, sigma^2 C'^2) per element (rounded Gaussian on the 2^-20 grid, noise.py), with
    C' = C + sqrt(2) gamma: the L2 sensitivity of a 2-vector of sums snapped to grid gamma."""
    gamma = float(grid_step(sigma * clip / math.sqrt(2.0)))
    t = sigma * (clip + math.sqrt(2.0) * gamma) / math.sqrt(2.0)  # noise.py "normal": variance 2 t^2
    return add_noise(sums, t, kind="normal", rng=rng, step=gamma)


def _descend(cells: Cells, denom: np.ndarray, *, sigma: float, rng: np.random.Generator,
             config: DPGDConfig) -> np.ndarray:
    """The (a, b) per cell: T noisy clipped full-batch steps, projected; the mean of the second half."""
    T, lr, C = config.iterations, config.lr, config.max_grad_norm
    u, t = unit_rows(cells)
    codes, G = cells.codes, cells.n_cells
    W = np.tile([0.5, 0.0], (G, 1))
    acc = np.zeros_like(W)
    tail = range(T // 2, T)
    for it in range(T):
        r = W[codes, 0] + W[codes, 1] * u - t
        rc = r * np.minimum(1.0, C / (np.abs(r) * np.sqrt(1.0 + u * u) + 1e-6))
        sums = np.stack([np.bincount(codes, rc, G), np.bincount(codes, rc * u, G)], axis=1)
        W = W - lr * _gaussian_sum(sums, sigma=sigma, clip=C, rng=rng) / denom
        W[:, 0] = np.clip(W[:, 0], *BOX_A)
        W[:, 1] = np.clip(W[:, 1], *BOX_B)
        if it in tail:
            acc += W
    return acc / len(tail)


def dp_gradient_descent(cells: Cells, *, statistic: str, epsilon: float, delta: float, rng: np.random.Generator,
                        config: DPGDConfig = DPGDConfig()) -> tuple[pd.DataFrame, dict]:
    """DP full-batch gradient descent on OLS (Alabi et al. 2022, section 2.3). (epsilon, delta)-DP,
    add/remove. Vectorised over cells (grouped sums per step).

    On the unit square with x centred (u in [-1/2, 1/2]), per cell: the line t = a + b u from
    (a, b) = (1/2, 0); per step the per-example gradients r_i (1, u_i) of (a + b u_i - t_i)^2 / 2 are
    clipped to L2 norm C, summed, plus N(0, sigma^2 C^2 I); divided by a noisy count n~; a step
    of size ``lr``, then projection onto a in [-0.5, 1.5], b in [-4, 4]; the estimate is the
    mean of the iterates of the second half. Budget: ``count_fraction`` epsilon to n~ (Laplace,
    pure), the rest to the T Gaussian steps: sigma = calibrate_noise_multiplier(q=1, steps=T) by
    RDP; total (epsilon, delta) by basic composition. Not released if n~ < 3.
    """
    check_statistic(statistic)
    eps, delta = check_epsilon(epsilon), check_delta(delta)
    T = check_int(config.iterations, "release.iterations")
    frac = check_fraction(config.count_fraction, "release.count_fraction")
    C = check_epsilon(config.max_grad_norm, "release.max_grad_norm")
    config = DPGDConfig(iterations=T, lr=config.lr, max_grad_norm=C, count_fraction=frac)
    eps_n, eps_g = frac * eps, (1.0 - frac) * eps
    sigma = calibrate_sigma(eps_g, q=1.0, steps=T, delta=delta)
    n_noisy = noisy_count(cells, eps_n, rng)
    W = _descend(cells, np.maximum(n_noisy, 1.0)[:, None], sigma=sigma, rng=rng, config=config)
    theta = theta_from_unit(W[:, 0], W[:, 1], cells, statistic)
    reason = reasons(cells.n_cells, [(n_noisy < 3, "noisy n < 3")])
    eps_used = rdp_epsilon(sample_rate=1.0, noise_multiplier=sigma, steps=T, delta=delta)
    return result_frame(reason, theta, np.nan, ci=NO_INTERVAL), method_meta(
        "dp_gradient_descent", statistic, "add_remove", eps, delta,
        split=f"{frac:g} epsilon to a Laplace noisy count, {1 - frac:g} epsilon to {T} Gaussian steps (RDP)",
        guarantee="(epsilon, delta)-DP, add/remove (basic composition of the count and the RDP-accounted steps)",
        reference=ALABI + ", section 2.3 (DPGradDescent); accounting: dptrain.privacy.accounting (RDP)",
        noise_multiplier=sigma, gradient_noise_sd=sigma * C, max_grad_norm=C, iterations=T, lr=config.lr,
        epsilon_count=eps_n, epsilon_gradient=eps_used,
        caveats=["noise_sd is NaN: the noise in theta has no closed form",
                 "convergence in the slope direction is slow when x has little spread (lr, iterations)"],
        interval=INTERVAL)


class DPGradientDescent(ReleaseMethod):
    """DP-GD at ``release.delta`` with the defaults of :class:`DPGDConfig`."""

    neighbours = Neighbours.ADD_REMOVE

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseConfig) -> MethodResult:
        return MethodResult(*dp_gradient_descent(est.cells, statistic=config.statistic, epsilon=epsilon,
                                                 delta=config.delta, rng=rng))


RELEASE_METHODS.register("dp_gd", DPGradientDescent())
