#!/usr/bin/env python
"""Benchmark one training step: non-private vs DP-SGD (dptrain fast path, Opacus hooks, Opacus ghost).

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_step.py              # CPU, full run (both thread counts)
    python scripts/bench_step.py --quick                              # short smoke run
    python scripts/bench_step.py --threads 2 --cases mlp256-b1024 preset-mlp --out results.md
    python scripts/bench_step.py --device cuda --out bench_cuda.md    # one GPU: the issue's six cases
    python scripts/bench_step.py --cases mlp256-b1024 --contended     # idle, then beside a busy process

Cases (``--cases``; ``--list-cases`` prints them). C = 1, sigma = 1, Poisson batches, binary
logistic loss, ReLU, on N = max(50 B, 100,000) rows of random data (``--rows`` overrides N):

* ``logit-bB`` (B = 256, 1024, 4096): logistic regression 100 -> 1;
* ``mlp256-bB`` (B = 256, 1024, 4096): MLP 100-256-256-1;
* ``mlp1024-b4096``: MLP 1024-1024-1024-1 at B = 4,096 (N = 204,800 rows of 1024 floats: 0.84 GB);
* ``mlp4096-b16384``: MLP 1024-4096-4096-1 at B = 16,384 (N = 819,200 rows: 3.4 GB);
* ``preset-logit`` / ``preset-mlp``: the model and expected batch of ``experiment=logit`` /
  ``experiment=mlp`` (composed from conf/ with Hydra; width = the feature count of the preset's
  public schema, dptrain.data.public_schema, 111 for Adult; B = trainer.batch_size), on random rows of that width.

Default cases: on ``--device cpu`` the six logit/mlp256 cases (the numbers of
experiments/performance/README.md stay comparable; the 1024-wide cases are opt-in there); on
``--device cuda`` the issue's six (mlp256-b1024, mlp256-b4096, mlp1024-b4096, mlp4096-b16384,
preset-logit, preset-mlp).

For every case and thread count it builds, IN ONE PROCESS, one step function per mode on the same
in-memory tensors x (N, d), y (N,) on the device, no DataLoader:

* ``nonprivate``      plain PyTorch: a fixed-size batch (contiguous slice of a per-epoch
                      permutation), forward, ``per_example_loss(...).mean().backward()``,
                      ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``.
* ``dptrain-fast``    ``make_sampler`` + ``make_engine(engine="fast")`` + ``optimizer.step()``, the
                      batch drawn and the engine run by ``BatchStep`` as in the training loop (on a
                      GPU the step replayed as one CUDA graph, dptrain.privacy.dpsgd.graph).
* ``dptrain-opacus``  the same with ``engine="opacus"`` (Opacus per-sample gradients, our clipping).
* ``opacus-hooks``    Opacus' standard path: ``GradSampleModule`` + ``DPOptimizer``
                      (loss_reduction="mean"), on the same kind of Poisson-sampled batches.
* ``opacus-ghost``    Opacus' ghost clipping: ``GradSampleModuleFastGradientClipping`` +
                      ``DPOptimizerFastGradientClipping`` + ``DPLossFastGradientClipping``.

All DP modes use C = 1, sigma = 1 and dptrain's Poisson sampler for the device
(``make_sampler``: numpy on the CPU; on a GPU the same numpy draws copied to the device without
waiting when q <= 0.1, else a torch generator on the GPU; sample rate B / N), so they pay for
sampling as real DP-SGD does. On a GPU the other generators (permutation, noise) live on the GPU.

Timing: warm-up (20 steps or 1 s, at least 2 steps), then R repeats; in each repeat every mode
runs K steps (K chosen from the warm-up so that a block takes about 0.3 s, at least 1 step),
modes interleaved round-robin (order rotated per repeat) so drift hits all of them alike. A mode
whose blocks would take more than ``--max-mode-seconds`` over all repeats runs in fewer, evenly
spaced, repeats; ``--budget-seconds`` lowers R per case (never below 2) to fit a total budget. On
CUDA, ``torch.cuda.synchronize()`` precedes every clock reading. Reported: median steps/s over
the repeats, the ratio of step times time(mode) / time(nonprivate) (from the medians, same
process), the speed-up of dptrain-fast over Opacus ghost (time(ghost) / time(fast)), and the
peak extra memory of a step.

Peak memory on the CPU: torch keeps no allocator statistics there, so each (case, mode) is
measured in a fresh subprocess of this script (hidden ``--memory-probe``): build data, run 2 steps
of the mode on a throw-away model (one-time set-up costs), build a fresh model and mode, take the
resident set size as the base BEFORE its first step (so buffers a mode keeps between steps, such
as dptrain's workspace, are counted), reset the kernel's high-water mark
(``echo 5 > /proc/self/clear_refs``), run a few steps, and report VmHWM - base. The probe
process runs with 1 thread and a fixed glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_``) so
that freed tensors go back to the kernel and the base is the steady state, not cached heap.
Per-sample-gradient modes whose gradients alone would need more than 8 GB are skipped on the
CPU (a machine shared with other jobs must not be pushed into swap or the OOM killer).

Peak memory on CUDA, in this process, before the timing (only the case's data is alive): the
same throw-away warm-up, then a fresh instance; ``memory_allocated()`` before its first step is
the base, ``reset_peak_memory_stats()``, a few steps, ``max_memory_allocated()``: reported are
peak - base (persistent buffers included, as on the CPU), the absolute peak (data included), and
(JSON) the transient extra of later steps alone. A mode that runs out of GPU memory
(``torch.cuda.OutOfMemoryError``) is reported as ``OOM``, its objects are dropped and
``torch.cuda.empty_cache()`` runs; the other modes go on.

``--contended`` times every case twice in the same process with the same step objects: idle,
then while a CPU-bound process started by this script (``while True: pass``, plus a check every
~10^6 iterations that exits when this script is gone) runs; it is killed afterwards, also on
errors and SIGTERM.

The environment variable OMP_WAIT_POLICY is set to PASSIVE (unless already set) BEFORE torch is
imported: on a 2-core machine, OpenMP threads that busy-wait can turn a 0.2 ms step into 30 ms
as soon as anything else runs.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede `import torch`

import argparse
import contextlib
import gc
import hashlib
import inspect
import json
import math
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from argparse import Namespace
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from dptrain.models.networks import logit, mlp
from dptrain.models.objectives import BINARY
from dptrain.privacy.dpsgd.engine import make_engine

try:  # the samplers' own module (issue 45); before it they lived in engine.py
    from dptrain.privacy.dpsgd.sampling import PoissonSampler, make_sampler
except ImportError:
    from dptrain.privacy.dpsgd.engine import PoissonSampler

    try:  # a checkout that predates device support (--baseline-engine runs): numpy sampler, CPU only
        from dptrain.privacy.dpsgd.engine import make_sampler
    except ImportError:
        make_sampler = None
try:  # the training loop's step (a CUDA graph on a GPU); older checkouts: the engine called directly
    from dptrain.privacy.dpsgd.graph import BatchStep
except ImportError:
    BatchStep = None

per_example_loss = BINARY.per_example_loss  # binary cross-entropy with logits, one per example


C = 1.0
SIGMA = 1.0
LR = 0.1
MODES = ["nonprivate", "dptrain-fast", "dptrain-opacus", "opacus-hooks", "opacus-ghost"]
PER_SAMPLE_MODES = ("dptrain-opacus", "opacus-hooks")  # materialise B x (parameters) gradients
CPU_PER_SAMPLE_LIMIT_GB = 8.0  # skip those on the CPU above this estimate (shared machine)
BASELINE_ENGINE = None  # --baseline-engine: an older engine module, timed as mode baseline-fast
GOAL_RATIO = 1.3  # DP / non-private step time, logit and MLP at B = 1024, 4096 (issue 3, CPU)
GOAL_GHOST = 2.0  # opacus-ghost / dptrain-fast step time, MLP
GOAL_MEMORY = 1.5  # peak extra memory dptrain-fast / nonprivate (where nonprivate >= 1 MB)

warnings.filterwarnings("ignore", category=UserWarning)  # Opacus' hook warnings; not timing-relevant
warnings.filterwarnings("ignore", category=FutureWarning)


# ---------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One benchmark cell: a model (``hidden`` None: the logit) at expected batch ``batch``."""

    name: str
    in_features: int
    hidden: tuple[int, ...] | None
    batch: int
    activation: str = "relu"
    source: str = "built in"

    def build(self) -> torch.nn.Module:
        if self.hidden is None:
            return logit(in_features=self.in_features)
        return mlp(in_features=self.in_features, hidden=list(self.hidden), activation=self.activation)

    def num_params(self) -> int:
        widths = [self.in_features, *(self.hidden or ()), 1]
        return sum(a * b + b for a, b in zip(widths, widths[1:]))

    def describe(self) -> str:
        widths = "-".join(str(w) for w in [self.in_features, *(self.hidden or ()), 1])
        kind = "logit" if self.hidden is None else f"MLP {self.activation}"
        return f"{self.name}: {kind} {widths} ({self.num_params():,} parameters), B = {self.batch}"


