"""End-to-end time of ``python -m dptrain experiment=logit`` (command to exit), with the machine's
load and a per-phase breakdown (docs/performance.md).

    python scripts/bench_startup.py [--repeats 5] [--compare-ref PATH] [--importtime] [-- key=value ...]

Each repetition runs the command in a fresh ``hydra.run.dir`` with ``trainer.progress=false``, from
the checkout's root (so that the checkout's own ``dptrain`` is imported: the script prints which
file that is), and measures the wall time from the start of the process to its exit. Printed: each
run's time, the median and minimum, ``/proc/loadavg`` before and after, the number of cores, the
OpenMP / BLAS thread settings, and the phases read from the run's log (private/dptrain.log):

* ``to mechanism``: start -> the "dp/ curve" line (imports, Hydra, validation, data, calibration);
* ``to first step``: start -> the "engine=..." line written just before the first training step;
* ``loop+report``: first step -> the summary (training loop, baseline, privacy report, run folder);
* ``exit``: the summary -> the process has exited.

and the CPU time (user + system) of each run, which the machine's load inflates less than the wall
time (threads that spin while they wait inflate it too).

``--compare-ref PATH`` runs another checkout (e.g. ``git worktree add /tmp/base 985c82d``)
alternately with this one in the same time window, and prints the ratio of the medians.
``--ref-env KEY=VALUE`` sets an environment variable for the reference runs only; without
``--compare-ref`` the reference is this checkout, so ``--ref-env DPTRAIN_FULL_EXIT=1``
times the fast exit against the same code without it.
``--importtime`` adds one run per checkout under ``python -X importtime`` and prints the import
time of the main packages (each module's own time, attributed to the package that triggered it:
scipy pulled in by dp-accounting counts as dp_accounting). Numbers depend on the machine and its load: compare
only numbers taken in the same window.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: import-time groups, most specific first (a module counts for the longest prefix it matches)
GROUPS = ("torch._dynamo", "torch.utils.tensorboard", "torch", "dp_accounting", "sklearn", "scipy", "pandas",
          "numpy", "opacus", "tensorboard", "hydra", "omegaconf", "tqdm", "dptrain")
THREAD_ENV = ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "OPENBLAS_NUM_THREADS")
PHASE_LINES = {"mechanism": "dp/ curve:", "first_step": "engine=", "summary": "train loop:"}
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def cores() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{os.cpu_count()} cores ({usable} usable by this process)"


def package_file(checkout: Path, python: str) -> str:
    """The dptrain package the checkout's runs import (cwd first on sys.path with -m)."""
    res = subprocess.run([python, "-c", "import dptrain; print(dptrain.__file__)"], cwd=checkout,
                         capture_output=True, text=True, timeout=120)
    return res.stdout.strip() or res.stderr.strip()[-300:]


def log_phases(log: Path, start: float, end: float) -> dict[str, float]:
    """Seconds from the process start to each phase line of the run log, and the exit phase."""
    out: dict[str, float] = {}
    if not log.is_file():
        return out
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = LOG_TIME.match(line)
        if not m:
            continue
        stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for phase, marker in PHASE_LINES.items():
            if phase not in out and marker in line:
                out[phase] = stamp - start
    if "summary" in out:
        out["exit"] = end - start - out["summary"]
    return out


