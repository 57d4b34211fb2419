"""Worker for tests/test_distributed.py, run under torchrun with 2 processes.

Checks on the real engine with a real gloo process group: (1) the noise of an update on a
zero-gradient step (empty batches on every rank) has standard deviation sigma*C/B, i.e. it is
added once for the job, not once per rank; (2) every rank ends with the same gradient; (3) the
ranks' Poisson streams differ and each shard is sampled at rate q. Rank 0 writes a JSON file.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from dptrain.models.networks import Squeeze
from dptrain.models.objectives import BINARY
from dptrain.privacy.dpsgd.engine import FastLinearEngine
from dptrain.privacy.dpsgd.sampling import PoissonSampler
from dptrain.privacy.randomness import Randomness
from dptrain.training.distributed import init_from_env, shutdown


def main(out: str) -> None:
    ctx = init_from_env(timeout_s=120)
    torch.manual_seed(ctx.rank)  # different initial parameters: the broadcast must align them
    sigma, c, b = 1.7, 0.9, 64.0
    noise_gen = Randomness.fresh().torch("gaussian-noise")  # only rank 0 draws
    model = torch.nn.Sequential(torch.nn.Linear(20, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1), Squeeze())
    ctx.broadcast_parameters(model)
    engine = FastLinearEngine(model, max_grad_norm=c, noise_multiplier=sigma, expected_batch_size=b,
                              generator=noise_gen, objective=BINARY)
    engine.dist = ctx
    engine.collect_stats = False
    x0, y0 = torch.zeros(0, 20), torch.zeros(0)
    draws = []
    for _ in range(400):
        engine(x0, y0)
        draws.append(torch.cat([p.grad.reshape(-1) for p in engine.params]))
    noise = torch.stack(draws).double()
    gathered = ctx.all_gather_objects(noise.numpy())
    same_on_all_ranks = all(np.array_equal(g, gathered[0]) for g in gathered)

    # a real step: identical gradients on both ranks
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    x = torch.randn(30, 20, generator=gen)
    y = (torch.rand(30, generator=gen) > 0.5).float()
    engine(x, y)
    g = torch.cat([p.grad.reshape(-1) for p in engine.params]).numpy()
    grads_equal = all(np.array_equal(h, g) for h in ctx.all_gather_objects(g))

    # Poisson sampling on each rank's shard, rank-specific streams
    n_shard, q, steps = 5000, 0.02, 300
    sample_gen = Randomness.fresh().numpy("poisson-sampler", ctx.rank)  # fresh on every rank
    sampler = PoissonSampler(num_rows=n_shard, sample_rate=q, rng=sample_gen)
    counts = np.zeros(n_shard)
    first = None
    for i in range(steps):
        idx = sampler.sample().numpy()
        if i == 0:
            first = idx
        counts[idx] += 1
    firsts = ctx.all_gather_objects(first)
    rates = ctx.all_gather_objects(float(counts.sum() / (n_shard * steps)))
    if ctx.rank == 0:
        with open(out, "w") as fh:
            json.dump({
                "world_size": ctx.world_size,
                "noise_std": float(noise.std()),
                "noise_mean": float(noise.mean()),
                "noise_n": int(noise.numel()),
                "expected_std": sigma * c / b,
                "noise_same_on_all_ranks": bool(same_on_all_ranks),
                "grads_equal": bool(grads_equal),
                "first_batches_differ": not np.array_equal(firsts[0], firsts[1]),
                "inclusion_rates": rates,
            }, fh)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
