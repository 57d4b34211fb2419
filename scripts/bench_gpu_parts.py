#!/usr/bin/env python
"""Where a DP-SGD step's time goes on a GPU, as ratios to a non-private step in the same process.

    python scripts/bench_gpu_parts.py                                  # a CUDA device, four cases
    python scripts/bench_gpu_parts.py --cases mlp1024-b4096 --profile  # plus torch.profiler's kernel table
    python scripts/bench_gpu_parts.py --device cpu --cases tiny --repeats 2   # a smoke run (tests)

``scripts/bench_step.py`` compares whole steps of dptrain and Opacus; this one takes dptrain's
step apart. Every mode runs on the same in-memory random rows on the device (N = max(50 B,
100,000)), C = 1, sigma = 1; the modes are timed interleaved (the order rotated per repeat),
each block of steps between two ``torch.cuda.synchronize()``, and reported as the median
ms/step and its ratio to ``nonprivate``:

* ``nonprivate``           plain PyTorch on a fixed-size batch (a slice of a per-epoch permutation);
* ``nonprivate-poisson``   the same on dptrain's Poisson batches (``make_sampler``: on a GPU with
                           q <= 0.1 the host-drawn, asynchronously copied ``PinnedPoissonSampler``);
* ``fast``                 what a training run does: dptrain's fast engine (on a GPU without the
                           ones column), Poisson batches from ``make_sampler``, the step run by
                           ``BatchStep`` (on a GPU replayed as one CUDA graph);
* ``fast-eager``           the same without the CUDA graph (``BatchStep(cuda_graph=False)``);
* ``fast-device-sampler``  ``fast-eager`` with ``DevicePoissonSampler`` (drawn on the GPU; the batch
                           size reaches the host by a wait for the GPU each step): the sampler a
                           GPU run used before ``PinnedPoissonSampler``;
* ``fast-cpu-layout``      ``fast`` with the buffered path's CPU layout (a ones column beside each
                           hidden output, ``engine.ones_column = True``);
* ``fast-presampled``      ``fast`` on 16 Poisson batches drawn before the timing and reused in
                           turn: the step without the sampler's cost (NOT a private run: a
                           measurement of what sampling costs);
* ``sampler``              ``make_sampler(...).sample()`` alone;
* ``device-sampler``       ``DevicePoissonSampler.sample()`` alone.

Measured on an H100 (experiments/performance/README.md, "CUDA"): ``fast`` over
``fast-presampled`` is what drawing a Poisson batch costs per step; ``fast-eager`` over ``fast``
what the CUDA graph saves; ``fast-device-sampler`` over ``fast-eager`` what drawing the batch on
the host saves; ``fast-cpu-layout`` over ``fast-eager`` what the GPU layout saves.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede `import torch`

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from dptrain.models.networks import mlp
from dptrain.models.objectives import BINARY
from dptrain.privacy.dpsgd.engine import make_engine
from dptrain.privacy.dpsgd.graph import BatchStep
from dptrain.privacy.dpsgd.sampling import DevicePoissonSampler, make_sampler
from dptrain.privacy.randomness import Randomness

#: name: (input width, hidden widths, expected batch B)
CASES = {
    "mlp1024-b4096": (1024, [1024, 1024], 4096),
    "mlp256-b4096": (100, [256, 256], 4096),
    "mlp256-b1024": (100, [256, 256], 1024),
    "preset-mlp": (112, [64, 64], 1024),
    "tiny": (8, [16, 16], 64),  # for a smoke run on the CPU
}
DEFAULT_CASES = ["mlp1024-b4096", "mlp256-b4096", "mlp256-b1024", "preset-mlp"]
MODES = ["nonprivate", "nonprivate-poisson", "fast", "fast-eager", "fast-device-sampler", "fast-cpu-layout",
         "fast-presampled", "sampler", "device-sampler"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Presampled:
    """Batches drawn once before the timing, reused in turn (the step without sampling)."""

    def __init__(self, sampler, k: int = 16) -> None:
        self.batches, self.i = [sampler.sample() for _ in range(k)], 0

    def sample(self) -> torch.Tensor:
        self.i = (self.i + 1) % len(self.batches)
        return self.batches[self.i]


def make_step(mode: str, case: str, x: torch.Tensor, y: torch.Tensor):
    """A zero-argument function running one step of ``mode`` on x's device."""
    d, hidden, b = CASES[case]
    device, n = x.device, x.shape[0]
    torch.manual_seed(0)  # the same initial weights in every mode
    model = mlp(in_features=d, hidden=hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    secret = Randomness.fresh()
    on_device = DevicePoissonSampler(num_rows=n, sample_rate=b / n,
                                     generator=secret.torch("poisson-sampler", device=device))
    sampler = on_device if mode in ("fast-device-sampler", "device-sampler") else \
        make_sampler(num_rows=n, sample_rate=b / n, randomness=secret, index=0, device=device)
    loss = BINARY.per_example_loss
    if mode.endswith("sampler") and not mode.startswith("fast"):
        return sampler.sample
    if mode.startswith("nonprivate"):
        gen = torch.Generator(device=device).manual_seed(2)
        state = {"perm": None, "pos": n}

        def batch() -> torch.Tensor:
            if mode == "nonprivate-poisson":
                return sampler.sample()
            if state["pos"] + b > n:
                state["perm"], state["pos"] = torch.randperm(n, generator=gen, device=device), 0
            state["pos"] += b
            return state["perm"][state["pos"] - b : state["pos"]]

        def step() -> None:
            idx = batch()
            loss(model(x.index_select(0, idx)), y.index_select(0, idx)).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    engine = make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=b,
                         generator=Randomness.fresh().torch("gaussian-noise", device=device), objective=BINARY)
    engine.collect_stats = False  # as in the training loop's unlogged steps
    engine.ones_column = mode == "fast-cpu-layout"
    if mode in ("fast", "fast-eager"):
        batch_step = BatchStep(engine, sampler, x, y, cuda_graph=mode == "fast")

        def loop_step() -> None:
            batch_step()
            optimizer.step()

        return loop_step
    source = _Presampled(sampler) if mode == "fast-presampled" else sampler

    def dp_step() -> None:
        idx = source.sample()
        engine(x.index_select(0, idx), y.index_select(0, idx))
        optimizer.step()

    return dp_step


