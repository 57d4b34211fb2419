"""The one private step (dptrain.privacy.dpsgd.loop.PrivateStep) against the hand-written loop it
replaced, in ONE process (A/B), with an A/A pair for the noise band.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_private_step.py [--threads 1] [--blocks 40]

Logistic regression on 100,000 x 100 in-memory rows, expected batch 1024, sigma 1, C 1, the fast
engine: blocks of 100 steps of each variant, interleaved with alternating order; the medians of
the per-step times are compared. Prints PrivateStep / hand-written loop (the A/B) and hand-written
/ hand-written (the A/A band), the thread count and the machine's load.
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dptrain.models.networks import logit  # noqa: E402
from dptrain.privacy.accounting import PrivacyLedger  # noqa: E402
from dptrain.privacy.dpsgd.engine import make_engine  # noqa: E402
from dptrain.privacy.dpsgd.graph import BatchStep  # noqa: E402
from dptrain.privacy.dpsgd.loop import PrivateStep  # noqa: E402
from dptrain.privacy.dpsgd.sampling import make_sampler  # noqa: E402
from dptrain.privacy.events import poisson_gaussian  # noqa: E402
from dptrain.privacy.randomness import Randomness  # noqa: E402

N, D, B = 100_000, 100, 1024


def _parts():
    torch.manual_seed(0)
    x, y = torch.rand(N, D), (torch.rand(N) < 0.3).float()
    model = logit(in_features=D)
    rnd = Randomness.fresh()
    engine = make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=B,
                         generator=rnd.torch("gaussian-noise"))
    sampler = make_sampler(num_rows=N, sample_rate=B / N, randomness=rnd, index=0, device=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return x, y, model, engine, sampler, opt


def variants():
    event = poisson_gaussian(sample_rate=B / N, noise_multiplier=1.0)
    x, y, _, engine, sampler, opt = _parts()
    batch_step, acc = BatchStep(engine, sampler, x, y, cuda_graph=False), PrivacyLedger()

    def hand_written():
        batch_step()
        opt.step()
        acc.record(event)

    x2, y2, _, engine2, sampler2, opt2 = _parts()
    private = PrivateStep(engine2, sampler2, opt2, x2, y2, accountant=PrivacyLedger(),
                          batch_step=BatchStep(engine2, sampler2, x2, y2, cuda_graph=False))
    x3, y3, _, engine3, sampler3, opt3 = _parts()
    batch3, acc3 = BatchStep(engine3, sampler3, x3, y3, cuda_graph=False), PrivacyLedger()

    def hand_written_again():
        batch3()
        opt3.step()
        acc3.record(event)

    return {"loop": hand_written, "private_step": lambda: private(event), "loop_again": hand_written_again}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    steps = variants()
    times = {k: [] for k in steps}
    for _ in range(3):
        for f in steps.values():
            f()
    for block in range(args.blocks):
        order = list(steps) if block % 2 == 0 else list(reversed(steps))
        for name in order:
            t0 = time.perf_counter()
            for _ in range(100):
                steps[name]()
            times[name].append((time.perf_counter() - t0) / 100)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"threads {args.threads}; load {os.getloadavg()}; median ms/step: "
          + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in med.items()))
    print(f"A/B private_step / loop = {med['private_step'] / med['loop']:.3f}; "
          f"A/A loop_again / loop = {med['loop_again'] / med['loop']:.3f}")


if __name__ == "__main__":
    main()
