"""Time this checkout's DP step against an older engine and against torch's float32 normal_, in ONE
process (A/B), with an A/A pair for the noise band.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_engine_ab.py [OLD] [--model preset-mlp]
        [--threads 1 2] [--blocks 40] [--steps 50] [--draws]

Variants, each one training step (Poisson sample, ``index_select``, the engine, ``SGD.step``;
diagnostics off as on unlogged steps) on in-memory rows x ~ N(0, 1), sigma 1, C 1:

* ``new``: this checkout's engine; ``new-again``: a second engine of its own (the A/A pair);
* ``normal``: the SAME engine as ``new`` with its noise draw switched to torch's float32
  ``normal_`` for the block (the engine before the refined float32 draw, issue 29: its law is
  truncated at |z| = 5.77; timing only), so that new / normal is the draw's effect alone;
* ``old``: the fast engine of OLD: either a standalone ``dptrain/privacy/dpsgd/engine.py`` of a
  commit before issue 45, when the engine was one file (``git show COMMIT:dptrain/privacy/dpsgd/engine.py
  > old_engine.py``), or the root of an older checkout (``git worktree add /tmp/old COMMIT``),
  whose ``dptrain`` package is loaded as ``dptrain_old`` (a copy with its imports renamed) so
  that both engines live in this process.

Models: ``preset-mlp`` (experiment=mlp: 112-64-64-1 ReLU, B = 1,024, 11,457 noise coordinates),
``preset-logit`` (112 -> 1, B = 1,024), ``mlp256`` (100-256-256-1, B = 1,024, 91,905 coordinates);
N = 100,000 rows. Blocks of ``--steps`` steps of every variant are interleaved (order rotating);
printed per thread count, for the wall time and for the process's CPU time per step (steadier on
a shared machine): the median of each variant, each ratio of medians, the quartiles of the
block-by-block ratios (the spread) and the load average before and after.
``--draws`` first times the noise draws alone (torch's float32 normal_, the refined draw, the
float64 draw and, with OLD, its refined draw) for the model's coordinate count.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede `import torch`

import argparse
import importlib
import importlib.util
import inspect
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dptrain.models.networks import logit, mlp  # noqa: E402
from dptrain.models.objectives import BINARY  # noqa: E402
from dptrain.privacy.dpsgd import engine as new  # noqa: E402
from dptrain.privacy.dpsgd import noise  # noqa: E402
from dptrain.privacy.dpsgd.sampling import PoissonSampler  # noqa: E402

N, B = 100_000, 1024
MODELS = {"preset-mlp": (112, [64, 64]), "preset-logit": (112, None), "mlp256": (100, [256, 256])}


def _model(name: str, networks=None) -> torch.nn.Module:
    """The model, built by ``networks`` (an older checkout's dptrain_old.models.networks: its own
    Squeeze) or this checkout's."""
    torch.manual_seed(0)
    d, hidden = MODELS[name]
    build_logit, build_mlp = (networks.logit, networks.mlp) if networks is not None else (logit, mlp)
    return build_logit(in_features=d) if hidden is None else build_mlp(in_features=d, hidden=hidden, activation="relu")


def _engine(make_engine, model: torch.nn.Module, seed: int, objective=BINARY):
    kw = dict(engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=B,
              generator=torch.Generator().manual_seed(seed), objective=objective)
    if "private" in inspect.signature(make_engine).parameters:  # engines before issue 12
        kw["private"] = True
    eng = make_engine(model, **kw)
    eng.collect_stats = False
    return eng


def _normal_draw(eng):
    """The engine before the refined float32 draw: torch's float32 normal_ on the step's coordinates."""
    n, gen = eng.noise.coordinates, eng.generator

    def draw() -> torch.Tensor:
        return torch.empty(n, dtype=torch.float32).normal_(0.0, 1.0, generator=gen)

    return draw


