"""DP full-batch gradient descent on the cell's line (``release.method=dp_gd``; Alabi et al. 2022,
section 2.3, DPGradDescent). (epsilon, delta)-DP, add/remove (docs/release.md section 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours
from dptrain.release.cells import Cells
from dptrain.release.methods._descent import check_run, check_shares, descent_budget, descent_meta, descent_release
from dptrain.release.methods.base import RELEASE_METHODS, CellFunction
from dptrain.release.methods.common import ALABI, BOX_A, BOX_B, check_int, unit_rows
from dptrain.release.noise import add_noise, grid_step

INTERVAL = (
    "theta~ -/+ (1.96 sqrt(noise var + SE_samp^2) + |non-convergence bias|), from the method's DP outputs "
    "(n~, the averaged (a, b) behind theta, the design statistics) and public settings only: "
    "interval_fraction epsilon buys noisy sum u, sum u^2 and Syy per cell (Laplace); with n~ they give the "
    "Hessian of the linearised recursion (clipping and projection inactive), whose closed-form covariance of the "
    "averaged iterates is the noise var and whose deterministic part, at the plug-in optimum, the bias; SE_samp "
    "is the OLS SE with sigma^2 = Syy~ / (n~ - 2); conservative (Syy floored at its noise scale, the widest of "
    "the mean of u at -/+ 0.5 SD and the variance of u at -0.5 SD); NaN where n~ < 4 "
    "(dptrain/release/methods/_gd_interval.py)")


@dataclass(frozen=True)
class DPGDConfig:
    """``iterations`` T full-batch steps of size ``lr``; per-example clipping norm
    ``max_grad_norm`` C; ``count_fraction`` of epsilon spent on the noisy count, ``interval_fraction``
    on the interval's design statistics (0: no interval)."""

    iterations: int = 100
    lr: float = 0.5
    max_grad_norm: float = 1.0
    count_fraction: float = 0.1
    interval_fraction: float = 0.15


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
    pure), ``interval_fraction`` to the interval's design statistics (_gd_interval.py), the rest to
    the T Gaussian steps: sigma = calibrate_noise_multiplier(q=1, steps=T) by
    RDP; total (epsilon, delta) by basic composition. Not released if n~ < 3.
    """
    eps, delta = check_run(statistic, epsilon, delta)
    config = _checked(config)
    T, C = config.iterations, config.max_grad_norm
    budget = descent_budget(eps, delta, (config.count_fraction, config.interval_fraction), q=1.0, steps=T)
    sigma = budget.sigma
    frame = descent_release(
        cells, budget, statistic=statistic, rng=rng,
        fit=lambda n_noisy: _descend(cells, np.maximum(n_noisy, 1.0)[:, None], sigma=sigma, rng=rng, config=config),
        recursion={"lr": config.lr, "steps": T, "grad_sd": _gradient_sd(sigma, C), "batch_rate": 1.0})
    return frame, descent_meta(
        "dp_gradient_descent", statistic, budget, gradient=f"{T} Gaussian steps", interval=INTERVAL,
        caveat="convergence in the slope direction is slow when x has little spread (lr, iterations)",
        reference=ALABI + ", section 2.3 (DPGradDescent); accounting: dptrain.privacy.accounting (RDP)",
        noise_multiplier=sigma, gradient_noise_sd=sigma * C, max_grad_norm=C, iterations=T, lr=config.lr)


def _checked(config: DPGDConfig) -> DPGDConfig:
    T = check_int(config.iterations, "release.iterations")
    frac, ifrac, C = check_shares(config.count_fraction, config.interval_fraction, config.max_grad_norm)
    return DPGDConfig(iterations=T, lr=config.lr, max_grad_norm=C, count_fraction=frac, interval_fraction=ifrac)


def _gradient_sd(sigma: float, clip: float) -> float:
    """The SD per element of the noise :func:`_gaussian_sum` adds (the grid-inflated sigma C)."""
    gamma = float(grid_step(sigma * clip / math.sqrt(2.0)))
    return sigma * (clip + math.sqrt(2.0) * gamma)


#: DP-GD at release.delta with the defaults of DPGDConfig
RELEASE_METHODS.register("dp_gd", CellFunction(dp_gradient_descent, neighbours=Neighbours.ADD_REMOVE, with_delta=True))
