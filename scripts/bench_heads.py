#!/usr/bin/env python
"""Benchmark the fast engine's heads: a DP-SGD step against a non-private one, per objective.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_heads.py            # 1 and 2 threads, B = 1024, 4096
    python scripts/bench_heads.py --quick                            # a short smoke run

The engine's speed goal (experiments/performance/README.md): DP / non-private step time <= 1.3
for a linear model at B = 1024 and 4096. This script measures it for the three linear heads the
closed-form path serves: ``binary`` (100 -> 1, sigmoid), ``multinomial`` (100 -> 6, softmax over
6 classes, the per-example norm ||g_i||^2 (||x_i||^2 + 1) with g_i a 6-vector) and ``linear``
(100 -> 1, squared error). In ONE process, on the same in-memory tensors (N = max(50 B,
100,000) rows, no DataLoader), per (objective, B, threads):

* ``nonprivate``: a fixed-size batch sliced from a per-epoch permutation, forward,
  ``objective.per_example_loss(...).mean().backward()``, ``optimizer.step()``;
* ``dptrain-fast``: the Poisson sampler with the run's secret streams + ``make_engine(engine="fast",
  objective=...)`` + ``optimizer.step()`` (C = 1, sigma = 1), as in a training run.

Timing as in scripts/bench_step.py (warm-up, then repeats of interleaved blocks of about 0.3 s,
median steps/s per mode); the ratio is time(DP) / time(non-private) from the medians. The load
of other processes is printed: numbers taken on a busy machine are marked as such.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_step import OtherLoad, machine_description, num_rows, time_block, warm_up  # noqa: E402

from dptrain.core.dataspec import DataSpec  # noqa: E402
from dptrain.models.networks import logit  # noqa: E402
from dptrain.models.objectives import build_objective  # noqa: E402
from dptrain.privacy.dpsgd.engine import make_engine  # noqa: E402
from dptrain.privacy.dpsgd.sampling import PoissonSampler  # noqa: E402
from dptrain.privacy.randomness import Randomness  # noqa: E402

IN_FEATURES, CLASSES, LR, GOAL = 100, 6, 0.1, 1.3
OBJECTIVES = ("binary", "multinomial", "linear")


def make_objective(name: str):
    obj = build_objective(name)
    if name == "multinomial":
        obj.check_data(DataSpec(n_features=IN_FEATURES, target_kind="multiclass",
                                class_names=tuple(f"c{k}" for k in range(CLASSES))))
    elif name == "linear":
        obj.check_data(DataSpec(n_features=IN_FEATURES, target_kind="continuous", target_bounds=(0.0, 1.0)))
    return obj


def make_data(name: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    n = num_rows(batch)
    x = torch.randn(n, IN_FEATURES, generator=g)
    if name == "multinomial":
        w = torch.randn(IN_FEATURES, CLASSES, generator=g) / IN_FEATURES**0.5
        return x, torch.multinomial(torch.softmax(x @ w, 1), 1, generator=g)[:, 0]
    w = torch.randn(IN_FEATURES, generator=g) / IN_FEATURES**0.5
    if name == "linear":
        return x, torch.sigmoid(x @ w + 0.3 * torch.randn(n, generator=g))  # a target in [0, 1]
    return x, (torch.rand(n, generator=g) < torch.sigmoid(x @ w)).to(torch.float32)


def make_step(mode: str, name: str, batch: int, x: torch.Tensor, y: torch.Tensor):
    torch.manual_seed(0)
    obj = make_objective(name)
    model = logit(in_features=IN_FEATURES, out_features=CLASSES if name == "multinomial" else 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    n = x.shape[0]
    if mode == "nonprivate":
        gen, state = torch.Generator().manual_seed(2), {"perm": None, "pos": n}

        def step() -> None:
            if state["pos"] + batch > n:
                state["perm"], state["pos"] = torch.randperm(n, generator=gen), 0
            idx = state["perm"][state["pos"]: state["pos"] + batch]
            state["pos"] += batch
            obj.per_example_loss(model(x.index_select(0, idx)), y.index_select(0, idx)).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    secret = Randomness.fresh()
    sampler = PoissonSampler(num_rows=n, sample_rate=batch / n, rng=secret.numpy("poisson-sampler"))
    engine = make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=batch,
                         generator=secret.torch("gaussian-noise"), objective=obj)
    if not engine.closed_form:
        raise RuntimeError(f"{name}: the fast engine did not take its closed-form head path")
    engine.collect_stats = False

    def step() -> None:
        idx = sampler.sample()
        engine(x.index_select(0, idx), y.index_select(0, idx))
        optimizer.step()

    return step


def bench(name: str, batch: int, args: argparse.Namespace) -> dict[str, float]:
    x, y = make_data(name, batch)
    modes = ("nonprivate", "dptrain-fast")
    steps = {m: make_step(m, name, batch, x, y) for m in modes}
    ks = {m: max(1, round(args.block_seconds / warm_up(steps[m], 20, 1.0))) for m in modes}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            rates[m].append(ks[m] / time_block(steps[m], ks[m]))
    return {m: statistics.median(v) for m, v in rates.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="*", default=[1024, 4096])
    p.add_argument("--objectives", nargs="*", default=list(OBJECTIVES), choices=OBJECTIVES)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--block-seconds", type=float, default=0.3)
    p.add_argument("--quick", action="store_true", help="3 repeats of 0.05 s blocks (a smoke run)")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.block_seconds = 3, 0.05
    print("\n".join(machine_description()))
    load = OtherLoad()
    print(f"\n{'threads':>7} {'objective':>12} {'B':>5} {'nonprivate/s':>13} {'DP/s':>9} {'DP/nonpriv':>10}"
          f"  goal <= {GOAL}")
    worst = 0.0
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in args.objectives:
            for batch in args.batches:
                r = bench(name, batch, args)
                ratio = r["nonprivate"] / r["dptrain-fast"]
                worst = max(worst, ratio)
                print(f"{threads:>7} {name:>12} {batch:>5} {r['nonprivate']:>13.0f} {r['dptrain-fast']:>9.0f} "
                      f"{ratio:>10.2f}  {'ok' if ratio <= GOAL else 'ABOVE GOAL'}", flush=True)
    print(f"\nworst ratio {worst:.2f} (goal <= {GOAL}); {load.report()}")
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