def _builtin_cases() -> dict[str, Case]:
    cases = {}
    for b in (256, 1024, 4096):
        cases[f"logit-b{b}"] = Case(f"logit-b{b}", 100, None, b)
        cases[f"mlp256-b{b}"] = Case(f"mlp256-b{b}", 100, (256, 256), b)
    cases["mlp1024-b4096"] = Case("mlp1024-b4096", 1024, (1024, 1024), 4096)
    cases["mlp4096-b16384"] = Case("mlp4096-b16384", 1024, (4096, 4096), 16384)
    return cases


CASES = _builtin_cases()
PRESETS = ("preset-logit", "preset-mlp")
ALL_CASE_NAMES = [*CASES, *PRESETS]
CPU_DEFAULT_CASES = ["logit-b256", "logit-b1024", "logit-b4096", "mlp256-b256", "mlp256-b1024", "mlp256-b4096"]
CUDA_DEFAULT_CASES = ["mlp256-b1024", "mlp256-b4096", "mlp1024-b4096", "mlp4096-b16384", "preset-logit", "preset-mlp"]
# if the presets cannot be composed (a checkout without Hydra configs): experiment=logit / mlp on
# Adult, 111 encoded features (5 numeric + 8 categorical columns with their labels and "other")
PRESET_FALLBACK = {"logit": (111, None, 1024), "mlp": (111, (64, 64), 1024)}


def preset_cases(names: list[str]) -> dict[str, Case]:
    """The presets' model and expected batch, composed as ``python -m dptrain experiment=NAME``
    would (no row is read: the width comes from the public schema)."""
    out = {}
    try:
        from hydra import compose, initialize_config_module

        from dptrain.data import public_schema
        from dptrain.tasks.registry import register_configs

        register_configs()
        with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
            for name in names:
                exp = name.removeprefix("preset-")
                cfg = compose(config_name="config", overrides=[f"experiment={exp}"])
                target = str(cfg.model["_target_"])
                hidden = tuple(int(h) for h in cfg.model["hidden"]) if target.endswith(".mlp") else None
                out[name] = Case(name, len(public_schema(cfg.data).feature_names), hidden, int(cfg.trainer.batch_size),
                                 str(cfg.model.get("activation", "relu")), f"composed from experiment={exp}")
    except Exception as exc:  # noqa: BLE001  (documented constants instead; the run says so)
        for name in names:
            d, hidden, b = PRESET_FALLBACK[name.removeprefix("preset-")]
            out[name] = Case(name, d, hidden, b, "relu", f"fallback constants ({type(exc).__name__}: {exc})"[:200])
    return out


def resolve_cases(names: list[str]) -> list[Case]:
    presets = preset_cases([n for n in names if n in PRESETS]) if any(n in PRESETS for n in names) else {}
    return [presets[n] if n in PRESETS else CASES[n] for n in names]


# ----------------------------------------------------------------------------------------- data


def num_rows(batch: int, rows: int | None = None) -> int:
    return rows if rows is not None else max(50 * batch, 100_000)


def make_data(case: Case, device: torch.device, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1), y from a noisy logistic model (so some examples are clipped, some not),
    generated on ``device`` (on the CPU: the same numbers as before device support)."""
    g = torch.Generator(device=device).manual_seed(1234)
    n, d = num_rows(case.batch, rows), case.in_features
    x = torch.randn(n, d, generator=g, device=device)
    w = torch.randn(d, generator=g, device=device) / d**0.5
    y = (torch.rand(n, generator=g, device=device) < torch.sigmoid(x @ w)).to(torch.float32)
    return x, y


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(exc: BaseException) -> bool:
    """Out of memory on the GPU (torch.cuda.OutOfMemoryError; older code paths raise a
    RuntimeError saying so) or a refused CPU allocation."""
    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "not enough memory",
                            "can't allocate memory", "DefaultCPUAllocator"))


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def per_sample_skip(case: Case, mode: str, device: torch.device) -> str | None:
    """Why ``mode`` is not run for ``case`` on this device (None: it is run)."""
    if device.type != "cpu" or mode not in PER_SAMPLE_MODES:
        return None
    gb = 2 * case.batch * case.num_params() * 4 / 1e9  # per-sample gradients + their clipped copy
    if gb > CPU_PER_SAMPLE_LIMIT_GB:
        return f"skipped: per-sample gradients need ~{gb:.0f} GB"
    return None


# ---------------------------------------------------------------------------------------- modes


def _sampler(n: int, batch: int, device: torch.device):
    """dptrain's Poisson sampler for the device, its stream secret (fresh OS entropy)."""
    if make_sampler is not None:
        from dptrain.privacy.randomness import Randomness

        return make_sampler(num_rows=n, sample_rate=batch / n, randomness=Randomness.fresh(), index=0,
                            device=device)
    if device.type != "cpu":
        raise RuntimeError("this checkout's dptrain has no make_sampler: CPU only")
    return PoissonSampler(num_rows=n, sample_rate=batch / n, rng=np.random.default_rng(0))


