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

from dataclasses import dataclass
from typing import Any

import pandas as pd

from dptrain.core.neighbours import Neighbours, replace_one_from_add_remove
from dptrain.release.cell_domain import CellDomain
from dptrain.release.mos import NOT_DP
from dptrain.release.spec import ReleaseSpec

REPLACE_ONE_NOTE = (
    "epsilon_add_remove_comparison is the comparison convention used to set methods side by side (a replace-one "
    "mechanism at 2E is compared with add/remove mechanisms at E); it is NOT a guarantee: this mechanism treats "
    "each cell's N as public and has no add/remove guarantee of its own")


@dataclass(frozen=True)
class RunFacts:
    """What every release.json says about the run: its release settings, the data source (in
    words), the listed cells and the randomness (described, never a seed)."""

    config: ReleaseSpec
    source: str
    listed: CellDomain
    randomness: str


def cell_counts(frame: pd.DataFrame, listed: Any) -> dict[str, Any]:
    """Counts of a method's OWN listed and released cells (functions of its output)."""
    not_released = frame.loc[~frame["released"].astype(bool), "reason"].value_counts()
    return {
        "source": listed.description,
        "listed": len(frame),
        "released": int(frame["released"].astype(bool).sum()),
        "not_released": {str(k): int(v) for k, v in not_released.items()},
    }


def declared_selection(listed: Any) -> dict[str, Any]:
    """The cell selection's facts: the private selection's, or "declared" (costs nothing)."""
    return listed.selection or {"mode": "declared", "epsilon": 0.0, "delta": 0.0}


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
    if neighbours == Neighbours.REPLACE_ONE.value:
        es_r, ds_r = replace_one_from_add_remove(es, ds)
        return {"epsilon": epsilon + es_r, "delta": (delta or 0.0) + ds_r,
                "note": f"basic composition of the private cell selection ({es:g}, {ds:g})-DP add/remove, i.e. "
                        f"({es_r:g}, {ds_r:.3g})-DP replace-one by group privacy, and the method "
                        f"({epsilon:g}, {delta or 0.0:g})-DP replace-one"}
    return {"epsilon": epsilon + es, "delta": (delta or 0.0) + ds,
            "note": f"basic composition: the private cell selection ({es:g}, {ds:g})-DP plus the method "
                    f"({epsilon:g}, {delta or 0.0:g})-DP, both under {neighbours} neighbours"}


def _guarantee(meta: dict, eps: float, delta: float, listed: Any, total: dict) -> str:
    cells = ("the list of cells is public (declared)" if listed.selection is None else
             f"the list of cells is ({listed.selection['epsilon']:g}, {listed.selection['delta']:g})-DP "
             f"(private selection); the whole release is ({total['epsilon']:g}, "
             f"{total['delta']:.3g})-DP by basic composition")
    return f"{meta['guarantee']}, at epsilon {eps:g}" + (f", delta {delta:g}" if delta else "") + f"; {cells}"


def baseline_json(name: str, result: Any, *, neighbours: Neighbours | None, facts: RunFacts,
                  guarantee: str | None = None) -> dict[str, Any]:
    """release.json of a method that releases theta per cell (every method but MOS): its
    ``neighbours`` (None: no guarantee, then ``guarantee`` or the meta's says so), the epsilon and
    delta it satisfies (the meta's ``epsilon_spent`` where it spent less than it was given)."""
    frame, meta, listed = result.frame, result.meta, facts.listed
    rel = None if neighbours is None else Neighbours(neighbours).value
    eps = None if rel is None else float(meta.get("epsilon_spent", meta["epsilon"]))
    delta = None if rel is None else float(meta.get("delta", 0.0))
    out: dict[str, Any] = {"method": name, "statistic": facts.config.statistic, "data": facts.source,
                           "cells": cell_counts(frame, listed), "neighbours": rel, "epsilon": eps, "delta": delta}
    if rel == Neighbours.REPLACE_ONE.value:
        out["epsilon_add_remove_comparison"] = eps / 2.0
        out["epsilon_add_remove_comparison_note"] = REPLACE_ONE_NOTE
    out["cell_selection"] = declared_selection(listed)
    out["total"] = composed_total(rel, eps, delta, listed.selection)
    out["randomness"] = facts.randomness if eps is not None else "no noise: the released values are exact"
    if rel is None:
        out["guarantee"] = guarantee or meta["guarantee"]
    else:
        out["guarantee"] = _guarantee(meta, eps, delta, listed, out["total"])
    # the meta's add/remove "equivalent" is the comparison convention, stated above with its label
    out["details"] = {k: v for k, v in meta.items()
                      if k not in ("guarantee", "neighbours", "statistic", "epsilon_add_remove_equivalent")}
    return out


def custom_json(rel: Any, *, stat_fn: str, facts: RunFacts) -> dict[str, Any]:
    """release.json of a MOS release of a custom statistic (theta and N, no SE)."""
    eps = dict(rel.epsilon)
    total = composed_total("add_remove", float(eps["total_per_cell"]), 0.0, facts.listed.selection)
    total["note"] += "; all conditional on chi (MOS is NOT differentially private)"
    return {
        **{k: v for k, v in rel.info.items() if k != "rng"}, "method": "mos", "guarantee": NOT_DP,
        "stat_fn": stat_fn, "data": facts.source, "epsilon": eps, "cells": cell_counts(rel.frame, facts.listed),
        "cell_selection": declared_selection(facts.listed),
        "total": total, "randomness": facts.randomness,
        "note": "custom statistic: theta and N released (no SE); no baseline comparison (baselines need OLS)",
    }


def guarantee_line(facts: dict[str, Any]) -> str:
    """One line for FILES.txt: what release.csv's label covers."""
    return str(facts["guarantee"])
