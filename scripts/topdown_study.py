#!/usr/bin/env python
"""TopDown against two baselines on the simulated geography (issue 33).

    OMP_WAIT_POLICY=PASSIVE python scripts/topdown_study.py                # 50 draws per rho, about 3 min
    python scripts/topdown_study.py --reps 5 --rhos 0.5 --out /tmp/topdown

The geography is dptrain.data.geography.simulate_geography(--seed) with its defaults (public seed
0: 4 states, 300 counties, 1,010 tracts, 24 cells of which 4 are structural zeros, 3,999,856
people). For each rho (zCDP, converted to epsilon at delta = 1e-6 by the RDP accountant) and each
of --reps draws of fresh noise (OpenDP's CSPRNG, not seeded), the methods are:

* ``topdown``: dptrain.release.tables.topdown.topdown on measurements with the default shares
  (nation, state, county, tract) = (0.1, 0.2, 0.3, 0.4) and the state populations invariant;
* ``topdown_no_inv``: the same measurements, no invariant;
* ``no_post``: the same measurements as they are;
* ``bottom_up``: the same measurements' tracts summed up the tree (they hold 0.4 of rho);
* ``bottom_up_all``: fresh measurements of the tracts only, with all of rho, summed up the tree.

Writes ``summary.csv`` (one row per rho, method and level: the mean over draws of
dptrain.release.tables.topdown.evaluate's columns, and the standard error of bias_small) and
``summary.md`` (the same as tables, one per level, with the run's time and load) into --out.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dptrain.data.geography import simulate_geography
from dptrain.privacy.accounting import history_epsilon
from dptrain.privacy.events import zcdp_event
from dptrain.release.tables import topdown as td

METHODS = ("topdown", "topdown_no_inv", "no_post", "bottom_up", "bottom_up_all")
METRICS = ("mae_total", "rmse_total", "mae_cell", "rmse_cell", "bias_small", "pop_small", "bias_large", "pop_large")
DELTA = 1e-6


def one_draw(geo, rho: float) -> dict[str, pd.DataFrame]:
    """evaluate() of every method on one draw of noise."""
    h = geo.hierarchy
    m = td.measure(geo, rho, invariants="states")
    no_inv = dataclasses.replace(m, invariants="none", totals=(None,) * len(m.totals))
    leaves = td.measure(geo, rho, shares=(0,) * (len(geo.levels) - 1) + (1,), invariants="none")
    estimates = {"topdown": td.topdown(h, m), "topdown_no_inv": td.topdown(h, no_inv),
                 "no_post": td.no_post_processing(h, m), "bottom_up": td.bottom_up(h, m),
                 "bottom_up_all": td.bottom_up(h, leaves)}
    return {name: td.evaluate(geo, est) for name, est in estimates.items()}


def study(geo, rhos: list[float], reps: int) -> pd.DataFrame:
    rows = []
    for rho in rhos:
        eps = history_epsilon([(zcdp_event(rho), 1)], delta=DELTA, accountant="rdp")
        started = time.perf_counter()
        draws = [one_draw(geo, rho) for _ in range(reps)]
        print(f"rho {rho}: epsilon {eps:.3f} at delta {DELTA:g}; {reps} draws in {time.perf_counter() - started:.1f} s",
              flush=True)
        for method in METHODS:
            stack = pd.concat([d[method] for d in draws])
            mean = stack.groupby("level", sort=False)[list(METRICS)].mean()
            se = stack.groupby("level", sort=False)["bias_small"].std(ddof=1) / np.sqrt(reps)
            for level, row in mean.iterrows():
                rows.append({"rho": rho, "epsilon": round(eps, 4), "method": method, "level": level, "reps": reps,
                             **row.to_dict(), "bias_small_se": se[level] if reps > 1 else float("nan")})
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    cols = ["rho", "epsilon", "method", "mae_total", "rmse_total", "mae_cell", "rmse_cell", "bias_small",
            "bias_small_se", "bias_large"]
    out = []
    for level, part in df.groupby("level", sort=False):
        first = part.iloc[0]
        out.append(f"### {level} ({int(first['units'])} units; smallest tenth: {first['pop_small']:,.0f} people "
                   f"on average, largest tenth: {first['pop_large']:,.0f})\n")
        out.append("| " + " | ".join(cols) + " |")
        out.append("|" + "---|" * len(cols))
        for _, r in part.iterrows():
            out.append("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--rhos", type=float, nargs="+", default=[0.1, 0.5, 2.0])
    p.add_argument("--seed", type=int, default=0, help="the geography's public seed")
    p.add_argument("--out", type=Path, default=REPO / "experiments" / "one_shot" / "topdown")
    args = p.parse_args(argv)
    started, load_before = time.perf_counter(), os.getloadavg()
    geo = simulate_geography(args.seed)
    units = {name: geo.hierarchy.n_units(lv) for lv, name in enumerate(geo.levels)}
    df = study(geo, args.rhos, args.reps)
    df.insert(4, "units", df["level"].map(units))
    df[[*METRICS, "bias_small_se"]] = df[[*METRICS, "bias_small_se"]].round(4)  # a mean of exact zeros is 0, not 2e-18
    seconds, load_after = time.perf_counter() - started, os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "summary.csv", index=False, float_format="%.6g")
    run = (f"geography seed {args.seed}: {sum(units.values()) - 1} units below the nation, "
           f"{int(geo.population(0)[0]):,} people; {args.reps} draws per rho; run time {seconds:.0f} s; "
           f"load average (1, 5, 15 min) before {', '.join(f'{v:.2f}' for v in load_before)}, "
           f"after {', '.join(f'{v:.2f}' for v in load_after)}; {os.cpu_count()} CPUs")
    text = f"{run}\n\n{markdown(df)}"
    (args.out / "summary.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