def _noise_generator(device: torch.device) -> torch.Generator:
    """The training loop's noise stream: secret, on the model's device."""
    try:
        from dptrain.privacy.randomness import Randomness
    except ImportError:  # an old checkout: a seeded CPU generator
        return torch.Generator().manual_seed(1)
    secret = Randomness.fresh()
    return secret.torch("gaussian-noise", device=device) if device.type != "cpu" else secret.torch("gaussian-noise")


def _nonprivate_step(model, optimizer, batch, x, y):
    n, device = x.shape[0], x.device
    gen = torch.Generator(device=device).manual_seed(2)
    state = {"perm": None, "pos": n}

    def step() -> None:
        if state["pos"] + batch > n:  # new epoch: reshuffle (its cost is part of the step)
            state["perm"] = torch.randperm(n, generator=gen, device=device)
            state["pos"] = 0
        idx = state["perm"][state["pos"] : state["pos"] + batch]
        state["pos"] += batch
        loss = per_example_loss(model(x.index_select(0, idx)), y.index_select(0, idx)).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _dptrain_step(mode, model, optimizer, batch, x, y):
    sampler = _sampler(x.shape[0], batch, x.device)
    if mode == "baseline-fast":
        # an older engine.py (--baseline-engine), with its own seeding (manual_seed), timed in
        # the same process as dptrain-fast: before/after ratios without cross-run drift
        old_api = {"private": True} if "private" in inspect.signature(BASELINE_ENGINE.make_engine).parameters else {}
        engine = BASELINE_ENGINE.make_engine(
            model, engine="fast", max_grad_norm=C, noise_multiplier=SIGMA, **old_api,
            expected_batch_size=batch, generator=torch.Generator().manual_seed(1), objective=BINARY,
        )
    else:
        engine = make_engine(model, engine=mode.split("-")[1], max_grad_norm=C, noise_multiplier=SIGMA,
                             expected_batch_size=batch, generator=_noise_generator(x.device), objective=BINARY)
    # as in dptrain's training loop, where diagnostics are computed on logged steps only
    engine.collect_stats = False
    if BatchStep is not None and mode != "baseline-fast":
        # the training loop's step: the sampler and the engine, on a GPU replayed as a CUDA graph
        batch_step = BatchStep(engine, sampler, x, y)

        def loop_step() -> None:
            batch_step()
            optimizer.step()

        return loop_step

    def step() -> None:
        idx = sampler.sample()
        engine(x.index_select(0, idx), y.index_select(0, idx))
        optimizer.step()

    return step


def _opacus_hooks_step(model, optimizer, batch, x, y):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    sampler = _sampler(x.shape[0], batch, x.device)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    dp_opt = DPOptimizer(optimizer, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=batch,
                         loss_reduction="mean", generator=torch.Generator(device=x.device).manual_seed(1))

    def step() -> None:
        idx = sampler.sample()
        loss = per_example_loss(gsm(x.index_select(0, idx)), y.index_select(0, idx)).mean()
        loss.backward()
        dp_opt.step()
        dp_opt.zero_grad(set_to_none=True)

    return step


def _opacus_ghost_step(model, optimizer, batch, x, y):
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    sampler = _sampler(x.shape[0], batch, x.device)
    gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="mean", max_grad_norm=C,
                                               use_ghost_clipping=True)
    dp_opt = DPOptimizerFastGradientClipping(
        optimizer, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=batch, loss_reduction="mean",
        generator=torch.Generator(device=x.device).manual_seed(1),
    )
    criterion = DPLossFastGradientClipping(gsm, dp_opt, _BCEWithLogits(), loss_reduction="mean")

    def step() -> None:
        idx = sampler.sample()
        loss = criterion(gsm(x.index_select(0, idx)), y.index_select(0, idx))  # per-example losses, wrapped
        loss.backward()  # Opacus: first backward (norms), clip factors, second backward
        dp_opt.step()
        dp_opt.zero_grad(set_to_none=True)

    return step


