"""Benchmark the public jobs simulator at the national scale of issue 34.

    python scripts/bench_jobs.py [--establishments 527000] [--places 200] [--seed 0]

Times dptrain.data.jobs.simulate_jobs (527,000 establishments, about 11 million jobs) and the
place x sector x ownership cell totals (n, establishments, x_max per non-empty cell), then a
worker-attribute table (sector x sex x age x race); prints one line per measure: the times, the
sizes, the peak memory of the process (ru_maxrss, which includes the interpreter's imports), the
machine's load averages (os.getloadavg) and the threads (this process's, and the CPUs).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dptrain.data.jobs import NATIONAL_ESTABLISHMENTS, simulate_jobs


def _threads() -> int:
    """Threads of this process (/proc where available, else Python's own)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--establishments", type=int, default=NATIONAL_ESTABLISHMENTS)
    p.add_argument("--places", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(f"load_before {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    t0 = time.perf_counter()
    jobs = simulate_jobs(args.seed, establishments=args.establishments, places=args.places)
    t1 = time.perf_counter()
    cells = jobs.cell_totals(("place", "sector", "ownership"))
    t2 = time.perf_counter()
    table = jobs.worker_counts(("sector", "sex", "age", "race"))
    t3 = time.perf_counter()
    worker_bytes = sum(getattr(jobs, n).nbytes for n in ("establishment", "age", "sex", "race"))
    print(f"establishments {jobs.n_establishments}")
    print(f"jobs {jobs.n_jobs}")
    print(f"mean_size {jobs.size.mean():.2f}")
    print(f"share_under_10 {(jobs.size < 10).mean():.3f}")
    print(f"largest {int(jobs.size.max())}")
    print(f"simulate_s {t1 - t0:.2f}")
    print(f"cell_totals_s {t2 - t1:.2f}")
    print(f"cells {len(cells)}")
    print(f"worker_counts_s {t3 - t2:.2f}")
    print(f"worker_cells {len(table)}")
    print(f"worker_table_mb {worker_bytes / 2**20:.1f}")
    print(f"peak_rss_mb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
    print(f"load_after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"threads {_threads()}")
    print(f"cpus {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
