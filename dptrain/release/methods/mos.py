"""MOS, maximum observed sensitivity noise infusion (``release.method=mos``, the default;
Chetty & Friedman 2019): theta, its SE and N per cell, noise scaled by chi / N. NOT
differentially private: chi comes from the private data (docs/release.md sections 2-4, 9).

The mechanism itself is :func:`dptrain.release.mos.release_mos` (also the Python API's); this
module runs it on a release run's cells with the run's settings (``release.neighbors``,
``release.noise``, ``release.chi_by``, ``release.min_n``) and writes its release.json.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours
from dptrain.release.api import CellEstimates
from dptrain.release.cell_domain import chi_group_labels
from dptrain.release.methods.base import RELEASE_METHODS, MethodResult, ReleaseMethod
from dptrain.release.mos import NOT_DP, MOSConfig, MOSInputs, MOSRelease, release_mos
from dptrain.release.report import RunFacts, cell_counts, composed_total, declared_selection
from dptrain.release.sensitivity import Sensitivity
from dptrain.release.spec import ReleaseSpec


def min_n_rule(sens: Sensitivity, n: np.ndarray, min_n: int) -> Sensitivity:
    """Cells with N < min_n get an infinite LS (so they are neither released nor in chi)."""
    small = (n < min_n) & np.isfinite(sens.ls)
    if not small.any():
        return sens
    reason = sens.reason.copy()
    reason[small] = f"N < release.min_n = {min_n}"
    return dataclasses.replace(sens, ls=np.where(small, np.inf, sens.ls), reason=reason)


def mos_sensitivities(est: CellEstimates, config: ReleaseSpec) -> tuple[Sensitivity, Sensitivity]:
    """The LS of theta and of its SE with the min_n rule, computed once per run (kept on ``est``)."""
    r = config

    def compute() -> tuple[Sensitivity, Sensitivity]:
        kw = {"statistic": r.statistic, "neighbors": r.neighbors}
        return (min_n_rule(est.local_sensitivity(**kw), est.cells.n, r.min_n),
                min_n_rule(est.se_local_sensitivity(**kw), est.cells.n, r.min_n))

    return est.memo(("mos", r.statistic, r.neighbors, r.min_n), compute)


def mos_json(mos: MOSRelease, *, facts: RunFacts) -> dict[str, Any]:
    """release.json of a MOS release: NOT differentially private, and it says so first."""
    r = facts.config
    eps = dict(mos.epsilon)
    total = composed_total(r.neighbors, float(eps["total_per_cell"]), 0.0, facts.listed.selection)
    total["note"] += "; all conditional on chi (MOS is NOT differentially private)"
    return {
        "method": "mos",
        "privacy": NOT_DP,
        "guarantee": NOT_DP,
        "statistic": r.statistic,
        "data": facts.source,
        "cells": cell_counts(mos.frame, facts.listed),
        "neighbours": r.neighbors,
        "noise": r.noise,
        "epsilon": eps,
        "epsilon_note": "epsilon is per statistic (theta, SE, N); a cell costs their sum (sequential "
                        "composition); disjoint cells compose in parallel, so the release's total is the per-cell sum",
        "delta": 0.0,
        "cell_selection": declared_selection(facts.listed),
        "total": total,
        "chi": mos.chi_table.to_dict(orient="records"),
        "chi_by": list(r.chi_by) or "all cells",
        "randomness": facts.randomness,
        "caveats": list(mos.info.get("caveats", [])),
        "mos_details": {k: v for k, v in mos.info.items() if k not in ("privacy", "caveats", "rng")},
    }


class MOS(ReleaseMethod):
    """MOS with the run's settings; its neighbour relation is ``release.neighbors``."""

    has_guarantee = False
    tail_figure = True

    def relation(self, config: ReleaseSpec) -> Neighbours:
        return Neighbours.parse(config.neighbors, setting="release.neighbors")

    def warning(self, name: str, config: ReleaseSpec) -> str:
        return f"release.method={name}: {NOT_DP}"

    def budget(self, epsilon: float, config: ReleaseSpec) -> tuple[float, float]:
        """theta, its SE and N each get epsilon: 3 epsilon per cell (conditional on chi: NOT DP)."""
        return float(sum(MOSConfig().epsilon_split)) * self.run_epsilon(epsilon, config), 0.0

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseSpec) -> MethodResult:
        sens, se_sens = mos_sensitivities(est, config)
        groups = chi_group_labels(est.listed, list(config.chi_by)) if est.listed is not None else None
        mos = release_mos(est.cells, statistic=config.statistic, epsilon=epsilon, rng=rng,
                          precomputed=MOSInputs(sensitivity=sens, se_sensitivity=se_sens, fit=est.fit),
                          config=MOSConfig(neighbors=config.neighbors, noise=config.noise, chi_groups=groups))
        meta = {"method": "mos", "statistic": config.statistic, "neighbours": config.neighbors,
                "epsilon": epsilon, "delta": 0.0, "guarantee": NOT_DP}
        return MethodResult(frame=mos.frame, meta=meta, detail=mos)

    def published(self, est: CellEstimates, result: MethodResult) -> pd.DataFrame:
        return result.detail.to_frame()

    def release_json(self, name: str, result: MethodResult, *, facts: RunFacts) -> dict[str, Any]:
        return mos_json(result.detail, facts=facts)


RELEASE_METHODS.register("mos", MOS())