def make_step(mode: str, case: Case, x: torch.Tensor, y: torch.Tensor):
    """A zero-argument function running one full training step of ``mode`` on x's device."""
    torch.manual_seed(0)  # same initial weights in every mode (built on the CPU, then moved)
    model = case.build().to(x.device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    if mode == "nonprivate":
        return _nonprivate_step(model, optimizer, case.batch, x, y)
    if mode in ("dptrain-fast", "dptrain-opacus", "baseline-fast"):
        return _dptrain_step(mode, model, optimizer, case.batch, x, y)
    if mode == "opacus-hooks":
        return _opacus_hooks_step(model, optimizer, case.batch, x, y)
    if mode == "opacus-ghost":
        return _opacus_ghost_step(model, optimizer, case.batch, x, y)
    raise ValueError(f"unknown mode {mode!r}: must be one of {', '.join(MODES)}")


class _BCEWithLogits(torch.nn.Module):
    """``per_example_loss`` as a criterion with a ``reduction`` attribute (which Opacus' ghost
    loss wrapper sets to "none" to get per-example losses)."""

    def __init__(self) -> None:
        super().__init__()
        self.reduction = "mean"

    def forward(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = per_example_loss(logits, y)
        if self.reduction == "none":
            return losses
        return losses.sum() if self.reduction == "sum" else losses.mean()


# --------------------------------------------------------------------------------------- timing


def warm_up(step, args, device: torch.device) -> float:
    """Run warm-up steps; return the estimated seconds per step (from the second half)."""
    times = []
    start = time.perf_counter()
    while len(times) < args.warmup_steps and (
            len(times) < args.min_warmup_steps or time.perf_counter() - start < args.warmup_seconds):
        synchronize(device)
        t0 = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[len(times) // 2 :])


def time_block(step, k: int, device: torch.device) -> float:
    gc.collect()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    synchronize(device)
    return time.perf_counter() - t0


def sampler_cost(batch: int, x: torch.Tensor, y: torch.Tensor, seconds: float = 0.2) -> float:
    """Seconds per Poisson sample + gather (the part of a DP step that sampling costs)."""
    sampler, device = _sampler(x.shape[0], batch, x.device), x.device
    for _ in range(5):
        idx = sampler.sample()
        x.index_select(0, idx), y.index_select(0, idx)
    synchronize(device)
    k, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        idx = sampler.sample()
        x.index_select(0, idx), y.index_select(0, idx)
        k += 1
        synchronize(device)
    return (time.perf_counter() - t0) / k


def _failure(exc: BaseException, case: Case, mode: str, where: str) -> str:
    """The table's entry for a mode that failed: OOM, or ERR (traceback on stderr)."""
    if is_oom(exc):
        print(f"  {case.name} {mode}: out of memory during {where}: {str(exc).splitlines()[0][:200]}",
              file=sys.stderr)
        return "OOM"
    print(f"  {case.name} {mode}: ERROR during {where}:", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    return f"ERR: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def prepare_modes(case: Case, modes: list[str], x, y, args, status: dict[str, str]) -> dict:
    """Build and warm up every mode not already failed/skipped (``status``); returns
    {mode: {"step", "t_step", "k"}} and records failures in ``status``."""
    prepared = {}
    for m in modes:
        if m in status:
            continue
        try:
            step = make_step(m, case, x, y)
            t_step = warm_up(step, args, x.device)
        except Exception as exc:  # noqa: BLE001  (one failing mode must not end the benchmark)
            status[m] = _failure(exc, case, m, "warm-up")
            step = None
            free_memory(x.device)
            continue
        prepared[m] = {"step": step, "t_step": t_step, "k": max(1, round(args.block_seconds / t_step))}
    return prepared


def plan_rounds(prepared: dict, args, cell_budget: float | None) -> tuple[int, dict[str, list[int]]]:
    """Repeats R for the case and, per mode, the rounds it takes part in (evenly spaced): a
    mode runs min(R, max_mode_seconds / its block time) blocks, at least 1; with a budget, R is
    the largest (not below 2) whose estimated time fits it."""
    block = {m: p["k"] * p["t_step"] for m, p in prepared.items()}

    def blocks(m: str, repeats: int) -> int:
        return max(1, min(repeats, math.floor(args.max_mode_seconds / max(block[m], 1e-9))))

    repeats = args.repeats
    while cell_budget is not None and repeats > 2 and sum(blocks(m, repeats) * b
                                                          for m, b in block.items()) > cell_budget:
        repeats -= 1
    rounds = {}
    for m in block:
        r_m = blocks(m, repeats)
        rounds[m] = sorted({math.floor(i * repeats / r_m) for i in range(r_m)})
    return repeats, rounds


def run_rounds(case: Case, prepared: dict, plan: tuple[int, dict], status: dict, device) -> dict[str, list[float]]:
    """Interleaved timed blocks; steps/s per block for every mode."""
    modes, (repeats, rounds) = list(prepared), plan
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(repeats):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for m in order:
            if m in status or r not in rounds[m]:
                continue
            try:
                rates[m].append(prepared[m]["k"] / time_block(prepared[m]["step"], prepared[m]["k"], device))
            except Exception as exc:  # noqa: BLE001
                status[m] = _failure(exc, case, m, "timing")
                prepared[m]["step"] = None
                free_memory(device)
    return rates


def summarise(rates: dict[str, list[float]], prepared: dict, modes: list[str], status: dict) -> dict:
    out = {}
    for m in modes:
        if m in status:
            out[m] = {"status": status[m]}
            continue
        if m not in rates or not rates[m]:
            out[m] = {"status": "ERR: no timed block"}
            continue
        v = rates[m]
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
        out[m] = {"status": "ok", "steps_per_s": statistics.median(v), "q1": q[0], "q3": q[2],
                  "k": prepared[m]["k"], "blocks": len(v)}
    return out


# --------------------------------------------------------------------------------------- memory


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _hwm_bytes() <= _rss_bytes() + 4 * 1024 * 1024


def memory_probe(spec: str) -> None:
    """(Subprocess) print JSON: peak extra resident memory of ``steps`` steps of ``mode``."""
    job = json.loads(spec)
    case = Case(**{**job["case"], "hidden": tuple(job["case"]["hidden"]) if job["case"]["hidden"] else None})
    mode, steps = job["mode"], job["steps"]
    torch.set_num_threads(1)
    x, y = make_data(case, torch.device("cpu"), job.get("rows"))
    try:
        # one-time costs (kernel set-up, thread pools, lazy imports) on a throw-away instance ...
        warm = make_step(mode, case, x, y)
        warm()
        warm()
        del warm
        gc.collect()
        # ... then a fresh one, measured from before its first step: buffers a mode keeps from
        # step to step (dptrain's workspace, Opacus' grad_sample) count in its peak
        step = make_step(mode, case, x, y)
        gc.collect()
        base = _rss_bytes()
        if not _reset_hwm():
            print(json.dumps({"error": "cannot reset VmHWM via /proc/self/clear_refs"}))
            return
        for _ in range(steps):
            step()
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        print(json.dumps({"status": "OOM"}))
        return
    peak = _hwm_bytes()
    print(json.dumps({"status": "ok", "base_mb": base / 2**20, "peak_mb": peak / 2**20,
                      "extra_mb": (peak - base) / 2**20}))


def measure_memory_cpu(case: Case, mode: str, steps: int, rows: int | None) -> dict:
    env = dict(os.environ)
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"  # fixed threshold: big frees return to the kernel
    env["OMP_NUM_THREADS"] = "1"
    spec = json.dumps({"case": asdict(case), "mode": mode, "steps": steps, "rows": rows})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", spec]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        print(f"  memory probe failed for {case.name} {mode}: {res.stderr[-500:]}", file=sys.stderr)
        return {"status": "ERR: memory probe failed"}


def measure_memory_cuda(case: Case, mode: str, x, y, steps: int) -> dict:
    """Peak GPU memory of ``steps`` steps of a fresh instance (module docstring)."""
    device, mb = x.device, 2**-20
    warm = step = None
    try:
        warm = make_step(mode, case, x, y)
        warm()
        warm()
        warm = None
        free_memory(device)
        synchronize(device)
        step = make_step(mode, case, x, y)
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            step()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        before_later = torch.cuda.memory_allocated(device)  # persistent buffers now allocated
        torch.cuda.reset_peak_memory_stats(device)
        step()
        step()
        synchronize(device)
        later = torch.cuda.max_memory_allocated(device) - before_later
        return {"status": "ok", "base_mb": base * mb, "peak_mb": peak * mb, "extra_mb": (peak - base) * mb,
                "later_steps_extra_mb": later * mb}
    except Exception as exc:  # noqa: BLE001
        return {"status": _failure(exc, case, mode, "the memory measurement")}
    finally:
        warm = step = None
        free_memory(device)


# ---------------------------------------------------------------------------------- competitor

#: a CPU-bound competitor (``while True: pass``) that also exits when its parent is gone
COMPETITOR = ("import os\np = os.getppid()\nwhile True:\n    for _ in range(1000000):\n        pass\n"
              "    if os.getppid() != p:\n        break\n")


@contextlib.contextmanager
def competitor():
    """A CPU-bound process for the duration of the block; killed afterwards, also on errors."""
    hog = subprocess.Popen([sys.executable, "-c", COMPETITOR])
    try:
        time.sleep(0.5)  # let it start spinning
        yield hog
    finally:
        hog.kill()
        hog.wait()


def _sigterm(signum, frame):  # a timeout's SIGTERM runs the finally blocks (competitor killed)
    raise SystemExit(128 + signum)


# -------------------------------------------------------------------------------------- report


#: the DP step's code: the engines, the noise draw, the batch samplers, the CUDA-graph step (issue 45
#: split engine.py into these; a file that does not exist in a checkout is left out)
ENGINE_FILES = ("engine.py", "base.py", "fast.py", "buffered.py", "noise.py", "sampling.py", "graph.py")


def engine_digest() -> str:
    """Short SHA-256 of the DP step's code in dptrain/privacy/dpsgd/ (ENGINE_FILES; the code under
    test may change between runs)."""
    h, found = hashlib.sha256(), False
    for name in ENGINE_FILES:
        path = ROOT / "dptrain" / "privacy" / "dpsgd" / name
        if path.exists():
            h.update(name.encode() + b"\0" + path.read_bytes())
            found = True
    return h.hexdigest()[:12] if found else "?"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())


def machine_info(device: torch.device) -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import opacus

    info = {
        "cpu": cpu, "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(), "torch": torch.__version__, "opacus": opacus.__version__,
        "torch_cuda": torch.version.cuda,
        "parallel_backend": next((ln.split(":", 1)[-1].strip() for ln in torch.__config__.parallel_info().splitlines()
                                  if "parallel backend" in ln), ""),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"), "engine_sha256_12": engine_digest(),
        "malloc": ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                            if k == "GLIBC_TUNABLES" or k.startswith("MALLOC_")) or "glibc defaults",
        "device": str(device), "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=torch.cuda.get_device_name(device), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpu_capability=f"{props.major}.{props.minor}")
    return info


def machine_lines(info: dict) -> list[str]:
    lines = [
        f"cpu: {info['cpu']}; logical cpus: {info['logical_cpus']}; usable: {info['usable_cpus']}; "
        f"RAM {info['ram_gib']} GiB",
        f"python {info['python']}; torch {info['torch']} (CUDA {info['torch_cuda']}); opacus {info['opacus']}; "
        f"parallel backend {info['parallel_backend']}",
        f"OMP_WAIT_POLICY={info['OMP_WAIT_POLICY']}; dptrain engine sha256[:12]={info['engine_sha256_12']}; "
        f"malloc settings: {info['malloc']}",
        f"device: {info['device']}" + (f" = {info['gpu']} ({info['gpu_memory_gib']} GiB, sm {info['gpu_capability']}); "
                                       f"float32 matmul precision {info['float32_matmul_precision']}"
                                       if "gpu" in info else ""),
    ]
    return lines


class OtherLoad:
    """CPU seconds used by OTHER processes since construction (/proc/stat busy time minus ours):
    a check that the machine was otherwise idle while timing."""

    def __init__(self) -> None:
        self.t0, self.busy0, self.own0 = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
        return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def cores(self) -> float | None:
        try:
            wall = time.perf_counter() - self.t0
            other = max(0.0, (self._busy() - self.busy0) - (self._own() - self.own0))
            return other / wall
        except (OSError, ZeroDivisionError):
            return None


# ----------------------------------------------------------------------------------- one case


def bench_case(case: Case, x, y, args, memory: dict, threads: int, cell_budget: float | None) -> dict:
    """Time every mode of one case at one thread count: idle and (``--contended``) beside a
    busy process, same step objects and K; returns the record kept in the JSON."""
    torch.set_num_threads(threads)
    # a mode that ran out of memory (or was skipped) in the memory measurement is not timed
    status = {m: memory[m]["status"] for m in args.modes
              if m in memory and memory[m].get("status", "").startswith(("OOM", "skipped"))}
    for m in args.modes:
        reason = per_sample_skip(case, m, x.device)
        if reason:
            status[m] = reason
    phases_wanted = ["idle", "contended"] if args.contended else ["idle"]
    budget = cell_budget / len(phases_wanted) if cell_budget is not None else None
    prepared = prepare_modes(case, args.modes, x, y, args, status)
    repeats, rounds = plan_rounds(prepared, args, budget)
    record = {"case": asdict(case), "threads": torch.get_num_threads(), "rows": x.shape[0], "repeats": repeats,
              "phases": {}, "memory": memory}
    for phase in phases_wanted:
        with competitor() if phase == "contended" else contextlib.nullcontext():
            load0, other = loadavg(), OtherLoad()
            rates = run_rounds(case, prepared, (repeats, rounds), status, x.device)
            record["phases"][phase] = {"modes": summarise(rates, prepared, args.modes, status),
                                       "other_cores": other.cores(), "loadavg_before": load0,
                                       "loadavg_after": loadavg()}
    record["sampler_s"] = sampler_cost(case.batch, x, y, 0.05 if args.quick else 0.2)
    prepared.clear()
    free_memory(x.device)
    return record


def memory_for_case(case: Case, x, y, args) -> dict:
    """{mode: memory record} for one case (CPU: subprocess probes; CUDA: in this process)."""
    out = {}
    for mode in args.modes:
        reason = per_sample_skip(case, mode, x.device)
        if reason:
            out[mode] = {"status": reason}
        elif args.no_memory or mode == "baseline-fast":
            out[mode] = {"status": "not measured"}
        elif x.device.type == "cuda":
            out[mode] = measure_memory_cuda(case, mode, x, y, args.memory_steps)
        else:
            slow = mode in PER_SAMPLE_MODES and case.batch * case.num_params() > 2e8
            out[mode] = measure_memory_cpu(case, mode, 2 if slow else args.memory_steps, args.rows)
    return out


# ------------------------------------------------------------------------------------- tables


def _rate(v: float) -> str:
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _cell_ratio(modes: dict, mode: str) -> str:
    """time(mode) / time(nonprivate), or why there is none."""
    r, base = modes.get(mode), modes.get("nonprivate", {})
    if r is None:
        return "-"
    if r["status"] != "ok":
        return "OOM" if r["status"] == "OOM" else r["status"].split(":")[0]
    if base.get("status") != "ok":
        return "-"
    return f"{base['steps_per_s'] / r['steps_per_s']:.2f}"


def _speedup(modes: dict) -> str:
    fast, ghost = modes.get("dptrain-fast", {}), modes.get("opacus-ghost", {})
    if fast.get("status") != "ok" or ghost.get("status") != "ok":
        return "-"
    return f"{fast['steps_per_s'] / ghost['steps_per_s']:.2f}"


def _mem(rec: dict | None, key: str = "extra_mb") -> str:
    if not rec:
        return "-"
    if rec.get("status", "ok") != "ok":
        return {"OOM": "OOM", "not measured": "-"}.get(rec["status"], rec["status"].split(":")[0])
    v = rec.get(key)
    return "-" if v is None else ("<0.5" if v < 0.5 else f"{v:.1f}")


def ratio_table(records: list[dict], phase: str, device: str) -> list[str]:
    order = ["nonprivate", "dptrain-fast", "dptrain-opacus", "opacus-ghost", "opacus-hooks"]  # as the ratios
    mem_modes = [m for m in order if any(m in r["memory"] for r in records)]
    head = ["case", "B", "threads", "nonprivate steps/s", "dptrain-fast", "dptrain-opacus", "opacus-ghost",
            "opacus-hooks", "fast vs ghost", *(f"mem {m} MB" for m in mem_modes), "load (1/5/15 min)",
            "other cores"]
    lines = [f"### {device}, {phase}: step-time ratio time(mode) / time(nonprivate); fast vs ghost = "
             "time(opacus-ghost) / time(dptrain-fast); mem = peak extra MB of a step", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for rec in records:
        ph = rec["phases"].get(phase)
        if ph is None:
            continue
        modes = ph["modes"]
        base = modes.get("nonprivate", {})
        other = ph["other_cores"]
        row = [rec["case"]["name"], rec["case"]["batch"], rec["threads"],
               _rate(base["steps_per_s"]) if base.get("status") == "ok" else base.get("status", "-"),
               *(_cell_ratio(modes, m) for m in ("dptrain-fast", "dptrain-opacus", "opacus-ghost", "opacus-hooks")),
               _speedup(modes), *(_mem(rec["memory"].get(m)) for m in mem_modes),
               " ".join(ph["loadavg_before"].split()[:3]), "-" if other is None else f"{other:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return lines


def contention_table(records: list[dict], device: str) -> list[str]:
    head = ["case", "threads", "mode", "idle steps/s", "contended steps/s", "idle ratio", "contended ratio",
            "slowdown (contended / idle step time)"]
    lines = [f"### {device}: idle vs beside a CPU-bound process (same process, same step objects)", "",
             "| " + " | ".join(head) + " |", "|---|---:|---|" + "---:|" * (len(head) - 3)]
    for rec in records:
        if "contended" not in rec["phases"]:
            continue
        idle, busy = rec["phases"]["idle"]["modes"], rec["phases"]["contended"]["modes"]
        for m in idle:
            a, b = idle[m], busy.get(m, {})
            ok = a.get("status") == "ok" and b.get("status") == "ok"
            row = [rec["case"]["name"], rec["threads"], m,
                   _rate(a["steps_per_s"]) if a.get("status") == "ok" else a.get("status"),
                   _rate(b["steps_per_s"]) if b.get("status") == "ok" else b.get("status", "-"),
                   _cell_ratio(idle, m), _cell_ratio(busy, m),
                   f"{a['steps_per_s'] / b['steps_per_s']:.2f}" if ok else "-"]
            lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return lines


def cuda_memory_table(records: list[dict]) -> list[str]:
    lines = ["### GPU memory per (case, mode): peak - allocated before the first step (persistent buffers "
             "included) / absolute peak (data included), MB", "",
             "| case | " + " | ".join(MODES) + " |", "|---|" + "---:|" * len(MODES)]
    seen = set()
    for rec in records:
        if rec["case"]["name"] in seen:
            continue
        seen.add(rec["case"]["name"])
        cells = [f"{_mem(rec['memory'].get(m))} / {_mem(rec['memory'].get(m), 'peak_mb')}"
                 if rec["memory"].get(m, {}).get("status") == "ok" else _mem(rec["memory"].get(m)) for m in MODES]
        lines.append(f"| {rec['case']['name']} | " + " | ".join(cells) + " |")
    return lines


def print_detail(rec: dict, phase: str) -> None:
    """The per-mode rows of one case (stdout, as the run goes)."""
    modes = rec["phases"][phase]["modes"]
    base = modes.get("nonprivate", {})
    for m, r in modes.items():
        mem = _mem(rec["memory"].get(m))
        if r["status"] != "ok":
            print(f"{rec['case']['name']:15s} {phase:9s} {m:15s} {r['status']:>10s}  mem MB {mem}")
            continue
        ratio = base["steps_per_s"] / r["steps_per_s"] if base.get("status") == "ok" else float("nan")
        print(f"{rec['case']['name']:15s} {phase:9s} {m:15s} {_rate(r['steps_per_s']):>10s} steps/s "
              f"[{r['q1']:.4g}-{r['q3']:.4g}] x{r['blocks']}  ratio {ratio:6.2f}  mem MB {mem}")
    samp = rec["sampler_s"]
    if base.get("status") == "ok":
        print(f"{'':15s} (Poisson sample + gather alone: {samp * 1e3:.3f} ms = "
              f"{samp * base['steps_per_s']:.2f} x the non-private step); load {rec['phases'][phase]['loadavg_before']}"
              f"; other processes {rec['phases'][phase]['other_cores'] or 0:.2f} cores")
    sys.stdout.flush()


def goals(records: list[dict]) -> list[str]:
    """Issue 3's CPU goals, MET / MISSED per case and thread count (idle phase)."""
    out = []
    for rec in records:
        modes, name, b = rec["phases"]["idle"]["modes"], rec["case"]["name"], rec["case"]["batch"]
        fast, base = modes.get("dptrain-fast", {}), modes.get("nonprivate", {})
        if fast.get("status") != "ok" or base.get("status") != "ok":
            continue
        t = rec["threads"]
        if b in (1024, 4096):
            ratio = base["steps_per_s"] / fast["steps_per_s"]
            out.append(f"threads={t}  {name}: dptrain-fast / nonprivate = {ratio:.2f} (goal <= {GOAL_RATIO}): "
                       f"{'MET' if ratio <= GOAL_RATIO else 'MISSED'}")
        mem, base_mem = rec["memory"].get("dptrain-fast", {}), rec["memory"].get("nonprivate", {})
        if b in (1024, 4096) and mem.get("status") == "ok" and base_mem.get("status") == "ok" \
                and base_mem["extra_mb"] >= 1.0:
            mx = mem["extra_mb"] / base_mem["extra_mb"]
            out.append(f"threads={t}  {name}: peak memory dptrain-fast / nonprivate = {mx:.2f} (goal <= "
                       f"{GOAL_MEMORY}): {'MET' if mx <= GOAL_MEMORY else 'MISSED'}")
        if "baseline-fast" in modes and modes["baseline-fast"].get("status") == "ok":
            ab = modes["baseline-fast"]["steps_per_s"] / fast["steps_per_s"]
            out.append(f"threads={t}  {name}: dptrain-fast / baseline-fast = {ab:.3f} (goal <= 1.05, no regression "
                       f"beyond 5%): {'MET' if ab <= 1.05 else 'MISSED'}")
        ghost = modes.get("opacus-ghost", {})
        if rec["case"]["hidden"] and ghost.get("status") == "ok":
            sp = fast["steps_per_s"] / ghost["steps_per_s"]
            out.append(f"threads={t}  {name}: opacus-ghost / dptrain-fast = {sp:.2f} (goal >= {GOAL_GHOST}): "
                       f"{'MET' if sp >= GOAL_GHOST else 'MISSED'}")
    return out


# --------------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default) | cuda | cuda:N")
    p.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                   help="named cases (--list-cases); default: the CPU set on cpu, the issue's six on cuda")
    p.add_argument("--list-cases", action="store_true", help="print the named cases and exit")
    p.add_argument("--models", nargs="+", default=None, choices=["logit", "mlp"],
                   help="older spelling: cases logit-bB / mlp256-bB for the --batches")
    p.add_argument("--batches", type=int, nargs="+", default=None, choices=[256, 1024, 4096])
    p.add_argument("--rows", type=int, default=None, help="N rows for every case (default: max(50 B, 100000))")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="torch thread counts (default: 1 2 on cpu; torch's default on cuda)")
    p.add_argument("--modes", nargs="+", default=MODES, choices=[*MODES, "baseline-fast"])
    p.add_argument("--baseline-engine", type=Path, default=None,
                   help="path of an older dptrain/privacy/dpsgd/engine.py: adds mode baseline-fast (same process, CPU)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--warmup-seconds", type=float, default=1.0)
    p.add_argument("--block-seconds", type=float, default=0.3, help="target duration of one timed block")
    p.add_argument("--max-mode-seconds", type=float, default=20.0,
                   help="a mode's timed blocks take at most about this long per case (slow modes: fewer repeats)")
    p.add_argument("--budget-seconds", type=float, default=None,
                   help="total time to aim at: repeats per case are lowered (not below 2) to fit")
    p.add_argument("--memory-steps", type=int, default=5, help="steps measured for the peak memory")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    p.add_argument("--memory", action="store_true", help="measure memory also with --quick")
    p.add_argument("--contended", action="store_true",
                   help="time every case idle, then beside a CPU-bound process started by this script")
    p.add_argument("--out", type=Path, default=None, help="write the markdown tables here and a JSON next to it")
    p.add_argument("--render", type=Path, default=None, metavar="JSON",
                   help="print (and with --out write) the tables of an earlier run's JSON; runs nothing")
    p.add_argument("--quick", action="store_true",
                   help="short run: 1 thread, 2 repeats, short blocks and warm-up, no memory (unless --memory)")
    p.add_argument("--memory-probe", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refusals (exit 2, naming the option, the value and what is allowed) and defaults."""
    if args.memory_probe or args.list_cases or args.render:
        return
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        p.error(f"--device {args.device!r} is not allowed: allowed: cpu | cuda | cuda:N")
    if args.device.startswith("cuda"):
        try:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:  # noqa: BLE001  (a broken driver: as no GPU)
            count = 0
        if count == 0:
            p.error(f"--device {args.device} is not allowed here: torch sees no CUDA device (torch "
                    f"{torch.__version__}{', a CPU-only build' if torch.version.cuda is None else ''}); "
                    "allowed: --device cpu")
        if ":" in args.device and int(args.device.split(":")[1]) >= count:
            p.error(f"--device {args.device} is not allowed here: this machine has {count} CUDA device(s): "
                    f"allowed: cuda, cuda:0..cuda:{count - 1}, cpu")
        if args.baseline_engine is not None:
            p.error("--baseline-engine is not allowed with --device cuda: allowed only with --device cpu")
    cuda = args.device.startswith("cuda")
    if args.models or args.batches:
        if args.cases:
            p.error("--cases is not allowed with --models/--batches: allowed: one of the two spellings")
        tag = {"logit": "logit", "mlp": "mlp256"}
        args.cases = [f"{tag[m]}-b{b}" for m in args.models or ["logit", "mlp"]
                      for b in args.batches or [256, 1024, 4096]]
    args.cases = args.cases or (CUDA_DEFAULT_CASES if cuda else CPU_DEFAULT_CASES)
    unknown = [c for c in args.cases if c not in ALL_CASE_NAMES]
    if unknown:
        p.error(f"--cases {' '.join(unknown)} is not allowed: allowed: {', '.join(ALL_CASE_NAMES)}")
    if args.rows is not None and args.rows < 2:
        p.error(f"--rows {args.rows} is not allowed: allowed: an integer >= 2 (and above each case's B)")
    args.threads = args.threads or ([1] if args.quick else [torch.get_num_threads()] if cuda else [1, 2])
    args.min_warmup_steps = 2
    if args.quick:
        args.repeats, args.warmup_steps, args.warmup_seconds, args.block_seconds = 2, 3, 0.1, 0.03
        args.max_mode_seconds, args.min_warmup_steps, args.memory_steps = 0.3, 1, 2
        args.no_memory = args.no_memory or not args.memory
    if "nonprivate" not in args.modes:
        args.modes = ["nonprivate", *args.modes]
    args.modes = [m for m in MODES if m in args.modes]


def load_baseline_engine(path: Path) -> None:
    global BASELINE_ENGINE
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_engine", path)
    BASELINE_ENGINE = importlib.util.module_from_spec(spec)
    sys.modules["baseline_engine"] = BASELINE_ENGINE  # dataclasses look their module up
    spec.loader.exec_module(BASELINE_ENGINE)


def header_lines(args, info: dict, cases: list[Case]) -> list[str]:
    rows = "N = max(50 B, 100000)" if args.rows is None else f"N = {args.rows} (--rows)"
    lines = ["bench_step: one DP-SGD training step vs non-private, same process",
             "command: " + " ".join(["python", "scripts/bench_step.py", *sys.argv[1:]]),
             *machine_lines(info),
             f"load average at start: {info['loadavg_start']}",
             f"data: x (N, d) float32, y (N,) in memory on {info['device']}, {rows}; C={C}, sigma={SIGMA}, "
             f"SGD lr={LR}, Poisson sampling (make_sampler) in every DP mode",
             f"timing: warm-up {args.warmup_steps} steps or {args.warmup_seconds} s (>= {args.min_warmup_steps} "
             f"steps), up to {args.repeats} repeats of ~{args.block_seconds} s blocks per mode, interleaved "
             f"(a mode's blocks <= ~{args.max_mode_seconds} s per case); median steps/s"
             + (f"; budget {args.budget_seconds} s" if args.budget_seconds else ""),
             "ratio = step time(mode) / step time(nonprivate), from the medians, same process; "
             "mem = peak extra memory of a step, persistent buffers included "
             + ("(GPU: max_memory_allocated - memory_allocated before the first step of a fresh instance)"
                if info["device"].startswith("cuda") else
                "(CPU: VmHWM - RSS before the first step, fresh 1-thread process; resolution ~0.5 MB)"),
             "cases: " + "; ".join(c.describe() + ("" if c.source == "built in" else f" [{c.source}]")
                                   for c in cases)]
    return lines


def run(args) -> tuple[list[dict], list[str]]:
    """Every case at every thread count; returns the records and the header lines. The tables
    are rewritten (``--out``) after every case, so a run stopped by a timeout leaves its cases."""
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device)
    args.info = info = machine_info(device)
    info["command"] = " ".join(["python", "scripts/bench_step.py", *sys.argv[1:]])
    info["loadavg_start"] = loadavg()
    cases = resolve_cases(args.cases)
    bad = [c.name for c in cases if num_rows(c.batch, args.rows) <= c.batch]
    if bad:
        raise SystemExit(f"error: --rows {args.rows} is not allowed for {', '.join(bad)}: allowed: more rows than B")
    head = header_lines(args, info, cases)
    for line in head:
        print("# " + line)
    sys.stdout.flush()
    t_start, records, args.case_errors = time.perf_counter(), [], []
    cells_left = len(cases) * len(args.threads)
    for i, case in enumerate(cases):
        try:
            cells_left = bench_all_threads(case, device, args, records, (t_start, cells_left))
        except Exception as exc:  # noqa: BLE001  (the data or every mode failed: the next case still runs)
            cells_left -= len(args.threads)
            args.case_errors.append(f"{case.name}: {_failure(exc, case, 'all modes', 'the case')}")
        free_memory(device)
        write_outputs(records, [*head, f"PARTIAL: {i + 1} of {len(cases)} cases so far"], args)
    info.update(loadavg_end=loadavg(), total_seconds=round(time.perf_counter() - t_start, 1))
    head.append(f"load average at end: {info['loadavg_end']}; total {info['total_seconds']:.0f} s")
    return records, head


def bench_all_threads(case: Case, device: torch.device, args, records: list[dict], clock: tuple) -> int:
    """One case: data, memory, then every thread count; returns the cells left."""
    t_start, cells_left = clock
    t0 = time.perf_counter()
    x, y = make_data(case, device, args.rows)
    memory = memory_for_case(case, x, y, args)
    print(f"# {case.name}: data and memory {time.perf_counter() - t0:.0f} s")
    for threads in args.threads:
        budget = None
        if args.budget_seconds is not None:
            budget = max(0.0, args.budget_seconds - (time.perf_counter() - t_start)) / cells_left
        rec = bench_case(case, x, y, args, memory, threads, budget)
        cells_left -= 1
        records.append(rec)
        print(f"## {case.name}, threads = {rec['threads']}, repeats = {rec['repeats']}")
        for phase in rec["phases"]:
            print_detail(rec, phase)
    return cells_left


def report(records: list[dict], head: list[str], args) -> list[str]:
    device = args.info["device"]
    lines = [f"# bench_step on {device}", "", *(f"- {h}" for h in head), "", *ratio_table(records, "idle", device)]
    if args.contended:
        lines += ["", *ratio_table(records, "contended", device), "", *contention_table(records, device)]
    if device.startswith("cuda") and not args.no_memory:
        lines += ["", *cuda_memory_table(records)]
    g = goals(records)
    if g:
        lines += ["", "### goals (issue 3, CPU targets)", "", *(f"- {x}" for x in g)]
    if args.case_errors:
        lines += ["", "### cases that failed", "", *(f"- {e}" for e in args.case_errors)]
    if engine_digest() != args.engine_digest:
        lines += ["", "WARNING: the DP step's code (dptrain/privacy/dpsgd/) changed during the run "
                      f"({args.engine_digest} -> {engine_digest()})"]
    return lines


def write_outputs(records: list[dict], head: list[str], args) -> list[str]:
    """The markdown report (``--out``) and the JSON next to it; returns the report's lines."""
    lines = report(records, head, args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        payload = {"machine": args.info, "args": {k: v for k, v in vars(args).items() if k != "info"},
                   "case_errors": args.case_errors, "header": head, "records": records}
        args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return lines


def render(json_file: Path, out: Path | None) -> int:
    """The markdown of a saved run (``--render``), with this version's table layout."""
    data = json.loads(json_file.read_text())
    saved = data["args"]
    args = Namespace(info=data["machine"], contended=saved["contended"], no_memory=saved["no_memory"],
                     case_errors=data.get("case_errors", []), engine_digest=engine_digest(), out=None)
    command = args.info.get("command") or " ".join([
        "python scripts/bench_step.py", f"--device {saved['device']}", "--cases", *saved["cases"], "--threads",
        *(str(t) for t in saved["threads"]), *(["--contended"] if saved["contended"] else []),
        *(["--quick"] if saved["quick"] else []), f"--repeats {saved['repeats']}",
        f"--max-mode-seconds {saved['max_mode_seconds']}", f"--out {saved['out']}"])
    head = data.get("header") or [
        f"command: {command}", *machine_lines(args.info),
        f"load average at start: {args.info.get('loadavg_start')}; at end: {args.info.get('loadavg_end')}; "
        f"total {args.info.get('total_seconds')} s"]
    head = [f"rendered from {json_file.name} by --render", *head]
    lines = report(data["records"], head, args)
    lines = [ln for ln in lines if not ln.startswith(("WARNING: dptrain/privacy/dpsgd/engine.py changed",
                                                       "WARNING: the DP step's code"))]
    print("\n".join(lines))
    if out is not None:
        out.write_text("\n".join(lines) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_probe:
        memory_probe(args.memory_probe)
        return 0
    if args.render is not None:
        return render(args.render, args.out)
    if args.list_cases:
        for c in resolve_cases(ALL_CASE_NAMES):
            print(c.describe() + ("" if c.source == "built in" else f" [{c.source}]"))
        return 0
    signal.signal(signal.SIGTERM, _sigterm)
    if args.baseline_engine is not None:
        load_baseline_engine(args.baseline_engine)
        args.modes.append("baseline-fast")
    args.engine_digest = engine_digest()
    records, head = run(args)
    lines = write_outputs(records, head, args)
    print()
    print("\n".join(lines))
    if args.out is not None:
        print(f"# wrote {args.out} and {args.out.with_suffix('.json')}")
    failed = [(r["case"]["name"], m) for r in records for ph in r["phases"].values()
              for m, v in ph["modes"].items() if v["status"].startswith("ERR")]
    if failed or args.case_errors:
        print(f"# failed (not OOM): {failed + args.case_errors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
