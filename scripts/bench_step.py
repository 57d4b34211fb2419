#!/usr/bin/env python
"""Benchmark one training step: non-private vs DP-SGD (dptrain fast path, Opacus hooks, Opacus ghost).

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_step.py              # full run (both thread counts)
    python scripts/bench_step.py --quick                              # short smoke run
    python scripts/bench_step.py --threads 2 --models mlp --batches 1024

For every thread count, model (``logit``: 100 -> 1, ``mlp``: 100-256-256-1 ReLU) and expected
batch size B (256, 1024, 4096) it builds, IN ONE PROCESS, one step function per mode on the same
in-memory tensors x (N, 100), y (N,) with N = max(50 B, 100,000), no DataLoader:

* ``nonprivate``      plain PyTorch: a fixed-size batch (contiguous slice of a per-epoch
                      permutation), forward, ``per_example_loss(...).mean().backward()``,
                      ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``.
* ``dptrain-fast``    ``PoissonSampler`` + ``make_engine(engine="fast")`` + ``optimizer.step()``.
* ``dptrain-opacus``  the same with ``engine="opacus"`` (Opacus per-sample gradients, our clipping).
* ``opacus-hooks``    Opacus' standard path: ``GradSampleModule`` + ``DPOptimizer``
                      (loss_reduction="mean"), on the same Poisson-sampled batches.
* ``opacus-ghost``    Opacus' ghost clipping: ``GradSampleModuleFastGradientClipping`` +
                      ``DPOptimizerFastGradientClipping`` + ``DPLossFastGradientClipping``.

All DP modes use C = 1, sigma = 1 and the Poisson sampler (sample rate B / N), so they pay for
sampling as real DP-SGD does. Timing: warm-up (20 steps or 1 s, at least 2 steps), then R
repeats; in each repeat every mode runs K steps (K chosen from the warm-up so that a block takes
about 0.3 s, at least 1 step), modes interleaved round-robin (order rotated per repeat) so drift
hits all of them alike. Reported: median steps/s over the repeats, the ratio of step times
time(mode) / time(nonprivate) (from the medians), and the peak extra memory of a step.

Peak memory: torch keeps no allocator statistics on CPU, so each (model, B, mode) is measured
in a fresh subprocess of this script (hidden ``--memory-probe``): build data, run 2 steps of the
mode on a throw-away model (one-time set-up costs), build a fresh model and mode, take the
resident set size as the base BEFORE its first step (so buffers a mode keeps between steps, such
as dptrain's workspace, are counted), reset the kernel's high-water mark
(``echo 5 > /proc/self/clear_refs``), run a few steps, and report VmHWM - base. The probe
process runs with 1 thread and a fixed glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_``) so
that freed tensors go back to the kernel and the base is the steady state, not cached heap.

The environment variable OMP_WAIT_POLICY is set to PASSIVE (unless already set) BEFORE torch is
imported: on a 2-core machine, OpenMP threads that busy-wait can turn a 0.2 ms step into 30 ms
as soon as anything else runs.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede `import torch`

import argparse
import gc
import hashlib
import json
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from dptrain.models import logit, mlp
from dptrain.objectives import BINARY
from dptrain.privacy.engine import PoissonSampler, make_engine

per_example_loss = BINARY.per_example_loss  # binary cross-entropy with logits, one per example


IN_FEATURES = 100
C = 1.0
SIGMA = 1.0
LR = 0.1
MODELS = {
    "logit": lambda: logit(in_features=IN_FEATURES),
    "mlp": lambda: mlp(in_features=IN_FEATURES, hidden=[256, 256], activation="relu"),
}
MODES = ["nonprivate", "dptrain-fast", "dptrain-opacus", "opacus-hooks", "opacus-ghost"]
BASELINE_ENGINE = None  # --baseline-engine: an older engine module, timed as mode baseline-fast
BATCHES = [256, 1024, 4096]
GOAL_RATIO = 1.3  # DP / non-private step time, logit and MLP at B = 1024, 4096
GOAL_GHOST = 2.0  # opacus-ghost / dptrain-fast step time, MLP
GOAL_MEMORY = 1.5  # peak extra memory dptrain-fast / nonprivate (where nonprivate >= 1 MB)

warnings.filterwarnings("ignore", category=UserWarning)  # Opacus' hook warnings; not timing-relevant
warnings.filterwarnings("ignore", category=FutureWarning)


# ----------------------------------------------------------------------------------------- data


def _secret_streams():
    """dptrain's run randomness (dptrain.privacy.randomness), or None for a checkout that
    predates it (so the script can measure an older engine as the baseline)."""
    try:
        from dptrain.privacy.randomness import Randomness
    except ImportError:
        return None
    return Randomness.fresh()


def num_rows(batch: int) -> int:
    return max(50 * batch, 100_000)


def make_data(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1), y from a noisy logistic model (so some examples are clipped, some not)."""
    g = torch.Generator().manual_seed(1234)
    n = num_rows(batch)
    x = torch.randn(n, IN_FEATURES, generator=g)
    w = torch.randn(IN_FEATURES, generator=g) / IN_FEATURES**0.5
    y = (torch.rand(n, generator=g) < torch.sigmoid(x @ w)).to(torch.float32)
    return x, y