def make_step(variant: str, model_name: str, x: torch.Tensor, y: torch.Tensor, old=None):
    """One variant's training step, on its own model, engine and sampler."""
    mine = variant != "old"
    model = _model(model_name, None if mine else getattr(old, "networks", None))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eng = _engine(new.make_engine if mine else old.make_engine, model, seed=len(variant),
                  objective=BINARY if mine else getattr(old, "binary", BINARY))
    sampler = PoissonSampler(num_rows=N, sample_rate=B / N, rng=np.random.default_rng(len(variant)))

    def step() -> None:
        idx = sampler.sample()
        eng(x.index_select(0, idx), y.index_select(0, idx))
        opt.step()

    step.engine = eng
    return step


def make_steps(model_name: str, x: torch.Tensor, y: torch.Tensor, old=None) -> dict:
    """The variants: ``new`` and ``normal`` are ONE engine whose draw is switched before each block
    (the draw's own effect, free of where each engine's buffers happen to lie in memory); ``old``
    and ``new-again`` have engines of their own (the A/B against the older engine, the A/A band)."""
    shared = make_step("new", model_name, x, y)
    eng, normal = shared.engine, _normal_draw(shared.engine)

    def with_draw(draw):
        def step() -> None:
            if draw is None:
                eng.noise.__dict__.pop("draw", None)  # the class's own draw
            else:
                eng.noise.draw = draw
            shared()

        step.engine = eng
        return step

    steps = {"new": with_draw(None), "normal": with_draw(normal)}
    if old is not None:
        steps["old"] = make_step("old", model_name, x, y, old)
    steps["new-again"] = make_step("new-again", model_name, x, y)
    return steps


def _quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{q[0]:.3f}-{q[2]:.3f}"


def time_steps(steps: dict, *, blocks: int, per_block: int) -> dict[str, dict[str, list[float]]]:
    """Per variant, the wall time and the process's CPU time per step of each block (the CPU time
    leaves out the time other processes held the CPUs: on a shared machine the steadier one)."""
    for step in steps.values():
        for _ in range(30):
            step()
    names = list(steps)
    times = {clock: {k: [] for k in steps} for clock in ("wall", "cpu")}
    for r in range(blocks):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(per_block):
                steps[name]()
            times["wall"][name].append((time.perf_counter() - t0) / per_block)
            times["cpu"][name].append((time.process_time() - c0) / per_block)
    return times


def report(times: dict[str, dict[str, list[float]]], threads: int, load0: str, load1: str) -> list[str]:
    lines = [f"threads={threads}  load before {load0}  after {load1}"]
    pairs = [("new", "normal", "the MLP goal: <= 1.05"), ("new", "old", "A/B against the older engine"),
             ("old", "normal", "the older engine against this one drawing normal_"),
             ("new-again", "new", "A/A: the noise band")]
    for clock, by_variant in times.items():
        med = {k: statistics.median(v) for k, v in by_variant.items()}
        lines.append(f"  [{clock}] median us/step: " + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in med.items()))
        for a, b, what in pairs:
            if a in med and b in med:
                per_block = [ta / tb for ta, tb in zip(by_variant[a], by_variant[b])]
                lines.append(f"  [{clock}] {a} / {b} = {med[a] / med[b]:.3f}  (block ratios: median "
                             f"{statistics.median(per_block):.3f}, quartiles {_quartiles(per_block)}; {what})")
    return lines


