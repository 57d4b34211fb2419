"""release.json and FILES.txt of a release run: each method's own facts, nothing else.

release.json holds only what describes the released method's output: the method, statistic,
neighbour relation (an enum string: ``add_remove`` | ``add`` | ``replace_one``, or null for a
method without a guarantee), the epsilon and delta it satisfies, counts of ITS listed / released
cells (functions of its own output), the source of the cells, the randomness (described, never a
seed or a secret) and the guarantee in words. MOS's chi, chi table and caveats appear only in a
MOS release. With a private cell selection, the selection's (epsilon, delta) is composed into
the totals by basic composition, and the file says so.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from dptrain.release.mos import NOT_DP

SUPPRESSION_GUARANTEE = (
    "none: suppression releases the EXACT per-cell estimate of every cell with N >= k (no noise); it is NOT "
    "differentially private and its privacy loss is uncontrolled (exact values, differencing of overlapping "
    "releases; which cells are released depends on the private N)")

REPLACE_ONE_NOTE = (
    "epsilon_add_remove_comparison is the comparison convention used to set methods side by side (a replace-one "
    "mechanism at 2E is compared with add/remove mechanisms at E); it is NOT a guarantee: this mechanism treats "
    "each cell's N as public and has no add/remove guarantee of its own")


def _cell_counts(frame: pd.DataFrame, listed: Any) -> dict[str, Any]:
    not_released = frame.loc[~frame["released"].astype(bool), "reason"].value_counts()
    return {
        "source": listed.description,
        "listed": len(frame),
        "released": int(frame["released"].astype(bool).sum()),
        "not_released": {str(k): int(v) for k, v in not_released.items()},
    }


def method_epsilon(name: str, meta: dict) -> tuple[str | None, float | None, float | None]:
    """(neighbours, epsilon satisfied, delta) of a baseline's output from its meta."""
    if name.startswith("suppression_"):
        return None, None, None
    eps = meta.get("epsilon_spent", meta["epsilon"])
    return meta["neighbours"], float(eps), float(meta.get("delta", 0.0))


def composed_total(neighbours: str | None, epsilon: float | None, delta: float | None,
                   selection: dict | None) -> dict[str, Any]:
    """Basic composition of the method with a private cell selection ((eps_s, delta_s)-DP under
    add/remove). For a replace-one method the selection is first put on replace-one footing by group
    privacy over two steps: (2 eps_s, (1 + e^eps_s) delta_s)."""
    if epsilon is None:
        return {"epsilon": None, "delta": None,
                "note": "no guarantee: the released values are exact" + (
                    "; the private cell selection does not change that" if selection else "")}
    if selection is None:
        return {"epsilon": epsilon, "delta": delta,
                "note": "the list of cells is public (declared), so it costs nothing: the totals are the method's own"}
    es, ds = selection["epsilon"], selection["delta"]
    if neighbours == "replace_one":
        es_r, ds_r = 2.0 * es, (1.0 + math.exp(es)) * ds
        return {"epsilon": epsilon + es_r, "delta": (delta or 0.0) + ds_r,
                "note": f"basic composition of the private cell selection ({es:g}, {ds:g})-DP add/remove, i.e. "
                        f"({es_r:g}, {ds_r:.3g})-DP replace-one by group privacy, and the method "
                        f"({epsilon:g}, {delta or 0.0:g})-DP replace-one"}
    return {"epsilon": epsilon + es, "delta": (delta or 0.0) + ds,
            "note": f"basic composition: the private cell selection ({es:g}, {ds:g})-DP plus the method "
                    f"({epsilon:g}, {delta or 0.0:g})-DP, both under {neighbours} neighbours"}


