"""task=lodes: job counts by place x NAICS sector x ownership on the simulated jobs data
(:mod:`dptrain.data.jobs`), released by each employer-employee mechanism
(:mod:`dptrain.release.employer.mechanisms`): one table per mechanism, the chosen one
(``lodes.publish``) at the top of the run folder, the others and the comparison against the exact
counts under private/."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from dptrain.data.jobs import SECTOR_LABELS, simulate_jobs
from dptrain.privacy.randomness import Randomness
from dptrain.release.employer.mechanisms import smooth_median
from dptrain.release.oneshot import ONE_SHOT, available, names
from dptrain.release.oneshot.er_ee import ErEeSettings
from dptrain.runfolder.folder import Report, RunFolder
from dptrain.settings.lodes import LodesRunConfig, er_ee_settings, marginal_sets, per_table, validate_lodes

log = logging.getLogger("dptrain.lodes")

#: size bands of the comparison (a cell's true total jobs)
BANDS = (1, 10, 100, 1000, math.inf)


def guarantees(settings: ErEeSettings, epsilon: float, delta: float) -> dict[str, dict[str, str]]:
    """Per registered mechanism at (epsilon, delta): its guarantee (the relation, as a
    :class:`Neighbours` value's name), what it protects and what it does not, its bias."""
    out = {}
    for name in names("er_ee"):
        mechanism = ONE_SHOT.get(name)
        g = mechanism.guarantee(mechanism.event((epsilon, delta)), delta=delta, settings=settings)
        out[name] = {"guarantee": g.statement, "protects": g.protects, "bias": g.bias}
    return out


def release(name: str, cells: pd.DataFrame, conf: LodesRunConfig, budget: tuple[float, float],
            rng: np.random.Generator, *, max_size: float) -> pd.DataFrame:
    """One mechanism's table at ``budget`` = (epsilon, delta): the released count per cell (the
    cell's key columns first) and a 95% interval; the smooth mechanisms' from the release and public
    quantities only (the settings and ``max_size``, the public largest establishment size:
    :mod:`dptrain.release.employer.intervals`), never from the cell's private largest size."""
    eps, delta = budget
    out = cells[[k for k in cells.columns if k not in ("n", "x_max", "n_capped", "establishments")]].copy()
    released, lo, hi = ONE_SHOT.get(name).release(cells, er_ee_settings(conf.lodes), epsilon=eps, delta=delta,
                                                 rng=rng, max_size=max_size)
    out["released"], out["ci_low"], out["ci_high"] = released, lo, hi
    return out


def compare(tables: dict[str, pd.DataFrame], cells: pd.DataFrame, marginal: str) -> list[dict]:
    """Per mechanism and size band of one marginal: cells, mean absolute error, mean signed error
    (bias), median relative error, against the exact totals (PRIVATE)."""
    band = pd.cut(cells["n"], BANDS, right=False, labels=["1-9", "10-99", "100-999", "1000+"])
    rows: list[dict] = []
    for name, t in tables.items():
        err = t["released"].to_numpy() - cells["n"].to_numpy()
        for b in band.cat.categories:
            m = (band == b).to_numpy()
            if m.any():
                rows.append({"marginal": marginal, "mechanism": name, "band": b, "cells": int(m.sum()),
                             "mae": float(np.abs(err[m]).mean()),
                             "bias": float(err[m].mean()),
                             "median_rel_error": float(np.median(np.abs(err[m]) / cells["n"].to_numpy()[m]))})
    return rows


#: the public bounds of an establishment's size for the sector medians
SIZE_BOUNDS = (1.0, 30_000.0)


def sector_medians(jobs: Any, epsilon: float, rng: np.random.Generator) -> pd.DataFrame:
    """Each sector's median establishment size by the smooth-sensitivity median: epsilon-DP under
    replace-one establishment (any size in the public bounds), the sectors disjoint (parallel
    composition), clamped into the bounds (post-processing: a sector of few establishments gets noise
    of the bounds' scale); ``exact`` (PRIVATE) beside it for the comparison. ``establishments``
    (per sector) is public: each establishment's existence and sector are."""
    rows = []
    for code, label in enumerate(SECTOR_LABELS):
        sizes = jobs.size[jobs.sector == code]
        if sizes.size:
            released = float(np.clip(smooth_median(sizes, *SIZE_BOUNDS, epsilon, rng), *SIZE_BOUNDS))
            rows.append({"sector": label, "median_size": released, "establishments": int(sizes.size),
                         "exact": float(np.sort(sizes)[(sizes.size + 1) // 2 - 1])})
    return pd.DataFrame(rows)


def _cells(jobs: Any, by: tuple[str, ...], cap: int) -> pd.DataFrame:
    """One marginal's non-empty cells: key, n, establishments, x_max and the cap-clipped total."""
    cells = jobs.cell_totals(by)
    key = pd.DataFrame({d: getattr(jobs, d) for d in by}).assign(n=np.minimum(jobs.size, cap))
    return cells.assign(n_capped=key.groupby(list(by), sort=True)["n"].sum().to_numpy())


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=lodes (module docstring). Returns the published mechanism's mean absolute error."""
    conf: LodesRunConfig = OmegaConf.to_object(cfg)
    validate_lodes(conf)
    c, p = conf.lodes, conf.privacy
    jobs = simulate_jobs(conf.seed, establishments=c.establishments)
    budget = per_table(p.epsilon, p.delta, c.marginals)
    ran = available("er_ee", er_ee_settings(c), epsilon=budget[0], delta=budget[1])
    secret, rows, published, folder = Randomness.fresh(), [], {}, RunFolder.of(run_dir)
    _place(folder, c.publish, ran)
    for by in marginal_sets(c.marginals):
        cells, label = _cells(jobs, by, c.employer_cap), "__".join(by)
        tables = {n: release(n, cells, conf, budget, secret.numpy(f"lodes-{n}-{label}"), max_size=jobs.config.max_size)
                  for n in ran}
        for name, table in tables.items():
            folder.write_text(f"tables/{label}.csv" if name == c.publish else f"tables/{name}/{label}.csv",
                              table.to_csv(index=False, float_format="%.6g"), private=name != c.publish)
        published[f"tables/{label}.csv"] = len(cells)
        rows += compare(tables, cells, label)
    if c.median:
        medians = sector_medians(jobs, c.median_epsilon, secret.numpy("lodes-median"))
        folder.write_text("tables/median_size_by_sector.csv",
                          medians.drop(columns="exact").to_csv(index=False, float_format="%.6g"))
        folder.write_text("median_exact.csv", medians.to_csv(index=False, float_format="%.6g"),
                          "the sector medians beside their exact values", private=True)
    comparison = pd.DataFrame(rows)
    folder.write_text("comparison.csv", comparison.to_csv(index=False, float_format="%.6g"),
                      "every mechanism against the exact totals, per marginal and size band", private=True)
    report = _report(conf, budget, ran, published)
    folder.finish(guarantee=report["guarantee"], finite_guarantee=True, report=Report(
        "privacy.json", report, "this report", text=lambda body: body["guarantee"] + "\n"))
    log.info("lodes: %d jobs, %d establishments, %d tables (%s); published %s: %s", jobs.n_jobs,
             jobs.n_establishments, len(published), c.marginals, c.publish, report["guarantee"].split(":")[0])
    mine = comparison[comparison.mechanism == c.publish]
    return float((mine.mae * mine.cells).sum() / mine.cells.sum())


def _place(folder: RunFolder, publish: str, ran: tuple[str, ...]) -> None:
    """The tables' folders: the published mechanism's at the top, every other one's under private/."""
    folder.publishable("tables/", f"the published tables ({publish}; covered by the guarantee; "
                       "median_size_by_sector.csv with lodes.median)")
    for name in (n for n in ran if n != publish):
        folder.private(f"tables/{name}/", "another mechanism's tables (publishing them too composes the guarantees; "
                       "laplace_worker's are not ER-EE)")


def _report(conf: LodesRunConfig, budget: tuple[float, float], ran: tuple[str, ...],
            published: dict[str, int]) -> dict[str, Any]:
    c, p = conf.lodes, conf.privacy
    m = len(published)
    settings = er_ee_settings(c)
    whole = guarantees(settings, p.epsilon, p.delta)[c.publish]
    each = guarantees(settings, *budget)[c.publish]
    how = ("one table of disjoint cells (each establishment in one cell: parallel composition)" if m == 1 else
           f"{m} tables (every marginal of place x sector x ownership), each {each['guarantee']}, composed "
           "sequentially (an establishment is in one cell of each table)")
    if c.median:
        how += (f"; and each sector's median establishment size, ({c.median_epsilon:g}, 0)-DP under replace-one "
                f"establishment (sizes in the public [1, 30000]; implies ER-EE at the same epsilon): the run is "
                f"({c.alpha:g}, {p.epsilon + c.median_epsilon:g})-er_ee in all with it")
    return {"task": "lodes", "published": c.publish, "guarantee": f"{whole['guarantee']} in all: {whole['protects']};"
            f" bias: {whole['bias']}; {how}", "tables": published, "per_table": {"epsilon": budget[0],
            "delta": budget[1]}, "mechanisms": guarantees(settings, *budget), "run": list(ran),
            "not_run": [n for n in names("er_ee") if n not in ran], "alpha": c.alpha, "epsilon": p.epsilon,
            "delta": p.delta, "unit_of_privacy": UNIT_OF_PRIVACY, "public": PUBLIC, "noise": NOISE}


#: the worker side of the guarantee: the simulated jobs carry no worker id (one job, one worker)
UNIT_OF_PRIVACY = {
    "worker": "one job: the simulated jobs data have one job per worker and no worker id, so the worker-level "
              "guarantees (laplace_worker, the +1 of ER-EE's worker protection) are per job; a worker holding m jobs "
              "is protected only by group privacy at m (m epsilon for the pure-epsilon mechanisms); task=lodes "
              "reads no worker id and caps no jobs per worker (it runs on the simulator only)",
    "employer": "one establishment: every job of it (ER-EE: its size up to the factor 1 + alpha; employer_laplace: "
                "at most lodes.employer_cap workers)",
}


PUBLIC = ("each establishment's existence, place, sector and ownership (so the list of non-empty cells), the largest "
          "size an establishment can have (30,000: the smooth mechanisms' intervals use it and the release only), the "
          "simulator's seed. NOT public: an establishment's size or size class (no output is computed from either "
          "but through the mechanisms)")
NOISE = ("worker- and employer-level: OpenDP's exact discrete Laplace on the integer counts; log-Laplace: the grid "
         "Laplace on ln(n + 1/alpha); smooth mechanisms: continuous noise (its scale is the private smooth "
         "sensitivity) rounded with the count onto a public grid (step about 2^-20 of the noise scale per unit of "
         "S), a post-processing of the real-valued mechanism")