def run_once(checkout: Path, python: str, extra: list[str], *, importtime: bool = False,
             env: dict[str, str] | None = None) -> dict:
    """One run of the command from ``checkout`` (with ``env`` added to the environment); its wall
    time, load and phases."""
    folder = Path(tempfile.mkdtemp(prefix="dptrain-bench-")) / "run"
    cmd = [python, *(["-X", "importtime"] if importtime else []), "-m", "dptrain", "experiment=logit",
           f"hydra.run.dir={folder}", "trainer.progress=false", *extra]
    before, cpu = loadavg(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start_wall, start = time.time(), time.perf_counter()
    res = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=900,
                         env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    record = {"seconds": seconds, "cpu_seconds": (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime),
              "returncode": res.returncode, "load_before": before, "load_after": loadavg(),
              "phases": log_phases(folder / "private" / "dptrain.log", start_wall, start_wall + seconds)}
    if res.returncode != 0:
        record["stderr"] = res.stderr[-2000:]
    if importtime:
        record["imports"] = import_groups(res.stderr)
    return record


def import_groups(text: str) -> dict[str, float]:
    """Seconds of import per group (GROUPS) from ``-X importtime`` output. Each module's own
    ("self") time counts for the outermost package that triggered it, dptrain and the standard
    library aside: scipy imported by dp-accounting counts as dp_accounting, numpy imported by torch
    as torch; dptrain's own modules as dptrain, the rest as other. The groups add up to the total."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3:
            continue
        name = parts[2].rstrip()
        rows.append((len(name) - len(name.lstrip(" ")), name.strip(), int(parts[0])))

    def group(module: str) -> str:
        return next((g for g in GROUPS if module == g or module.startswith(g + ".")), "other")

    parent: list[int | None] = [None] * len(rows)
    pending: dict[int, list[int]] = {}  # depth -> rows waiting for their parent (the output is post-order)
    for i, (depth, _, _) in enumerate(rows):
        for child in pending.pop(depth + 2, []):
            parent[child] = i
        pending.setdefault(depth, []).append(i)
    totals: dict[str, float] = {}
    for i, (_, name, own) in enumerate(rows):
        chain, j = [], i
        while j is not None:
            chain.append(group(rows[j][1]))
            j = parent[j]
        named = [g for g in chain if g not in ("dptrain", "other")]
        g = named[-1] if named else group(name)
        totals[g] = totals.get(g, 0.0) + own / 1e6
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def summary(label: str, runs: list[dict]) -> dict:
    times = [r["seconds"] for r in runs]
    cpu = [r["cpu_seconds"] for r in runs]
    phases = {}
    for key in ("mechanism", "first_step", "summary", "exit"):
        values = [r["phases"][key] for r in runs if key in r["phases"]]
        if values:
            phases[key] = statistics.median(values)
    failed = [r for r in runs if r["returncode"] != 0]
    print(f"\n{label}: runs {', '.join(f'{t:.2f}' for t in times)} s; median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s; CPU (user + system) median {statistics.median(cpu):.2f} s"
          + (f"; {len(failed)} FAILED (rc {failed[0]['returncode']})" if failed else ""))
    if phases:
        loop = phases.get("summary", 0) - phases.get("first_step", 0)
        print(f"  phases (median, s from start): to mechanism {phases.get('mechanism', float('nan')):.2f}, "
              f"to first step {phases.get('first_step', float('nan')):.2f}, loop+baseline+report {loop:.2f}, "
              f"exit {phases.get('exit', float('nan')):.2f}")
    if failed:
        print("  stderr of a failed run:", failed[0].get("stderr", "")[-600:])
    return {"times": times, "median": statistics.median(times), "min": min(times), "cpu_median": statistics.median(cpu),
            "phases": phases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", "-r", type=int, default=5)
    p.add_argument("--compare-ref", type=Path, default=None, help="another checkout, run alternately with this one")
    p.add_argument("--checkout", type=Path, default=ROOT, help="the checkout to time (default: this one)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--importtime", action="store_true", help="one more run per checkout under -X importtime")
    p.add_argument("--ref-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment of the reference runs; without --compare-ref the reference is this checkout, "
                   "e.g. --ref-env DPTRAIN_FULL_EXIT=1 times the fast exit's effect")
    p.add_argument("--json", type=Path, default=None, help="write every measurement to this file")
    p.add_argument("extra", nargs="*", help="more overrides, after --")
    args = p.parse_args(argv)
    checkouts = {"this": args.checkout.resolve()}
    ref_env = dict(item.split("=", 1) for item in args.ref_env)
    if args.compare_ref is not None or ref_env:
        checkouts["ref"] = (args.compare_ref or args.checkout).resolve()
    envs = {"this": {}, "ref": ref_env}
    print(f"command: {args.python} -m dptrain experiment=logit hydra.run.dir=<fresh> trainer.progress=false "
          + " ".join(args.extra))
    print(f"machine: {cores()}; loadavg before: {loadavg()}")
    print("threads: " + ", ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in THREAD_ENV)
          + " (dptrain sets OMP_WAIT_POLICY=PASSIVE and OPENBLAS_THREAD_TIMEOUT=4 when unset)")
    for label, path in checkouts.items():
        print(f"{label}: {path} imports {package_file(path, args.python)}"
              + "".join(f" with {k}={v}" for k, v in envs[label].items()))
    runs: dict[str, list[dict]] = {label: [] for label in checkouts}
    for i in range(args.repeats):
        order = list(checkouts) if i % 2 == 0 else list(reversed(checkouts))  # alternate who goes first
        for label in order:
            r = run_once(checkouts[label], args.python, args.extra, env=envs[label])
            runs[label].append(r)
            print(f"  {label} run {i + 1}: {r['seconds']:.2f} s, CPU {r['cpu_seconds']:.2f} s (rc {r['returncode']}; "
                  f"load {r['load_before']} -> {r['load_after']})", flush=True)
    results = {label: summary(label, rs) for label, rs in runs.items()}
    if "ref" in results:
        ratio = results["this"]["median"] / results["ref"]["median"]
        cpu_ratio = results["this"]["cpu_median"] / results["ref"]["cpu_median"]
        print(f"\nratio this/ref of the medians: wall {ratio:.3f} ({results['ref']['median']:.2f} s -> "
              f"{results['this']['median']:.2f} s), CPU {cpu_ratio:.3f} ({results['ref']['cpu_median']:.2f} s -> "
              f"{results['this']['cpu_median']:.2f} s)")
    if args.importtime:
        for label, path in checkouts.items():
            r = run_once(path, args.python, args.extra, importtime=True, env=envs[label])
            results[label]["imports"] = r.get("imports", {})
            print(f"\nimport time, {label} (s; each module's own time, by the package that triggered it; one run "
                  f"under -X importtime; total {sum(r.get('imports', {}).values()):.2f} s):")
            for group, seconds in r.get("imports", {}).items():
                if seconds >= 0.005:
                    print(f"  {group:24s} {seconds:6.2f}")
    print(f"\nloadavg after: {loadavg()}")
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs, "results": results}, indent=2) + "\n")
    return 0 if all(r["returncode"] == 0 for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
