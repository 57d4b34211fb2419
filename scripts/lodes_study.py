"""Error and bias of the employer-employee mechanisms per cell-size band (issue 34's study): on the
simulated state (25,000 establishments, seed 0), for alpha in {0.05, 0.1, 0.2} and epsilon in
{1, 2, 4, 8}, each mechanism's mean absolute error, mean signed error (bias) and median relative
error per band of a cell's true total jobs, over ``--reps`` draws; a mechanism that cannot take an
(alpha, epsilon) (the smooth ones need beta > ln(1 + alpha)) is left out of that cell and said so.

    python scripts/lodes_study.py --reps 5 --out experiments/employer_employee
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dptrain.data.jobs import simulate_jobs  # noqa: E402
from dptrain.release.employer import mechanisms as mech  # noqa: E402

BANDS = (1, 10, 100, 1000, math.inf)
LABELS = ["1-9", "10-99", "100-999", "1000+"]
CAP = 1000
DELTA = 1e-6


def _release(name: str, n: np.ndarray, x_max: np.ndarray, n_cap: np.ndarray, alpha: float, eps: float,
             rng: np.random.Generator) -> np.ndarray | None:
    if name == "log_laplace":
        return mech.log_laplace(n, alpha, eps, rng)
    if name == "log_laplace_unbiased":
        return mech.log_laplace_unbiased(mech.log_laplace(n, alpha, eps, rng), alpha, eps)
    if name == "smooth_gamma":
        return mech.smooth_gamma(n, x_max, alpha, eps, rng) if eps / 10 > math.log1p(alpha) else None
    if name == "smooth_laplace":
        ok = eps / (2 * math.log(2 / DELTA)) > math.log1p(alpha)
        return mech.smooth_laplace(n, x_max, alpha, eps, DELTA, rng) if ok else None
    if name == "laplace_worker":
        return mech.laplace_worker(n, eps, rng)
    return mech.employer_laplace(n_cap, CAP, eps, rng)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    jobs = simulate_jobs(0)
    cells = jobs.cell_totals(("place", "sector", "ownership"))
    key = pd.DataFrame({"place": jobs.place, "sector": jobs.sector, "ownership": jobs.ownership,
                        "n": np.minimum(jobs.size, CAP)})
    n_cap = key.groupby(["place", "sector", "ownership"], sort=True)["n"].sum().to_numpy(float)
    n, x_max = cells["n"].to_numpy(float), cells["x_max"].to_numpy(float)
    band = pd.cut(cells["n"], BANDS, right=False, labels=LABELS).to_numpy()
    rng = np.random.default_rng(34)
    names = ["log_laplace", "log_laplace_unbiased", "smooth_gamma", "smooth_laplace", "laplace_worker",
             "employer_laplace"]
    rows = []
    for alpha in (0.05, 0.1, 0.2):
        for eps in (1.0, 2.0, 4.0, 8.0):
            for name in names:
                errs = [out - n for out in (_release(name, n, x_max, n_cap, alpha, eps, rng) for _ in range(args.reps))
                        if out is not None]
                if not errs:
                    rows.append({"alpha": alpha, "epsilon": eps, "mechanism": name, "band": "all",
                                 "note": "not defined here: beta <= ln(1 + alpha)"})
                    continue
                err = np.stack(errs)
                for b in LABELS:
                    m = band == b
                    rows.append({"alpha": alpha, "epsilon": eps, "mechanism": name, "band": b, "cells": int(m.sum()),
                                 "mae": float(np.abs(err[:, m]).mean()), "bias": float(err[:, m].mean()),
                                 "median_rel_error": float(np.median(np.abs(err[:, m]) / n[m]))})
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "results.csv", index=False, float_format="%.6g")
    _figure(df, args.out / "median_relative_error.png")
    head = (f"simulated state: {jobs.n_jobs} jobs, {jobs.n_establishments} establishments, {len(cells)} cells; "
            f"{args.reps} draws per setting; {time.perf_counter() - t0:.1f} s; load {os.getloadavg()[0]:.2f} on "
            f"{os.cpu_count()} cores")
    table = df[(df.alpha == 0.1) & (df.band != "all")].pivot_table(index=["epsilon", "band"], columns="mechanism",
                                                                    values="median_rel_error")
    (args.out / "summary.txt").write_text(head + "\n\nmedian relative error, alpha 0.1\n" + table.to_string(
        float_format=lambda v: f"{v:.4f}") + "\n")
    print(head)
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))


def _figure(df: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(1, 4, figsize=(16, 4), sharey=True)
    sub = df[(df.alpha == 0.1) & (df.band != "all")]
    for ax, b in zip(axes, LABELS):
        for name, g in sub[sub.band == b].groupby("mechanism"):
            ax.plot(g.epsilon, g.median_rel_error, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"cells of {b} jobs (alpha 0.1)")
        ax.set_xlabel("epsilon")
    axes[0].set_ylabel("median relative error")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
