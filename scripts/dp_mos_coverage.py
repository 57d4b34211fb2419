"""Coverage of DP-MOS's 95% intervals over many noise draws, by cell-size band, on the simulators.

    python scripts/dp_mos_coverage.py [--draws 12] [--out experiments/mos_vs_baselines/dp_mos_coverage.md]

One release run draws the noise once, so a band's coverage there has the sampling error of one
draw on tens of cells. This repeats the DP-MOS release (the mechanism only, same cells) with
``--draws`` independent noise streams at epsilon 1, 2, 4 and 8 (release.min_n = 20, default
split and quantile) on the Atlas-like simulator and the Figure-2 design, and reports the share of
released cells whose interval holds the true p25, per band, with the number of (cell, draw) pairs.
Uses exact simulated truth: a study result, not a release.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from dptrain.data.atlas import simulate_atlas, simulate_figure2
from dptrain.release.cells import Domain, make_cells
from dptrain.release.dp_mos import DPMOSConfig, release_dp_mos
from dptrain.release.evaluate import to_markdown
from dptrain.release.stability import stability_bounds

BANDS = ((20, 50), (50, 100), (100, 300), (300, np.inf))


def coverage(design: str, eps: float, draws: int) -> dict:
    rows, truth = simulate_atlas(seed=0) if design == "atlas" else simulate_figure2(seed=0)
    g = len(truth)
    cells = make_cells(rows.x.to_numpy(), rows.y.to_numpy(), rows.cell.to_numpy(),
                       keys=pd.DataFrame({"cell": np.arange(g)}), domain=Domain())
    a = stability_bounds(cells, statistic="p25", k_max=80)
    n, tr = cells.n, truth["p25"].to_numpy()
    hits, total = np.zeros(len(BANDS)), np.zeros(len(BANDS))
    for d in range(draws):
        f = release_dp_mos(cells, statistic="p25", epsilon=eps, delta=1e-6, rng=np.random.default_rng([7, d]),
                           config=DPMOSConfig(min_n=20), bounds=lambda k: a).frame
        lo, hi = f["ci_low"].to_numpy(), f["ci_high"].to_numpy()
        ok = np.isfinite(lo)
        for i, (b0, b1) in enumerate(BANDS):
            m = ok & (n >= b0) & (n < b1)
            hits[i] += np.sum((lo[m] <= tr[m]) & (tr[m] <= hi[m]))
            total[i] += m.sum()
    out = {"design": design, "epsilon": eps}
    for i, (b0, b1) in enumerate(BANDS):
        label = f"[{b0},{'inf' if np.isinf(b1) else int(b1)})"
        out[label] = f"{hits[i] / total[i]:.3f} ({int(total[i])})" if total[i] else ""
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=12)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    table = pd.DataFrame([coverage(d, e, args.draws) for d in ("atlas", "figure2") for e in (1.0, 2.0, 4.0, 8.0)])
    text = (f"# DP-MOS interval coverage of the true p25 over {args.draws} noise draws\n\n"
            "Share of released cells whose 95% interval holds the truth (number of cell x draw pairs); "
            "release.min_n=20, default split and chi quantile. `python scripts/dp_mos_coverage.py`.\n\n"
            + to_markdown(table) + "\n")
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
