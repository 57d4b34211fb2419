"""DP-MOS (``release.method=dp_mos``): MOS's noise shape, chi / (epsilon N~) per cell, with chi
chosen privately and each cell released only after a private stability test, so that the whole
release is (epsilon, delta)-DP under add/remove neighbours with no "conditional on chi" caveat
(docs/dp_mos.md; the mechanism is :func:`dptrain.release.dp_mos.release_dp_mos`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours
from dptrain.release.api import CellEstimates
from dptrain.release.cell_domain import chi_group_labels
from dptrain.release.dp_mos import GUARANTEE, DPMOSConfig, DPMOSRelease, release_dp_mos, stage_epsilons
from dptrain.release.methods.base import RELEASE_METHODS, MethodResult, ReleaseMethod
from dptrain.release.report import RunFacts, cell_counts, composed_total, declared_selection
from dptrain.release.spec import ReleaseSpec
from dptrain.release.stability import stability_bounds

SPLIT_TEXT = ("sequential composition over the stages of a cell (noisy N, the SE statistics, chi, the stability "
              "test, theta); cells are disjoint, so the release costs the per-cell sum (parallel composition); "
              "chi's exponential mechanism sees every cell and is counted once in that sum")


def dp_mos_config(config: ReleaseSpec, est: CellEstimates) -> DPMOSConfig:
    """The run's DP-MOS settings (release.dp_mos_split, release.dp_mos_chi_quantile, release.min_n,
    release.chi_by: one chi per group of the PUBLIC cell list)."""
    split = {str(k): v for k, v in dict(config.dp_mos_split).items()}
    groups = chi_group_labels(est.listed, list(config.chi_by)) if est.listed is not None else None
    return DPMOSConfig(split=split, chi_quantile=float(config.dp_mos_chi_quantile), min_n=int(config.min_n),
                       chi_groups=groups, refuse_small_groups=config.method == "dp_mos")


class DPMOS(ReleaseMethod):
    """DP-MOS with the run's settings: (epsilon_total, release.delta)-DP, add/remove."""

    neighbours = Neighbours.ADD_REMOVE
    tail_figure = True

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseSpec) -> MethodResult:
        def bounds(k_max: int) -> np.ndarray:  # one computation per run, at the largest radius asked
            cached = est.memo(("dp_mos_bounds", config.statistic), lambda: {"A": None})
            if cached["A"] is None or cached["A"].shape[1] < k_max + 1:
                cached["A"] = stability_bounds(est.cells, statistic=config.statistic, k_max=max(k_max, 40))
            return cached["A"]

        rel = release_dp_mos(est.cells, statistic=config.statistic, epsilon=epsilon, delta=config.delta, rng=rng,
                             config=dp_mos_config(config, est), bounds=bounds)
        meta = {"method": "dp_mos", "statistic": config.statistic, "neighbours": "add_remove",
                "epsilon": rel.epsilon["total"], "delta": rel.delta, "guarantee": GUARANTEE}
        return MethodResult(frame=rel.frame, meta=meta, detail=rel)

    def budget(self, epsilon: float, config: ReleaseSpec) -> tuple[float, float]:
        """epsilon times the sum of the five stages' shares (release.dp_mos_split), release.delta."""
        split = {str(k): v for k, v in dict(config.dp_mos_split).items()}
        return float(sum(stage_epsilons(epsilon, split).values())), float(config.delta)

    def published(self, est: CellEstimates, result: MethodResult) -> pd.DataFrame:
        return pd.concat([est.cells.keys.reset_index(drop=True), result.frame.reset_index(drop=True)], axis=1)

    def release_json(self, name: str, result: MethodResult, *, facts: RunFacts) -> dict[str, Any]:
        return dp_mos_json(result.detail, facts=facts)


def dp_mos_json(rel: DPMOSRelease, *, facts: RunFacts) -> dict[str, Any]:
    """release.json of a DP-MOS release: the end-to-end guarantee, the split, chi."""
    r = facts.config
    total = composed_total("add_remove", rel.epsilon["total"], rel.delta, facts.listed.selection)
    cells = ("the list of cells is public (declared)" if facts.listed.selection is None else
             f"with the private cell selection the whole release is ({total['epsilon']:g}, "
             f"{total['delta']:.3g})-DP by basic composition")
    return {
        "method": "dp_mos",
        "privacy": GUARANTEE,
        "guarantee": f"{GUARANTEE}, at epsilon {rel.epsilon['total']:g}, delta {rel.delta:g}; {cells}",
        "statistic": r.statistic,
        "data": facts.source,
        "cells": cell_counts(rel.frame, facts.listed),
        "neighbours": "add_remove",
        "epsilon": rel.epsilon["total"],
        "delta": rel.delta,
        "epsilon_split": {k: v for k, v in rel.epsilon.items() if k != "total"},
        "epsilon_split_note": SPLIT_TEXT,
        "chi": rel.chi,
        "chi_by": list(r.chi_by) or "all cells",
        "cell_selection": declared_selection(facts.listed),
        "total": total,
        "randomness": facts.randomness,
        "interval": ("95% interval theta~ +/- the exact 95% point of N(0, SE_samp^2) + Laplace(noise scale): "
                     "SE_samp from the noisy Sxx, Syy and mean of x (Syy, not the residual sum: conservative), "
                     "computed from released values only; se_released = sqrt(SE_samp^2 + noise_sd^2). Sxx~ and "
                     "Syy~ are floored at their noise scales (conservative where the noise swamps them)"),
        "not_covered": ["the choice of epsilon, split or method after looking at any result",
                        "differencing several releases of overlapping data (their epsilons add up)"],
        "details": rel.info,
    }


RELEASE_METHODS.register("dp_mos", DPMOS())
