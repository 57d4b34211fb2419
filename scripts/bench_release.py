"""Benchmark the release path from data in memory to release.csv.

    python scripts/bench_release.py [--rows 20000000] [--cells 400000] [--out release.csv]

Generates the rows with dptrain.data.atlas.simulate_rows_fast (timed, not counted in the total),
then times make_cells -> local_sensitivity -> se_local_sensitivity -> release_mos -> CSV, the way a
release run does it (one ``CellEstimates``: OLS and its refined moments computed once, in the
local_sensitivity stage, and shared).
Stages whose module is not written yet print "not yet available". Peak memory is the process's
VmHWM (/proc/self/status), so it includes the generated rows and the interpreter's imports
(dptrain.data pulls in torch). Goal: <= 60 s total and <= 8 GB peak at 20M rows / 400k cells.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

GOAL_S, GOAL_GB = 60.0, 8.0


def peak_gb() -> float:
    """VmHWM of this process in GB (NaN where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return float("nan")


class Stages:
    def __init__(self) -> None:
        self.total = 0.0

    def run(self, name: str, fn, *, count: bool = True):
        t = time.perf_counter()
        try:
            out = fn()
        except ImportError as exc:
            print(f"{name:<22} not yet available ({exc})", flush=True)
            return None
        dt = time.perf_counter() - t
        self.total += dt if count else 0.0
        print(f"{name:<22} {dt:8.2f} s   peak {peak_gb():6.2f} GB", flush=True)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--cells", type=int, default=400_000)
    ap.add_argument("--out", type=Path, default=Path("release.csv"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from dptrain.data.atlas import simulate_rows_fast
    from dptrain.release.cells import Domain, make_cells

    st = Stages()
    print(f"rows={args.rows:,} cells={args.cells:,} out={args.out}")
    rows = st.run(
        "generate (not timed)",
        lambda: simulate_rows_fast(n_rows=args.rows, n_cells=args.cells, seed=args.seed),
        count=False,
    )
    keys = pd.DataFrame({"cell": np.arange(args.cells)})
    cells = st.run("make_cells", lambda: make_cells(*rows, keys=keys, domain=Domain()))
    rows = None  # only the cells' clipped copies stay alive

    # the release run's path: one CellEstimates holds the OLS fit and its refined moments, computed
    # once (inside the first stage) and shared by both sensitivities and MOS
    from dptrain.release.api import CellEstimates

    est = CellEstimates(cells)

    def sens():
        return est.local_sensitivity(statistic="p25", neighbors="add_remove")

    def se_sens():
        return est.se_local_sensitivity(statistic="p25", neighbors="add_remove")

    ls = st.run("local_sensitivity", sens)
    se_ls = st.run("se_local_sensitivity", se_sens)

    def mos():
        from dptrain.privacy.randomness import Randomness
        from dptrain.release.mos import MOSInputs, release_mos

        # the noise stream a release run uses (fresh from the OS CSPRNG); reuse the sensitivities
        # and the fit computed above (release_mos would otherwise compute them again)
        rng = Randomness.fresh().numpy("release-mos")
        return release_mos(cells, statistic="p25", epsilon=1.0, rng=rng,
                           precomputed=MOSInputs(sensitivity=ls, se_sensitivity=se_ls, fit=est.fit))

    release = st.run("release_mos", mos)
    if release is not None:
        st.run("to_frame + to_csv", lambda: release.to_frame().to_csv(args.out))
    peak = peak_gb()
    ok_t, ok_m = st.total <= GOAL_S, peak <= GOAL_GB
    verdict = {True: "OK", False: "OVER"}
    print(f"total (make_cells .. csv) {st.total:8.2f} s   goal <= {GOAL_S:g} s   {verdict[ok_t]}")
    print(f"peak memory (VmHWM)       {peak:8.2f} GB  goal <= {GOAL_GB:g} GB  {verdict[ok_m]}")
    if release is None:
        print("release.csv not written: release_mos not yet available")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
