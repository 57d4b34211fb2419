"""Does any time in a `dptrain publish` export of a search correlate with its secret number of
candidates K? (issue 43, finding 3; Done when: |r| <= 0.3 over 8 runs.)

Runs ``task=tune`` N times from the command line (K drawn from the default law: truncated negative
binomial, mean 10), reads K from each run's private/candidates.jsonl, exports each run twice with
``dptrain publish`` (a .tar.gz, made twice to check it is byte-identical, and a folder), and
correlates with K every time an attacker holding the export can read:

* in the .tar.gz: each entry's mtime, any atime / ctime in pax headers, the gzip header's time,
  the archive file's own mtime;
* in the folder export: each file's mtime and atime (fixed), and its ctime, which the file system
  sets to the moment of the export (the export holds no start time to subtract it from; each
  export here follows its run at once, so this is the run's end);
* for contrast, the run folder itself: ctime - mtime of model.pt (the leak finding 3 measured:
  the folder is never what is published).

A time that takes one value across the runs has no correlation (reported as r = 0, "constant").

    python scripts/tune_export_times.py --runs 8 --out experiments/publication
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TUNE = ["task=tune", "data=synthetic", "data.n_rows=4000", "trainer.epochs=2", "trainer.batch_size=256",
        "trainer.progress=false", "logger.tensorboard=false", "privacy.target_epsilon=1", "tune=lr_clip"]


def _dptrain(*args: str) -> None:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    res = subprocess.run([sys.executable, "-m", "dptrain", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"dptrain {' '.join(args)} failed: {res.stderr[-2000:]}")


def _archive_times(path: Path) -> dict[str, float]:
    raw = path.read_bytes()
    out = {"gzip header mtime": float(int.from_bytes(raw[4:8], "little")), "archive file mtime": path.stat().st_mtime}
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    out["tar entry mtime (max)"] = float(max(m.mtime for m in members))
    out["tar entry mtime (min)"] = float(min(m.mtime for m in members))
    out["tar pax atime/ctime headers"] = float(sum(k in m.pax_headers for m in members for k in ("atime", "ctime")))
    return out


def _folder_times(folder: Path) -> dict[str, float]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    stats = [p.stat() for p in files]
    model = (folder / "model.pt").stat()
    return {"folder export mtime (max)": max(s.st_mtime for s in stats),
            "folder export atime (max)": max(s.st_atime for s in stats),
            "folder export ctime (the moment of the export)": model.st_ctime,
            "folder export ctime spread (s)": max(s.st_ctime for s in stats) - min(s.st_ctime for s in stats)}


def _r(k: np.ndarray, values: list[float]) -> tuple[float, bool]:
    v = np.asarray(values, dtype=float)
    if np.ptp(v) == 0.0:
        return 0.0, True
    return float(np.corrcoef(k, v)[0, 1]), False


def run(n: int, workdir: Path) -> dict:
    rows = []
    for i in range(n):
        folder = workdir / f"run{i}"
        _dptrain(*TUNE, f"hydra.run.dir={folder}")
        k = len((folder / "private" / "candidates.jsonl").read_text().splitlines())
        model = (folder / "model.pt").stat()
        archive, again, exported = workdir / f"run{i}.tar.gz", workdir / f"run{i}-again.tar.gz", workdir / f"run{i}-out"
        for dest in (archive, again, exported):
            _dptrain("publish", str(folder), str(dest))
        times = {"run folder model.pt ctime - mtime (s)": model.st_ctime - model.st_mtime, **_archive_times(archive),
                 **_folder_times(exported)}
        with gzip.open(archive) as a, gzip.open(again) as b:
            identical = archive.read_bytes() == again.read_bytes() and a.read() == b.read()
        rows.append({"run": i, "K": k, "byte_identical": identical, **times})
        print(f"run {i}: K = {k}, export byte-identical: {identical}", flush=True)
    k = np.array([r["K"] for r in rows], dtype=float)
    names = [c for c in rows[0] if c not in ("run", "K", "byte_identical")]
    corr = {}
    for name in names:
        r, constant = _r(k, [row[name] for row in rows])
        corr[name] = {"r": round(r, 4), "constant": constant}
    return {"runs": rows, "correlation_with_K": corr, "byte_identical": all(r["byte_identical"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--out", type=Path, default=ROOT / "experiments" / "publication")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tune_export_"))
    try:
        result = run(args.runs, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tune_export_times.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"{args.runs} task=tune runs, K = {[r['K'] for r in result['runs']]}",
             f"every export made twice is byte-identical: {result['byte_identical']}", "",
             f"{'time':48s} {'r with K':>9s}"]
    for name, c in result["correlation_with_K"].items():
        lines.append(f"{name:48s} {c['r']:9.3f}" + ("  (constant: one value in every run)" if c["constant"] else ""))
    (args.out / "tune_export_times.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
