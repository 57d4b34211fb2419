"""DP-SGD by dptrain's own engine on each cell's line (``release.method=dp_sgd``): the bridge
between training and release. (epsilon, delta)-DP, add/remove (docs/release.md section 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from dptrain.core.neighbours import Neighbours
from dptrain.models.optimizers import eager_class
from dptrain.privacy.dpsgd.engine import GradientEngine, StepStats
from dptrain.privacy.dpsgd.loop import PrivateStep
from dptrain.privacy.dpsgd.sampling import PoissonSampler
from dptrain.privacy.randomness import seeded_mt19937
from dptrain.release.cells import Cells, ReleaseError
from dptrain.release.methods._descent import check_run, check_shares, descent_budget, descent_meta, descent_release
from dptrain.release.methods.base import RELEASE_METHODS, CellFunction
from dptrain.release.methods.common import BOX_A, BOX_B, check_int, unit_rows

INTERVAL = (
    "theta~ -/+ (1.96 sqrt(noise var + SE_samp^2) + |non-convergence bias|), from the method's DP outputs "
    "and public settings only, as for "
    "dp_gd: interval_fraction epsilon buys noisy sum u, sum u^2 and Syy per cell (Laplace); the linearised "
    "recursion's step noise is N(0, sigma^2 C^2) / (q n~) plus the Poisson subsampling noise (1 - q) / (q n~) "
    "sigma_res^2 H, sigma_res^2 = Syy~ / (n~ - 2) (conservative); clipping and projection assumed inactive; "
    "NaN where n~ < 4 (dptrain/release/methods/_gd_interval.py)")


@dataclass(frozen=True)
class DPSGDConfig:
    """``steps`` DP-SGD steps with Poisson ``sample_rate`` q and step size ``lr``; per-example
    clipping norm ``max_grad_norm`` C; ``count_fraction`` of epsilon spent on the noisy count,
    ``interval_fraction`` on the interval's design statistics (0: no interval)."""

    steps: int = 100
    sample_rate: float = 0.2
    lr: float = 0.5
    max_grad_norm: float = 1.0
    count_fraction: float = 0.1
    interval_fraction: float = 0.15


class SquaredLossLinearEngine(GradientEngine):
    """dptrain's DP-SGD step for ``nn.Linear(1, 1)`` with the squared loss (z - y)^2 / 2: example i's
    gradient is r_i (x_i, 1), r_i = z_i - y_i, of squared norm r_i^2 (x_i^2 + 1), clipped in
    closed form. Noise and the division by B are the base class's (``GradientEngine.__call__``)."""

    name = "squared_loss_linear"

    @torch.no_grad()
    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        lin = self.model
        r = (x @ lin.weight.T + lin.bias).squeeze(-1) - y
        sq = r.square() * (x.square().sum(1) + 1.0)
        cr = r * self.clip_factors(sq)
        grad_of = {id(lin.weight): (cr @ x).reshape(1, -1), id(lin.bias): cr.sum().reshape(1)}
        stats = StepStats(int(y.shape[0]), float(0.5 * r.square().sum()), 0, self.count_clipped(sq))
        return [grad_of[id(p)] for p in self.params], stats