# ---------------------------------------------------------------------------------------- modes


def make_step(mode: str, model_name: str, batch: int, x: torch.Tensor, y: torch.Tensor):
    """A zero-argument function running one full training step of ``mode``."""
    torch.manual_seed(0)  # same initial weights in every mode
    model = MODELS[model_name]()
    model.train()
    n = x.shape[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    if mode == "nonprivate":
        gen = torch.Generator().manual_seed(2)
        state = {"perm": None, "pos": n}

        def step() -> None:
            if state["pos"] + batch > n:  # new epoch: reshuffle (its cost is part of the step)
                state["perm"] = torch.randperm(n, generator=gen)
                state["pos"] = 0
            idx = state["perm"][state["pos"] : state["pos"] + batch]
            state["pos"] += batch
            loss = per_example_loss(model(x.index_select(0, idx)), y.index_select(0, idx)).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    sampler = PoissonSampler(num_rows=n, sample_rate=batch / n, rng=np.random.default_rng(0))

    if mode in ("dptrain-fast", "dptrain-opacus"):
        # the streams a training run uses: secret, seeded from the OS CSPRNG (full MT19937 state)
        secret = _secret_streams()
        if secret is not None:
            sampler = PoissonSampler(num_rows=n, sample_rate=batch / n, rng=secret.numpy("poisson-sampler"))
        engine = make_engine(
            model,
            engine=mode.split("-")[1],
            max_grad_norm=C,
            noise_multiplier=SIGMA,
            expected_batch_size=batch,
            generator=secret.torch("gaussian-noise") if secret is not None else torch.Generator().manual_seed(1),
        )
        # as in dptrain's training loop, where diagnostics are computed on logged steps only
        engine.collect_stats = False

        def step() -> None:
            idx = sampler.sample()
            engine(x.index_select(0, idx), y.index_select(0, idx))
            optimizer.step()

        return step

    if mode == "opacus-hooks":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
        dp_opt = DPOptimizer(
            optimizer,
            noise_multiplier=SIGMA,
            max_grad_norm=C,
            expected_batch_size=batch,
            loss_reduction="mean",
            generator=torch.Generator().manual_seed(1),
        )

        def step() -> None:
            idx = sampler.sample()
            loss = per_example_loss(gsm(x.index_select(0, idx)), y.index_select(0, idx)).mean()
            loss.backward()
            dp_opt.step()
            dp_opt.zero_grad(set_to_none=True)

        return step

    if mode == "opacus-ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        gsm = GradSampleModuleFastGradientClipping(
            model, batch_first=True, loss_reduction="mean", max_grad_norm=C, use_ghost_clipping=True
        )
        dp_opt = DPOptimizerFastGradientClipping(
            optimizer,
            noise_multiplier=SIGMA,
            max_grad_norm=C,
            expected_batch_size=batch,
            loss_reduction="mean",
            generator=torch.Generator().manual_seed(1),
        )
        criterion = DPLossFastGradientClipping(gsm, dp_opt, _BCEWithLogits(), loss_reduction="mean")

        def step() -> None:
            idx = sampler.sample()
            loss = criterion(gsm(x.index_select(0, idx)), y.index_select(0, idx))  # per-example losses, wrapped
            loss.backward()  # Opacus: first backward (norms), clip factors, second backward
            dp_opt.step()
            dp_opt.zero_grad(set_to_none=True)

        return step

    if mode == "baseline-fast":
        # an older engine.py (--baseline-engine), with its own seeding (manual_seed), timed in
        # the same process as dptrain-fast: before/after ratios without cross-run drift
        engine = BASELINE_ENGINE.make_engine(
            model, engine="fast", private=True, max_grad_norm=C, noise_multiplier=SIGMA,
            expected_batch_size=batch, generator=torch.Generator().manual_seed(1),
        )
        engine.collect_stats = False

        def step() -> None:
            idx = sampler.sample()
            engine(x.index_select(0, idx), y.index_select(0, idx))
            optimizer.step()

        return step

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