def make_data(case: str, device: torch.device, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rows x (N, d) and labels y (N,) on the device, N = rows or max(50 B, 100,000)."""
    d, _, b = CASES[case]
    n = rows or max(50 * b, 100_000)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(n, d, device=device, generator=gen)
    return x, (torch.rand(n, device=device, generator=gen) > 0.5).float()


def time_case(case: str, device: torch.device, *, repeats: int, block_seconds: float,
              rows: int | None = None) -> dict[str, list[float]]:
    x, y = make_data(case, device, rows)
    steps = {m: make_step(m, case, x, y) for m in MODES}
    per_step = {}
    for mode, f in steps.items():  # warm-up, then the block length from 10 timed steps
        for _ in range(10):
            f()
        _sync(device)
        t = time.perf_counter()
        for _ in range(10):
            f()
        _sync(device)
        per_step[mode] = (time.perf_counter() - t) / 10
    k = {m: max(3, int(block_seconds / max(per_step[m], 1e-6))) for m in MODES}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(repeats):
        for mode in MODES[r % len(MODES):] + MODES[: r % len(MODES)]:
            _sync(device)
            t = time.perf_counter()
            for _ in range(k[mode]):
                steps[mode]()
            _sync(device)
            times[mode].append((time.perf_counter() - t) / k[mode])
    return times


def report(case: str, times: dict[str, list[float]], n: int, b: int) -> list[str]:
    base = statistics.median(times["nonprivate"])
    lines = [f"## {case}: N = {n:,}, B = {b:,}; median ms/step, ratio to nonprivate (min-max ms over repeats)"]
    for mode in MODES:
        med = statistics.median(times[mode])
        lines.append(f"  {mode:20s} {med * 1e3:8.3f} ms  {med / base:6.3f}x  ({min(times[mode]) * 1e3:.3f}-"
                     f"{max(times[mode]) * 1e3:.3f})")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) | cuda:N | cpu (a smoke run)")
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=sorted(CASES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--block-seconds", type=float, default=0.15, help="target duration of one timed block")
    p.add_argument("--rows", type=int, default=None, help="N rows for every case (default: max(50 B, 100000))")
    p.add_argument("--profile", action="store_true", help="also print torch.profiler's kernel table of `fast`")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device} is not allowed here: torch sees no CUDA device; allowed: cpu")
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats} is not allowed: allowed: an integer >= 1")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# torch {torch.__version__} on {name}; threads {torch.get_num_threads()}; "
          f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True)
    for case in args.cases:
        b = CASES[case][2]
        n = args.rows or max(50 * b, 100_000)
        times = time_case(case, device, repeats=args.repeats, block_seconds=args.block_seconds, rows=args.rows)
        print("\n".join(report(case, times, n, b)), flush=True)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            step = make_step("fast", case, *make_data(case, device, args.rows))
            step()
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=acts) as prof:
                for _ in range(10):
                    step()
                _sync(device)
            key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
