"""The data path of a large table, stage by stage, against its floor (issue 36).

For each size in ``--rows`` (default 2M and 20M) a generated Parquet table
(``scripts/make_big_table.py``: 8 float32 columns in [0, 1], 2 categorical columns of 3 labels, a
binary target; 16 encoded features) is written once under ``--dir``. Then, in THIS process:

* the floor: ``pyarrow.parquet.read_table`` of the whole file (time, peak memory);
* the stages of ``data=table``: the read into a frame, the numeric columns and category codes,
  the split's hash, the block-wise encoding, and the whole ``load_dataset``; each stage's time,
  its ratio to the floor, and its peak memory (the kernel's high-water mark, reset per stage);

and in child processes (wall time, peak RSS of the child, and its peak anonymous memory):

* the issue's run: ``python -m dptrain experiment=logit data=<table> trainer.epochs=1
  trainer.batch_size=65536 privacy.delta=null``;
* with ``--sweep``: a 4-run sweep over ``privacy.noise_multiplier`` with ``data.cache`` (the table
  is encoded once), and one more run reading the cache.

``--check`` compares the encoded rows and the split of the first 1,000,000 rows, bit for bit, with
the whole-array computation the block-wise code replaced (``tests/test_data_blocks.py``'s
reference). Every number is printed with the thread count and ``/proc/loadavg``; ``--threads 1 2``
runs the in-process stages at each thread count.

    python scripts/bench_data.py --dir /tmp/bench_data --rows 2000000 20000000 --sweep --check
    python scripts/bench_data.py --dir /tmp/bench_data --rows 100000000 --sweep   # 3.5 GB table, 6.4 GB cache
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
import make_big_table  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from dptrain.data import encoding, load_dataset, reading, schema_from_config, split  # noqa: E402
from dptrain.data.rules import RowCounts  # noqa: E402

GIB = 2**30


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def _status(pid: str = "self") -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM", "VmRSS", "RssAnon")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) * 1024
    return out


def stage(name: str, fn, floor: float | None = None):
    """Run ``fn()``: its time, ratio to the floor, peak memory (high-water mark reset first)."""
    Path("/proc/self/clear_refs").write_text("5")
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    peak = _status()["VmHWM"] / GIB
    ratio = f"{seconds / floor:5.2f}x floor" if floor else "     floor"
    print(f"  {name:<34} {seconds:6.2f} s  {ratio}   peak {peak:5.2f} GiB   (load {load()})", flush=True)
    return out, seconds


def data_config(path: Path, cache: str | None = None):
    d = OmegaConf.create({"name": "table", "path": str(path), "target": "y", "positive": None, "cache": cache,
                          "numeric": {c: {"lower": 0, "upper": 1} for c in make_big_table.NUMERIC},
                          "categorical": {"region": list(make_big_table.REGIONS),
                                          "sector": list(make_big_table.SECTORS)}})
    return d


def in_process(path: Path, threads: int) -> None:
    torch.set_num_threads(threads)
    cfg = data_config(path)
    schema = schema_from_config(cfg)
    print(f" in this process, {threads} thread(s), {os.cpu_count()} cores:")
    _, floor = stage("pyarrow read_table (the floor)", lambda: pq.read_table(path).num_rows)  # the table dropped
    reading.release_arrow_memory()
    df, _ = stage("read into a frame", lambda: reading.read_table(path, columns=schema.read_columns), floor)
    counts = RowCounts(len(df))
    nums, _ = stage("numeric columns (in place)", lambda: encoding._numeric_columns(df, schema, counts), floor)
    idx = counts.kept()  # every row of the benchmark table (no missing value)
    codes, _ = stage("category codes", lambda: encoding._category_codes(df, schema), floor)
    is_test, _ = stage("split hash", lambda: split.in_test_part(df, schema, idx, 0), floor)
    (outs, _), _ = stage("encode (blocks, train/test)", lambda: encoding._encode_blocks(
        schema, nums, codes, None, is_test, len(idx)), floor)
    encoded = sum(o.nbytes for o in outs) / GIB
    df = nums = codes = is_test = outs = idx = None  # dropped before the whole load
    reading.release_arrow_memory()
    base = _status()["VmRSS"] / GIB
    data, whole = stage("load_dataset (all of it)", lambda: load_dataset(cfg, seed=0), floor)
    print(f"  encoded matrix {encoded:.2f} GiB; interpreter before loading {base:.2f} GiB; load_dataset peak "
          f"{(_status()['VmHWM'] / GIB - base) / encoded:.2f}x the matrix above it")
    del data


def child(argv: list[str], label: str) -> tuple[float, float, float]:
    """Run ``python -m dptrain *argv``: wall seconds, peak RSS and peak anonymous RSS, sampled every
    20 ms from the child's /proc status (its VmHWM: getrusage's ru_maxrss would carry this
    process' own peak into the child across fork and exec)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", *argv], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = {"VmHWM": 0, "RssAnon": 0}

    def sample():
        while proc.poll() is None:
            try:
                now = _status(str(proc.pid))
            except OSError:
                return
            for k in peak:
                peak[k] = max(peak[k], now.get(k, 0))
            time.sleep(0.02)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    err = proc.communicate()[1]
    seconds = time.perf_counter() - start
    watcher.join()
    if proc.returncode:
        raise SystemExit(f"{label} failed:\n{err[-3000:]}")
    print(f"  {label:<44} {seconds:6.2f} s   peak RSS {peak['VmHWM'] / GIB:5.2f} GiB   peak anonymous "
          f"{peak['RssAnon'] / GIB:5.2f} GiB   (load {load()})", flush=True)
    return seconds, peak["VmHWM"] / GIB, peak["RssAnon"] / GIB


