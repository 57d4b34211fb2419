"""Summarise a multirun sweep of release runs (experiment=mos_atlas) into one table per metric.

    python scripts/summarize_release_sweep.py MULTIRUN_DIR [--out DIR] [--metric rmse_truth ...]

Reads every ``<run>/private/evaluation/comparison.csv`` (the private evaluation a release run
writes for simulated data) and ``<run>/.hydra/overrides.yaml`` below MULTIRUN_DIR and writes
``summary.csv`` (long: overrides, method, band, metrics) and ``summary.md`` (for each metric and
each setting other than epsilon, i.e. ``release.epsilon_per_statistic``: method x epsilon on all
cells, and method x band at each epsilon) into --out (default: MULTIRUN_DIR).

The summary is computed from exact values: on simulated data (data=atlas) it is a study result;
on real data it would be as private as the comparisons it reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

from dptrain.release.evaluate import to_markdown

#: the override that gives the "epsilon" column (per released statistic): release.epsilon_per_statistic, or
#: release.epsilon in the folders of a sweep run before that setting was renamed
EPSILON_KEYS = ("epsilon_per_statistic", "epsilon")


def load(sweep: Path) -> pd.DataFrame:
    frames = []
    for comp in sorted(sweep.glob("*/private/evaluation/comparison.csv")):
        overrides = yaml.safe_load((comp.parents[2] / ".hydra" / "overrides.yaml").read_text()) or []
        table = pd.read_csv(comp)
        for item in overrides:
            key, _, value = item.partition("=")
            if key.startswith("release.") and key != "release.tail_epsilons":
                name = key.removeprefix("release.")
                table["epsilon" if name in EPSILON_KEYS else name] = value
            elif key == "data.generator":
                table["generator"] = value
        frames.append(table)
    if not frames:
        raise SystemExit(f"no */private/evaluation/comparison.csv below {sweep} "
                         "(release.private_evaluation=auto writes it for data=atlas)")
    out = pd.concat(frames, ignore_index=True)
    out["epsilon"] = out["epsilon"].astype(float) if "epsilon" in out else 1.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--metric", nargs="+",
                    default=["rmse_truth", "p68_truth", "share_released", "coverage95", "tail_top", "slope_released"])
    ap.add_argument("--band-metric", nargs="+", default=["rmse_truth", "coverage95", "ci_width", "share_released"],
                    help="metrics tabulated method x cell-size band at each epsilon")
    args = ap.parse_args()
    out = args.out or args.sweep
    out.mkdir(parents=True, exist_ok=True)
    table = load(args.sweep)
    table.to_csv(out / "summary.csv", index=False)
    settings = [c for c in table.columns if c not in ("epsilon",) and c in {"min_n", "statistic", "neighbors", "noise",
                                                                                    "generator"}]
    groups = table.groupby(settings) if settings else [((), table)]
    lines = [f"# Release sweep summary ({args.sweep.name})", ""]
    for key, part in groups:
        label = ", ".join(f"{s}={v}" for s, v in zip(settings, key if isinstance(key, tuple) else (key,)))
        for metric in args.metric:
            wide = part[part.band == "all"].pivot_table(index="method", columns="epsilon", values=metric)
            wide.columns = [f"eps={c:g}" for c in wide.columns]
            lines += [f"## {metric}, all cells ({label or 'defaults'})", "", to_markdown(wide.reset_index()), ""]
        for metric in args.band_metric:
            if metric not in part or part[metric].isna().all():
                continue
            for eps, sub in part.groupby("epsilon"):
                wide = sub.pivot_table(index="method", columns="band", values=metric, dropna=False)
                order = sub.drop_duplicates("band").sort_values("n_lo", na_position="last")["band"]
                wide = wide[[b for b in order if b in wide.columns]]
                lines += [f"## {metric} by cell-size band, epsilon={eps:g} ({label or 'defaults'})", "",
                          to_markdown(wide.reset_index()), ""]
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out / 'summary.csv'} and {out / 'summary.md'}")


if __name__ == "__main__":
    main()
