"""The presets' training-loop time on an idle machine and while another process uses a core.

    python scripts/bench_contention.py [--experiments logit mlp] [--repeats 3] [--variants default ...]

For each experiment and variant (environment and settings), runs ``python -m dptrain
experiment=NAME`` (no progress bar, no baseline) ``--repeats`` times idle and ``--repeats`` times
while a CPU-bound process (``python -c "while True: pass"``) runs, and prints the median of the
run's ``time/loop_seconds`` (from private/metrics.json) for each, and their ratio. Variants:

* ``default``: what a user gets (the environment as inherited, minus OMP_WAIT_POLICY and
  OMP_NUM_THREADS, so dptrain's own defaults apply);
* ``active``: ``OMP_WAIT_POLICY=ACTIVE`` forced (OpenMP threads spin while waiting);
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` forced (waiting threads sleep);
* ``threads2``: ``trainer.threads=2``;
* ``threads1``: ``trainer.threads=1``.

Run it with nothing else on the machine; it prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "default": ({}, []),
    "active": ({"OMP_WAIT_POLICY": "ACTIVE"}, []),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, []),
    "threads2": ({}, ["trainer.threads=2"]),
    "threads1": ({}, ["trainer.threads=1"]),
}


def _run(experiment: str, variant: str, run_dir: Path) -> float:
    extra_env, overrides = VARIANTS[variant]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env.update(extra_env)
    cmd = [sys.executable, "-m", "dptrain", f"experiment={experiment}", "trainer.progress=false",
           "trainer.baseline=false", "logger.tensorboard=false", *overrides, f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=900)
    return json.loads((run_dir / "private" / "metrics.json").read_text())["time/loop_seconds"]


def _median_loop(experiment: str, variant: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            times.append(_run(experiment, variant, Path(tmp) / "run"))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiments", nargs="+", default=["logit", "mlp"])
    p.add_argument("--variants", nargs="+", default=["default", "active", "threads1"], choices=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(f"# load average at start: {open('/proc/loadavg').read().strip()}; cpus: {os.cpu_count()}")
    print(f"{'experiment':10s} {'variant':9s} {'idle s':>8s} {'busy s':>8s} {'busy/idle':>9s}")
    for experiment in args.experiments:
        for variant in args.variants:
            idle = _median_loop(experiment, variant, args.repeats)
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                time.sleep(0.5)
                busy = _median_loop(experiment, variant, args.repeats)
            finally:
                hog.kill()
                hog.wait()
            print(f"{experiment:10s} {variant:9s} {idle:8.3f} {busy:8.3f} {busy / idle:9.2f}", flush=True)
    print(f"# load average at end: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