def _sgd_cell(u: np.ndarray, t: np.ndarray, *, sigma: float, batch: float, rng: np.random.Generator,
              config: DPSGDConfig) -> tuple[float, float]:
    """DP-SGD on one cell (expected batch size ``batch``); the mean of the second half of the
    iterates (a, b).

    The noise generator is a torch MT19937 whose whole 624-word state comes from ``rng``
    (:func:`seeded_mt19937`; ``manual_seed`` would keep 32 bits), the Poisson sampler a child of
    ``rng``. The model is float64, and so is its noise (the engine draws in the parameters' dtype)."""
    steps = config.steps
    noise_rng, sample_rng = rng.spawn(2)
    gen = seeded_mt19937(noise_rng.integers(0, 2**32, size=624, dtype=np.uint64).astype(np.uint32))
    model = nn.Linear(1, 1).double()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.fill_(0.5)
    engine = SquaredLossLinearEngine(model, max_grad_norm=config.max_grad_norm, noise_multiplier=sigma,
                                     expected_batch_size=batch, generator=gen)
    sampler = PoissonSampler(num_rows=u.size, sample_rate=config.sample_rate, rng=sample_rng)
    opt = eager_class(torch.optim.SGD)(model.parameters(), lr=config.lr)
    xs, ys = torch.from_numpy(u).reshape(-1, 1), torch.from_numpy(t)
    # THE DP-SGD step (dptrain.privacy.dpsgd.loop), recording nothing: sigma is calibrated up front
    private_step = PrivateStep(engine, sampler, opt, xs, ys, accountant=None)
    acc = np.zeros(2)
    for it in range(steps):
        private_step(None)
        with torch.no_grad():
            model.bias.clamp_(*BOX_A)
            model.weight.clamp_(*BOX_B)
        if it >= steps // 2:
            acc += (model.bias.detach().item(), model.weight.detach().item())
    return tuple(acc / (steps - steps // 2))


def _checked(config: DPSGDConfig) -> DPSGDConfig:
    steps = check_int(config.steps, "release.steps")
    q = config.sample_rate
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q <= 1.0:
        raise ReleaseError(f"release.sample_rate={q!r} is not allowed: a number in (0, 1]")
    frac, ifrac, C = check_shares(config.count_fraction, config.interval_fraction, config.max_grad_norm)
    return DPSGDConfig(steps=steps, sample_rate=float(q), lr=config.lr, count_fraction=frac, max_grad_norm=C,
                       interval_fraction=ifrac)


def dp_sgd_engine(cells: Cells, *, statistic: str, epsilon: float, delta: float, rng: np.random.Generator,
                  config: DPSGDConfig = DPSGDConfig()) -> tuple[pd.DataFrame, dict]:
    """DP-SGD by dptrain's own engine on ``nn.Linear(1, 1)`` per cell (a loop over cells): the bridge
    between training and release. (epsilon, delta)-DP, add/remove.

    Rows on the unit square with x centred (as :func:`~dptrain.release.methods.dp_gd.dp_gradient_descent`);
    Poisson sampling with rate q (``PoissonSampler``); :class:`SquaredLossLinearEngine` clips per
    example to C, adds N(0, sigma^2 C^2) in ``GradientEngine.__call__`` (float64, torch generator
    whose full state comes from ``rng``) and divides by B = q n~, n~ a Laplace noisy count
    (``count_fraction`` epsilon); ``interval_fraction`` epsilon to the interval's design statistics
    (_gd_interval.py, drawn last); SGD, projection onto the same box, mean of the second half of the
    iterates. sigma = calibrate_noise_multiplier(target = (1 - count_fraction - interval_fraction)
    epsilon, q, steps, delta), RDP; total by basic composition. Not released if n~ < 3.
    """
    eps, delta = check_run(statistic, epsilon, delta)
    cfg = _checked(config)
    T, q = cfg.steps, cfg.sample_rate
    budget = descent_budget(eps, delta, (cfg.count_fraction, cfg.interval_fraction), q=q, steps=T)
    frame = descent_release(cells, budget, statistic=statistic, rng=rng,
                            fit=lambda n_noisy: _sgd_cells(cells, n_noisy, sigma=budget.sigma, rng=rng, config=cfg),
                            recursion={"lr": cfg.lr, "steps": T, "batch_rate": q,
                                       "grad_sd": budget.sigma * cfg.max_grad_norm})
    return frame, descent_meta(
        "dp_sgd_engine", statistic, budget, gradient=f"{T} DP-SGD steps", interval=INTERVAL,
        caveat="B = q n~ uses the noisy count, never the private n",
        reference="Abadi et al. 2016 DP-SGD with Poisson sampling, dptrain.privacy.dpsgd.engine + accounting (RDP)",
        noise_multiplier=budget.sigma, sample_rate=q, steps=T, lr=cfg.lr, max_grad_norm=cfg.max_grad_norm)


def _sgd_cells(cells: Cells, n_noisy: np.ndarray, *, sigma: float, rng: np.random.Generator,
               config: DPSGDConfig) -> np.ndarray:
    """(a, b) of every cell with n~ >= 3 by :func:`_sgd_cell` (NaN elsewhere), G x 2."""
    u, t = unit_rows(cells)
    order = np.argsort(cells.codes, kind="stable")
    starts = np.concatenate(([0], np.cumsum(cells.n.astype(np.int64))))
    a, b = np.full(cells.n_cells, np.nan), np.full(cells.n_cells, np.nan)
    for g in np.flatnonzero(n_noisy >= 3):
        rows = order[starts[g]:starts[g + 1]]
        a[g], b[g] = _sgd_cell(u[rows], t[rows], sigma=sigma, batch=config.sample_rate * float(n_noisy[g]),
                               rng=rng.spawn(1)[0], config=config)
    return np.stack([a, b], axis=1)


#: DP-SGD at release.delta with the defaults of DPSGDConfig
RELEASE_METHODS.register("dp_sgd", CellFunction(dp_sgd_engine, neighbours=Neighbours.ADD_REMOVE, with_delta=True))
