"""How long ``python -m dptrain`` takes to refuse a mistake, as a ratio to ``python -c "import
torch, pandas"`` measured in the same run of this script (docs/performance.md, "A refusal").

    python scripts/bench_refusal.py [--repeats 7] [--json FILE] [-- key=value ...]

The two commands run alternately (import, refusal, import, refusal, ...), each from the
checkout's root (so that the checkout's own ``dptrain`` is imported: the script prints which file
that is), each timed from the start of its process to its exit. The refused command line is
``trainer.epoch=2`` (a misspelt key: "did you mean trainer.epochs?") unless other overrides follow
``--``. Printed: each pair's times and ratio, ``/proc/loadavg`` before and after each pair, the
number of cores, the thread settings of the environment; then the median of the pairs' ratios
and the ratio of the medians. A refusal that does not exit 2, or an import that fails, stops the
script (exit 1). The numbers depend on the machine and its load: a shared machine's load moves
both commands, which is why the pairs are interleaved and the ratio is what is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_startup import THREAD_ENV, cores, loadavg  # noqa: E402  (the start-up benchmark's machine facts)

IMPORT = ["-c", "import torch, pandas"]
DEFAULT_MISTAKE = ["trainer.epoch=2"]


def timed(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of ``python ARGS`` from the checkout's root, start to exit."""
    start = time.perf_counter()
    res = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, res


def pair(mistake: list[str]) -> dict:
    """One import of torch and pandas, then one refusal of ``mistake``: their times and the load."""
    before = loadavg()
    t_import, imp = timed(IMPORT)
    if imp.returncode != 0:
        raise SystemExit(f"bench_refusal: error: import torch, pandas failed: {imp.stderr[-500:]}")
    t_refusal, ref = timed(["-m", "dptrain", *mistake])
    if ref.returncode != 2 or not ref.stderr.startswith("dptrain: error: "):
        raise SystemExit(f"bench_refusal: error: {' '.join(mistake)} was not refused (exit {ref.returncode}): "
                         f"{ref.stderr[-500:]}")
    return {"import_s": t_import, "refusal_s": t_refusal, "ratio": t_refusal / t_import, "load_before": before,
            "load_after": loadavg(), "message": ref.stderr.strip()}


def summary(pairs: list[dict]) -> dict:
    imports = [p["import_s"] for p in pairs]
    refusals = [p["refusal_s"] for p in pairs]
    return {"pairs": len(pairs), "median_import_s": statistics.median(imports),
            "median_refusal_s": statistics.median(refusals),
            "median_of_ratios": statistics.median(p["ratio"] for p in pairs),
            "ratio_of_medians": statistics.median(refusals) / statistics.median(imports)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-r", "--repeats", type=int, default=7, help="pairs (import, refusal); default 7")
    parser.add_argument("--json", type=Path, help="also write the pairs and the summary to this file")
    parser.add_argument("mistake", nargs="*", help="the overrides to refuse (after --); default trainer.epoch=2")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: allowed: an integer >= 1")
    mistake = args.mistake or DEFAULT_MISTAKE
    dptrain_file = subprocess.run([sys.executable, "-c", "import dptrain; print(dptrain.__file__)"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120).stdout.strip()
    print(f"python -m dptrain {' '.join(mistake)}  vs  python -c \"import torch, pandas\"")
    print(f"dptrain: {dptrain_file}; {cores()}; threads: "
          + ", ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in THREAD_ENV))
    timed(IMPORT)  # one warm-up of each: the first run of a session reads the files from disk
    timed(["-m", "dptrain", *mistake])
    pairs = []
    for i in range(args.repeats):
        p = pair(mistake)
        pairs.append(p)
        print(f"pair {i + 1}: import {p['import_s']:.2f} s  refusal {p['refusal_s']:.2f} s  ratio {p['ratio']:.2f}  "
              f"load {p['load_before']} -> {p['load_after']}", flush=True)
    s = summary(pairs)
    print(f"refused with: {pairs[-1]['message'][:160]}")
    print(f"median: import {s['median_import_s']:.2f} s, refusal {s['median_refusal_s']:.2f} s; "
          f"median of the pairs' ratios {s['median_of_ratios']:.2f}, ratio of the medians {s['ratio_of_medians']:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"mistake": mistake, "pairs": pairs, "summary": s}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
