"""Time this checkout's fast DP step against an older engine.py in ONE process (A/B).

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_engine_ab.py OLD_ENGINE_PY [--threads 1] [--blocks 60]

Logistic regression on 100,000 x 100 in-memory rows, expected batch 1024, sigma 1, C 1, Poisson
sampling: each engine runs blocks of 100 steps, the two interleaved (order alternating), and the
medians of the per-step times are compared. Prints new/old (below 1: the new engine is faster).
The older file must be a standalone ``dptrain/privacy/dpsgd/engine.py`` of an earlier commit (e.g. from
``git show COMMIT:dptrain/privacy/dpsgd/engine.py > old_engine.py``); its ``make_engine`` took
``private=True``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede `import torch`

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dptrain.models.networks import logit
from dptrain.privacy.dpsgd import engine as new
from dptrain.privacy.randomness import Randomness

N, D, B = 100_000, 100, 1024


def _step(make_engine, x, y, *, old_api: bool):
    torch.manual_seed(0)
    model = logit(in_features=D)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = dict(engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=B)
    if old_api:
        eng = make_engine(model, private=True, generator=torch.Generator().manual_seed(1), **kw)
    else:
        eng = make_engine(model, generator=Randomness.fresh().torch("gaussian-noise"), **kw)
    eng.collect_stats = False
    sampler = new.PoissonSampler(num_rows=N, sample_rate=B / N, rng=np.random.default_rng(0))

    def step() -> None:
        idx = sampler.sample()
        eng(x.index_select(0, idx), y.index_select(0, idx))
        opt.step()

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old_engine", type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--blocks", type=int, default=60)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    spec = importlib.util.spec_from_file_location("old_engine", args.old_engine)
    old = importlib.util.module_from_spec(spec)
    sys.modules["old_engine"] = old
    spec.loader.exec_module(old)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, D, generator=g), (torch.rand(N, generator=g) < 0.5).float()
    steps = {"old": _step(old.make_engine, x, y, old_api=True), "new": _step(new.make_engine, x, y, old_api=False)}
    for step in steps.values():
        for _ in range(50):
            step()
    times: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(args.blocks):
        for name in ("old", "new") if r % 2 else ("new", "old"):
            t0 = time.perf_counter()
            for _ in range(100):
                steps[name]()
            times[name].append((time.perf_counter() - t0) / 100)
    mo, mn = statistics.median(times["old"]), statistics.median(times["new"])
    load = open("/proc/loadavg").read().split()[:3] if Path("/proc/loadavg").exists() else "?"
    print(f"threads={args.threads} old {mo * 1e3:.4f} ms new {mn * 1e3:.4f} ms ratio new/old {mn / mo:.4f} "
          f"(load average {' '.join(load)})")


if __name__ == "__main__":
    main()