def baseline_json(name: str, frame: pd.DataFrame, meta: dict, *, statistic: str, source: str, listed: Any,
                  randomness: str) -> dict[str, Any]:
    """release.json of a baseline method (everything but MOS)."""
    neighbours, eps, delta = method_epsilon(name, meta)
    out: dict[str, Any] = {
        "method": name,
        "statistic": statistic,
        "data": source,
        "cells": _cell_counts(frame, listed),
        "neighbours": neighbours,
        "epsilon": eps,
        "delta": delta,
    }
    if neighbours == "replace_one":
        out["epsilon_add_remove_comparison"] = eps / 2.0
        out["epsilon_add_remove_comparison_note"] = REPLACE_ONE_NOTE
    out["cell_selection"] = listed.selection or {"mode": "declared", "epsilon": 0.0, "delta": 0.0}
    out["total"] = composed_total(neighbours, eps, delta, listed.selection)
    out["randomness"] = randomness if eps is not None else "no noise: the released values are exact"
    if name.startswith("suppression_"):
        out["guarantee"] = SUPPRESSION_GUARANTEE
    else:
        cells = ("the list of cells is public (declared)" if listed.selection is None else
                 f"the list of cells is ({listed.selection['epsilon']:g}, {listed.selection['delta']:g})-DP "
                 f"(private selection); the whole release is ({out['total']['epsilon']:g}, "
                 f"{out['total']['delta']:.3g})-DP by basic composition")
        out["guarantee"] = f"{meta['guarantee']}, at epsilon {eps:g}" + (
            f", delta {delta:g}" if delta else "") + f"; {cells}"
    # the meta's add/remove "equivalent" is the comparison convention, stated above with its label
    out["details"] = {k: v for k, v in meta.items()
                      if k not in ("guarantee", "neighbours", "statistic", "epsilon_add_remove_equivalent")}
    return out


def mos_json(mos: Any, *, conf: Any, source: str, listed: Any, randomness: str) -> dict[str, Any]:
    """release.json of a MOS release: NOT differentially private, and it says so first."""
    r = conf.release
    eps = dict(mos.epsilon)
    total = composed_total(r.neighbors, float(eps["total_per_cell"]), 0.0, listed.selection)
    total["note"] += "; all conditional on chi (MOS is NOT differentially private)"
    return {
        "method": "mos",
        "privacy": NOT_DP,
        "guarantee": NOT_DP,
        "statistic": r.statistic,
        "data": source,
        "cells": _cell_counts(mos.frame, listed),
        "neighbours": r.neighbors,
        "noise": r.noise,
        "epsilon": eps,
        "epsilon_note": "epsilon is per statistic (theta, SE, N); a cell costs their sum (sequential "
                        "composition); disjoint cells compose in parallel, so the release's total is the per-cell sum",
        "delta": 0.0,
        "cell_selection": listed.selection or {"mode": "declared", "epsilon": 0.0, "delta": 0.0},
        "total": total,
        "chi": mos.chi_table.to_dict(orient="records"),
        "chi_by": list(r.chi_by) or "all cells",
        "randomness": randomness,
        "caveats": list(mos.info.get("caveats", [])),
        "mos_details": {k: v for k, v in mos.info.items() if k not in ("privacy", "caveats", "rng")},
    }


def custom_json(rel: Any, *, stat_fn: str, source: str, listed: Any, randomness: str) -> dict[str, Any]:
    """release.json of a MOS release of a custom statistic (theta and N, no SE)."""
    eps = dict(rel.epsilon)
    total = composed_total("add_remove", float(eps["total_per_cell"]), 0.0, listed.selection)
    total["note"] += "; all conditional on chi (MOS is NOT differentially private)"
    return {
        **{k: v for k, v in rel.info.items() if k != "rng"}, "method": "mos", "guarantee": NOT_DP,
        "stat_fn": stat_fn, "data": source, "epsilon": eps, "cells": _cell_counts(rel.frame, listed),
        "cell_selection": listed.selection or {"mode": "declared", "epsilon": 0.0, "delta": 0.0},
        "total": total, "randomness": randomness,
        "note": "custom statistic: theta and N released (no SE); no baseline comparison (baselines need OLS)",
    }


def guarantee_line(facts: dict[str, Any]) -> str:
    """One line for FILES.txt: what release.csv's label covers."""
    return str(facts["guarantee"])