def time_draws(coords: int, old=None, reps: int = 7, calls: int = 400) -> list[str]:
    g, cpu = torch.Generator().manual_seed(0), torch.device("cpu")
    draws = {
        "torch float32 normal_": lambda: torch.empty(coords).normal_(0.0, 1.0, generator=g),
        "refined float32 (this checkout)": lambda: noise.standard_normal32_refined(coords, generator=g, device=cpu),
        "float64 Box-Muller (this checkout)": lambda: noise.standard_normal64(coords, generator=g, device=cpu),
    }
    if old is not None and hasattr(old, "standard_normal32_refined"):
        draws["refined float32 (OLD)"] = lambda: old.standard_normal32_refined(coords, generator=g,
                                                                                         device=cpu)
    wall, cpu_time = {k: [] for k in draws}, {k: [] for k in draws}
    for _ in range(reps):
        for name, f in draws.items():
            for _ in range(20):
                f()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                f()
            wall[name].append((time.perf_counter() - t0) / calls * 1e6)
            cpu_time[name].append((time.process_time() - c0) / calls * 1e6)
    out = [f"draw of {coords} coordinates, threads={torch.get_num_threads()}, load {_load()}:"]
    for name, v in wall.items():
        c = cpu_time[name]
        out.append(f"  {name}: wall median {statistics.median(v):.1f} us (min {min(v):.1f}, max {max(v):.1f}); "
                   f"CPU median {statistics.median(c):.1f} us (min {min(c):.1f}, max {max(c):.1f})")
    return out


def _first_module(*names: str) -> str:
    """The first of dptrain_old's modules ``names`` that exists (older layouts kept them elsewhere)."""
    for name in names:
        try:
            if importlib.util.find_spec(f"dptrain_old.{name}") is not None:
                return f"dptrain_old.{name}"
        except ModuleNotFoundError:  # a parent package that layout did not have
            continue
    raise ImportError(f"the older checkout has none of {names}")


def load_old(path: Path, into: Path | None = None):
    """The older engine module: a standalone engine.py, or an older checkout's package as dptrain_old
    (copied into ``into``, default a fresh temporary folder)."""
    if path.is_file():
        spec = importlib.util.spec_from_file_location("old_engine", path)
        old = importlib.util.module_from_spec(spec)
        sys.modules["old_engine"] = old  # dataclasses look their module up
        spec.loader.exec_module(old)
        return old
    target = (into if into is not None else Path(tempfile.mkdtemp(prefix="bench_engine_ab_"))) / "dptrain_old"
    shutil.copytree(path / "dptrain", target)
    for py in target.rglob("*.py"):
        py.write_text(re.sub(r"\bdptrain\b(?=[. ])", "dptrain_old", py.read_text(encoding="utf-8")), encoding="utf-8")
    sys.path.insert(0, str(target.parent))
    old = importlib.import_module(_first_module("privacy.dpsgd.engine", "privacy.engine"))  # before issue 30: privacy/
    old.networks = importlib.import_module(_first_module("models.networks", "models"))  # its own Squeeze
    old.binary = importlib.import_module(_first_module("models.objectives", "objectives")).BINARY
    try:  # after issue 45 the draws live in noise.py
        old.standard_normal32_refined = importlib.import_module(
            _first_module("privacy.dpsgd.noise")).standard_normal32_refined
    except ImportError:
        pass
    return old


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old_engine", type=Path, nargs="?", default=None, metavar="OLD",
                   help="an older standalone engine.py, or an older checkout's root")
    p.add_argument("--model", choices=list(MODELS), default="preset-mlp")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--steps", type=int, default=50, help="steps per block")
    p.add_argument("--draws", action="store_true", help="also time the noise draws alone")
    args = p.parse_args()
    old = load_old(args.old_engine) if args.old_engine is not None else None
    g = torch.Generator().manual_seed(0)
    d = MODELS[args.model][0]
    x, y = torch.randn(N, d, generator=g), (torch.rand(N, generator=g) < 0.5).float()
    coords = sum(p.numel() for p in _model(args.model).parameters())
    print(f"bench_engine_ab: model {args.model} ({coords} noise coordinates), B = {B}, N = {N}, "
          f"{args.blocks} blocks x {args.steps} steps per variant; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; old engine: {args.old_engine}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        if args.draws:
            print("\n".join(time_draws(coords, old)))
        steps = make_steps(args.model, x, y, old)
        load0 = _load()
        times = time_steps(steps, blocks=args.blocks, per_block=args.steps)
        print("\n".join(report(times, threads, load0, _load())), flush=True)


if __name__ == "__main__":
    main()