def warm_up(step, max_steps: int, max_seconds: float) -> float:
    """Run warm-up steps; return the estimated seconds per step (from the second half)."""
    times = []
    start = time.perf_counter()
    while len(times) < max_steps and (len(times) < 2 or time.perf_counter() - start < max_seconds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[len(times) // 2 :])


def time_block(step, k: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    return time.perf_counter() - t0


def sampler_cost(batch: int, x: torch.Tensor, y: torch.Tensor, seconds: float = 0.2) -> float:
    """Seconds per Poisson sample + gather (the part of a DP step that sampling costs)."""
    n = x.shape[0]
    sampler = PoissonSampler(num_rows=n, sample_rate=batch / n, rng=np.random.default_rng(0))
    for _ in range(5):
        idx = sampler.sample()
        x.index_select(0, idx), y.index_select(0, idx)
    k, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        idx = sampler.sample()
        x.index_select(0, idx), y.index_select(0, idx)
        k += 1
    return (time.perf_counter() - t0) / k


def bench_cell(model_name: str, batch: int, modes: list[str], args) -> dict:
    """Median steps/s (and spread) of every mode for one (model, B), modes interleaved."""
    x, y = make_data(batch)
    steps = {m: make_step(m, model_name, batch, x, y) for m in modes}
    ks = {}
    for m in modes:
        t_step = warm_up(steps[m], args.warmup_steps, args.warmup_seconds)
        ks[m] = max(1, round(args.block_seconds / t_step))
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.repeats):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for m in order:
            rates[m].append(ks[m] / time_block(steps[m], ks[m]))
    out = {}
    for m in modes:
        q = statistics.quantiles(rates[m], n=4) if len(rates[m]) > 1 else [rates[m][0]] * 3
        out[m] = {"steps_per_s": statistics.median(rates[m]), "q1": q[0], "q3": q[2], "k": ks[m]}
    out["_sampler_s"] = sampler_cost(batch, x, y)
    del steps
    gc.collect()
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


def memory_probe(model_name: str, batch: int, mode: str, steps: int) -> None:
    """(Subprocess) print JSON: peak extra resident memory of ``steps`` steps of ``mode``."""
    torch.set_num_threads(1)
    x, y = make_data(batch)
    # one-time costs (kernel set-up, thread pools, lazy imports) on a throw-away instance ...
    warm = make_step(mode, model_name, batch, x, y)
    warm()
    warm()
    del warm
    gc.collect()
    # ... then a fresh one, measured from before its first step: buffers a mode keeps from
    # step to step (dptrain's workspace, Opacus' grad_sample) count in its peak
    step = make_step(mode, model_name, batch, x, y)
    gc.collect()
    base = _rss_bytes()
    if not _reset_hwm():
        print(json.dumps({"error": "cannot reset VmHWM via /proc/self/clear_refs"}))
        return
    for _ in range(steps):
        step()
    peak = _hwm_bytes()
    print(json.dumps({"base_mb": base / 2**20, "peak_mb": peak / 2**20, "extra_mb": (peak - base) / 2**20}))


def measure_memory(model_name: str, batch: int, mode: str, steps: int) -> float | None:
    env = dict(os.environ)
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"  # fixed threshold: big frees return to the kernel
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", model_name, str(batch), mode, str(steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
        return data.get("extra_mb")
    except (IndexError, json.JSONDecodeError):
        print(f"  memory probe failed for {model_name} B={batch} {mode}: {res.stderr[-500:]}", file=sys.stderr)
        return None


# -------------------------------------------------------------------------------------- report


def engine_digest() -> str:
    """Short SHA-256 of dptrain/privacy/engine.py (the file under test may change between runs)."""
    engine_file = ROOT / "dptrain" / "privacy" / "engine.py"
    return hashlib.sha256(engine_file.read_bytes()).hexdigest()[:12] if engine_file.exists() else "?"


def machine_description() -> list[str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import opacus

    digest = engine_digest()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    backend = next(
        (ln.strip() for ln in torch.__config__.parallel_info().splitlines() if "parallel backend" in ln),
        "",
    )
    return [
        f"cpu: {cpu}; logical cpus: {os.cpu_count()}; usable: {len(os.sched_getaffinity(0))}; RAM {mem_gib:.1f} GiB",
        f"python {platform.python_version()}; torch {torch.__version__}; opacus {opacus.__version__}; {backend}",
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; dptrain engine.py sha256[:12]={digest}",
        "malloc settings: " + (", ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                                         if k == "GLIBC_TUNABLES" or k.startswith("MALLOC_")) or "glibc defaults"),
        f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
    ]


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

    def report(self) -> str:
        try:
            wall = time.perf_counter() - self.t0
            other = max(0.0, (self._busy() - self.busy0) - (self._own() - self.own0))
            text = (f"other processes used {other:.1f} CPU-s over {wall:.0f} s wall "
                    f"({other / wall:.2f} cores on average)")
            if other / wall > 0.05:
                text += " -- WARNING: the machine was not idle, these timings are contaminated; re-run"
            return text
        except OSError:
            return "other-process CPU time unavailable"


def fmt_row(cols, widths) -> str:
    return "  ".join(str(c).rjust(w) if i > 2 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts (default: 1 2)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    p.add_argument("--modes", nargs="+", default=MODES, choices=[*MODES, "baseline-fast"])
    p.add_argument("--baseline-engine", type=Path, default=None,
                   help="path of an older dptrain/privacy/engine.py: adds mode baseline-fast (same process)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--warmup-seconds", type=float, default=1.0)
    p.add_argument("--block-seconds", type=float, default=0.3, help="target duration of one timed block")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--quick", action="store_true", help="short run: 3 repeats, short blocks and warm-up")
    p.add_argument("--memory-probe", nargs=4, metavar=("MODEL", "B", "MODE", "STEPS"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.memory_probe:
        m, b, mode, s = args.memory_probe
        memory_probe(m, int(b), mode, int(s))
        return
    if args.quick:
        args.repeats, args.warmup_steps, args.warmup_seconds, args.block_seconds = 3, 5, 0.3, 0.08
    if "nonprivate" not in args.modes:
        args.modes = ["nonprivate", *args.modes]
    args.modes = [m for m in MODES if m in args.modes]
    if args.baseline_engine is not None:
        global BASELINE_ENGINE
        import importlib.util

        spec = importlib.util.spec_from_file_location("baseline_engine", args.baseline_engine)
        BASELINE_ENGINE = importlib.util.module_from_spec(spec)
        sys.modules["baseline_engine"] = BASELINE_ENGINE  # dataclasses look their module up
        spec.loader.exec_module(BASELINE_ENGINE)
        args.modes.append("baseline-fast")

    t_start = time.perf_counter()
    digest0 = engine_digest()
    print("# bench_step: one DP-SGD training step vs non-private, same process")
    for line in machine_description():
        print("# " + line)
    print(
        f"# data: x (N, {IN_FEATURES}) float32, y (N,) in memory, N = max(50 B, 100000); "
        f"C={C}, sigma={SIGMA}, SGD lr={LR}"
    )
    print(
        f"# timing: warm-up {args.warmup_steps} steps or {args.warmup_seconds} s (>= 2 steps), {args.repeats} repeats "
        f"of ~{args.block_seconds} s blocks per mode, interleaved; median steps/s; [q1-q3] = interquartile range"
    )
    print(
        "# ratio = step time(mode) / step time(nonprivate), from the medians; "
        "mem MB = peak extra RSS of the steps, persistent buffers included "
        "(VmHWM - RSS before the first step; resolution ~0.5 MB); "
        "mem x = mem / nonprivate mem (shown if nonprivate >= 1 MB)"
    )
    sys.stdout.flush()

    memory: dict[tuple[str, int, str], float | None] = {}
    if not args.no_memory:
        t0 = time.perf_counter()
        for model_name in args.models:
            for b in args.batches:
                for mode in args.modes:
                    slow = mode in ("opacus-hooks", "dptrain-opacus") and model_name == "mlp" and b >= 4096
                    memory[(model_name, b, mode)] = measure_memory(model_name, b, mode, 2 if slow else 5)
        print(f"# memory probes: {time.perf_counter() - t0:.0f} s (1 thread, fresh process each)")

    widths = [6, 6, 15, 10, 17, 7, 9, 7]
    header = ["model", "B", "mode", "steps/s", "[q1-q3]", "ratio", "mem MB", "mem x"]
    goals = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        load = OtherLoad()
        print()
        print(f"## threads = {torch.get_num_threads()} (torch.set_num_threads({threads}))")
        print(fmt_row(header, widths))
        print("  ".join("-" * w for w in widths))
        for model_name in args.models:
            for b in args.batches:
                res = bench_cell(model_name, b, args.modes, args)
                base_rate = res["nonprivate"]["steps_per_s"]
                base_mem = memory.get((model_name, b, "nonprivate"))
                for mode in args.modes:
                    r = res[mode]
                    ratio = base_rate / r["steps_per_s"]
                    mem = memory.get((model_name, b, mode))
                    mem_s = "-" if mem is None else ("<0.5" if mem < 0.5 else f"{mem:.1f}")
                    mem_x = ("-" if mem is None or mem < 0.5 or base_mem is None or base_mem < 1.0
                             else f"{mem / base_mem:.1f}")
                    rate_s = f"{r['steps_per_s']:.3g}" if r["steps_per_s"] < 100 else f"{r['steps_per_s']:.0f}"
                    spread = f"[{r['q1']:.4g}-{r['q3']:.4g}]"
                    print(fmt_row([model_name, b, mode, rate_s, spread, f"{ratio:.2f}", mem_s, mem_x], widths))
                samp = res["_sampler_s"]
                print(
                    f"{'':6}  {'':6}  (Poisson sample + gather alone: {samp * 1e3:.3f} ms = "
                    f"{samp * base_rate:.2f} x the non-private step)"
                )
                sys.stdout.flush()
                if "dptrain-fast" in res:
                    fast = base_rate / res["dptrain-fast"]["steps_per_s"]
                    if b in (1024, 4096):
                        goals.append((threads, f"{model_name} B={b}: dptrain-fast / nonprivate = {fast:.2f}",
                                      fast <= GOAL_RATIO, f"<= {GOAL_RATIO}"))
                    mem, base_mem = (memory.get((model_name, b, "dptrain-fast")),
                                     memory.get((model_name, b, "nonprivate")))
                    if (b in (1024, 4096) and threads == args.threads[0] and mem is not None
                            and base_mem is not None and base_mem >= 1.0):
                        mx = mem / base_mem
                        goals.append((threads, f"{model_name} B={b}: peak memory dptrain-fast / nonprivate = {mx:.2f}",
                                      mx <= GOAL_MEMORY, f"<= {GOAL_MEMORY}"))
                    if "baseline-fast" in res:  # this engine against the older one, same process
                        ab = res["baseline-fast"]["steps_per_s"] / res["dptrain-fast"]["steps_per_s"]
                        goals.append((threads, f"{model_name} B={b}: dptrain-fast / baseline-fast = {ab:.3f}",
                                      ab <= 1.05, "<= 1.05, no regression beyond 5%"))
                    if model_name == "mlp" and "opacus-ghost" in res:
                        sp = res["dptrain-fast"]["steps_per_s"] / res["opacus-ghost"]["steps_per_s"]
                        goals.append((threads, f"mlp B={b}: opacus-ghost / dptrain-fast = {sp:.2f}",
                                      sp >= GOAL_GHOST, f">= {GOAL_GHOST}"))
        print(f"# threads={threads}: {load.report()}")
    print()
    print("## goals")
    for threads, text, ok, target in goals:
        print(f"threads={threads}  {text:50s} (goal {target}): {'MET' if ok else 'MISSED'}")
    print()
    print(f"# load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"total {time.perf_counter() - t_start:.0f} s")
    if engine_digest() != digest0:
        print(f"# WARNING: dptrain/privacy/engine.py changed during the run ({digest0} -> {engine_digest()})")


if __name__ == "__main__":
    main()