def runs(path: Path, work: Path, sweep: bool) -> None:
    conf = work / f"conf_{path.stem}"
    make_big_table.write_data_config(conf, path)
    common = ["--config-dir", str(conf), "experiment=logit", "data=big", "trainer.epochs=1",
              "trainer.batch_size=65536", "privacy.delta=null", "trainer.progress=false", "overwrite=true"]
    print(" child processes (python -m dptrain ...):")
    child([*common, f"hydra.run.dir={work / 'run'}"], "experiment=logit, 1 epoch")
    if not sweep:
        return
    cache = work / f"cache_{path.stem}"
    if cache.exists():
        import shutil

        shutil.rmtree(cache)
    child(["-m", *common, f"data.cache={cache}", "privacy.noise_multiplier=3,4,5,6",
           f"hydra.sweep.dir={work / 'sweep'}"], "4-run sweep with data.cache (encodes once)")
    child([*common, f"data.cache={cache}", f"hydra.run.dir={work / 'run'}"], "one more run, from the cache")


def check(path: Path) -> None:
    """The first 1,000,000 rows: the block-wise encoding and split against the whole-array reference."""
    spec = importlib.util.spec_from_file_location("reference", REPO / "tests" / "test_data_blocks.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    df = pq.ParquetFile(path).read_row_groups([0]).to_pandas()
    schema = schema_from_config(data_config(path))
    rows = encoding.encode_rows(df, schema, seed=0)
    every = np.arange(len(df))
    test = ref.reference_scores(df, 0, every) < schema.test_fraction
    x = ref.reference_features(df, schema, every)
    same = (np.array_equal(rows.x_train.view(np.uint32), x[~test].view(np.uint32))
            and np.array_equal(rows.x_test.view(np.uint32), x[test].view(np.uint32))
            and np.array_equal(rows.y_train, df["y"].to_numpy(np.float32)[~test]))
    print(f" bit-for-bit on the first {len(df):,} rows (encoded values, split, labels): {same}")
    if not same:
        raise SystemExit("the block-wise encoding differs from the reference")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="where the tables, caches and runs go")
    ap.add_argument("--rows", type=int, nargs="+", default=[2_000_000, 20_000_000])
    ap.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    ap.add_argument("--sweep", action="store_true", help="also the 4-run sweep with data.cache")
    ap.add_argument("--check", action="store_true", help="bit-for-bit check of the first 1M rows")
    ap.add_argument("--no-runs", action="store_true", help="only the in-process stages")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"bench_data: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, load {load()}")
    for rows in args.rows:
        path = args.dir / f"table_{rows}.parquet"
        if not path.exists():
            make_big_table.make_table(path, rows)
        print(f"\n{rows:,} rows: {path} ({path.stat().st_size / 2**20:.0f} MiB)")
        if args.check:
            check(path)
        for threads in args.threads:
            in_process(path, threads)
        if not args.no_runs:
            runs(path, args.dir, args.sweep)


if __name__ == "__main__":
    main()
