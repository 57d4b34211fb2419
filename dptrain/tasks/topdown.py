"""task=topdown: Census-style TopDown on the simulated geography (:mod:`dptrain.data.geography`,
:mod:`dptrain.release.tables.topdown`): noisy counts of every unit at every level (discrete
Gaussian, rho split over the levels), invariants exact, then made consistent, nonnegative and
integer from the nation down. Writes each level's released table (publishable), the report, and
(the data are simulated) the evaluation against bottom-up and no post-processing under private/."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from dptrain.data.geography import simulate_geography
from dptrain.privacy.randomness import Randomness
from dptrain.release.oneshot import ONE_SHOT
from dptrain.release.tables.topdown import bottom_up, evaluate, no_post_processing
from dptrain.release.zcdp import gaussian_rho
from dptrain.runfolder.folder import Report, RunFolder
from dptrain.settings.topdown import TopDownRunConfig, geography_settings, validate_topdown

log = logging.getLogger("dptrain.topdown")

NEIGHBOURS = "add/remove one person: each level's unit vector moves by one in one cell (L2 sensitivity 1)"


def _neighbours(k: int) -> str:
    if k == 1:
        return NEIGHBOURS
    return (f"add/remove one unit of at most {k} persons (topdown.max_persons_per_unit, e.g. a household): each "
            f"level's unit vectors move by at most {k} in L2 (all {k} in one cell the worst case)")


def _unit(k: int) -> dict[str, Any]:
    """The report's unit_of_privacy: the simulated persons, or groups of at most k of them."""
    unit = {"column": None, "unit": "one person" if k == 1 else f"a group of at most {k} persons",
            "max_rows_per_unit": k, "l2_sensitivity": float(k), "cap": "none: the simulated geography has one row "
            "per person and no unit column; the bound is declared (topdown.max_persons_per_unit)"}
    if k == 1:
        unit["note"] = ("person-level: a household of k persons is protected only by group privacy at k "
                        "(topdown.max_persons_per_unit=k for a guarantee per household)")
    return unit


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=topdown (module docstring). Returns TopDown's tract-level mean absolute cell error."""
    conf: TopDownRunConfig = OmegaConf.to_object(cfg)
    validate_topdown(conf)
    t, p = conf.topdown, conf.privacy
    geo = simulate_geography(conf.seed, states=t.states, counties=t.counties, population=t.population)
    rho = gaussian_rho(p.epsilon, p.delta)
    mechanism = ONE_SHOT.get("topdown")
    m, est = mechanism.release(geo, geography_settings(t), rho=rho, rng=Randomness.fresh().numpy("topdown-ties"))
    folder, files = RunFolder.of(run_dir), []
    folder.publishable("tables/", "each level's released counts (covered by the guarantee; invariants exact)")
    for level, table in zip(geo.levels, est):
        frame = pd.DataFrame(table, columns=list(geo.hierarchy.cell_labels))
        frame.insert(0, "unit", list(geo.names[geo.levels.index(level)]))
        files.append(f"tables/{level}.csv")
        folder.write_text(files[-1], frame.to_csv(index=False))
    rows = [evaluate(geo, e).assign(method=name) for name, e in (
        ("topdown", est), ("bottom_up", bottom_up(geo.hierarchy, m)), ("no_post_processing",
                                                                       no_post_processing(geo.hierarchy, m)))]
    evaluation = pd.concat(rows, ignore_index=True)
    folder.write_text("evaluation.csv", evaluation.to_csv(index=False, float_format="%.6g"),
                      "TopDown, bottom-up and no post-processing against the simulated truth", private=True)
    eps = mechanism.guarantee(mechanism.event(m), delta=p.delta).epsilon
    neighbours = _neighbours(t.max_persons_per_unit)
    guarantee = (f"({eps:.4g}, {p.delta:.3g})-DP, {m.rho:.6g}-zCDP in all (levels' rho summed: "
                 + ", ".join(f"{lv} {r:.4g}" for lv, r in zip(geo.levels, m.rhos))
                 + f"), neighbours: {neighbours}; the invariants ({t.invariants}) are released EXACTLY, outside "
                 "the guarantee, by policy; for every file under tables/")
    report = {"task": "topdown", "private": True, "guarantee": guarantee, "epsilon": eps, "delta": p.delta,
              "rho": m.rho, "levels": [{"level": lv, "rho": r, "sigma": s, "l2_sensitivity": m.sensitivity}
                                       for lv, r, s in zip(geo.levels, m.rhos, m.sigmas)],
              "unit_of_privacy": _unit(t.max_persons_per_unit),
              "invariants": t.invariants, "neighbours": neighbours, "simulator_seed": conf.seed,
              "post_processing": "top down: per parent, the children's cells projected onto the nonnegative "
                                 "vectors summing to the parent's (simplex projection), rounded keeping the sums; "
                                 "structural zeros kept at 0", "files": files}
    folder.finish(guarantee=guarantee, finite_guarantee=True, report=Report(
        "privacy.json", report, "this report", text=lambda body: body["guarantee"] + "\n"))
    tract = evaluation[(evaluation.method == "topdown") & (evaluation.level == geo.levels[-1])]
    log.info("privacy: %s", guarantee)
    log.info("topdown: %s; tract cells' mean absolute error %.3g (bottom-up %.3g) -> %s/tables/",
             ", ".join(f"{lv} {len(n)}" for lv, n in zip(geo.levels, geo.names)), float(tract.mae_cell.iloc[0]),
             float(evaluation[(evaluation.method == "bottom_up") & (evaluation.level == geo.levels[-1])]
                   .mae_cell.iloc[0]), run_dir)
    return float(np.asarray(tract.mae_cell)[0])
