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

from dptrain.core.neighbours import Neighbours
from dptrain.data.jobs import simulate_jobs
from dptrain.privacy.randomness import Randomness
from dptrain.release.employer import mechanisms as mech
from dptrain.runfolder.tracking import atomic_write_text, private_dir, write_json, write_manifest
from dptrain.settings.lodes import MECHANISMS, LodesRunConfig, validate_lodes

log = logging.getLogger("dptrain.lodes")

#: size bands of the comparison (a cell's true total jobs)
BANDS = (1, 10, 100, 1000, math.inf)


def guarantees(alpha: float, epsilon: float, delta: float, cap: int) -> dict[str, dict[str, str]]:
    """Per mechanism: its guarantee (the relation, as a :class:`Neighbours` value's name), what it
    protects and what it does not, its bias."""
    er_ee = Neighbours.ER_EE.value
    size = f"an establishment's size up to a factor 1 + alpha = {1 + alpha:g} (and one worker's job)"
    return {
        "log_laplace": {"guarantee": f"({alpha:g}, {epsilon:g})-{er_ee}", "protects": size,
                        "bias": "multiplicative, upward: E = (n + 1/alpha) / (1 - b^2) - 1/alpha, b = ln(1 + alpha) / "
                                "epsilon"},
        "smooth_gamma": {"guarantee": f"({alpha:g}, {epsilon:g})-{er_ee} (pure)", "protects": size,
                         "bias": "none (the noise has mean 0); its scale depends on the cell's largest establishment"},
        "smooth_laplace": {"guarantee": f"({alpha:g}, {epsilon:g}, {delta:g})-{er_ee}", "protects": size,
                           "bias": "none (Laplace noise scaled to the smooth sensitivity)"},
        "laplace_worker": {"guarantee": f"({epsilon:g}, 0)-DP, {Neighbours.ADD_REMOVE.value} one job",
                           "protects": "one worker's job; NOT an establishment's size (an adversary who knows the "
                                       "other establishments of a cell reads it within a few workers)",
                           "bias": "none"},
        "employer_laplace": {"guarantee": f"({epsilon:g}, 0)-DP, add/remove one establishment of at most {cap} "
                                          "workers (larger ones clipped to the cap)",
                             "protects": "a whole establishment (up to the cap)",
                             "bias": "downward where an establishment is above the cap (clipped); noise scale cap / "
                                     "epsilon"},
    }


def release(name: str, cells: pd.DataFrame, conf: LodesRunConfig, rng: np.random.Generator) -> pd.DataFrame:
    """One mechanism's table: the released count per cell and, where the law allows, a 95% interval."""
    c, p = conf.lodes, conf.privacy
    n, x_max = cells["n"].to_numpy(float), cells["x_max"].to_numpy(float)
    out = cells[["place", "sector", "ownership"]].copy()
    lo = hi = None
    if name == "log_laplace":
        out["released"] = mech.log_laplace(n, c.alpha, p.epsilon, rng)
        lo, hi = mech.log_laplace_interval(out["released"].to_numpy(), c.alpha, p.epsilon)
    elif name == "smooth_gamma":
        out["released"] = mech.smooth_gamma(n, x_max, c.alpha, p.epsilon, rng)
    elif name == "smooth_laplace":
        out["released"] = mech.smooth_laplace(n, x_max, c.alpha, p.epsilon, p.delta, rng)
    elif name == "laplace_worker":
        out["released"] = mech.laplace_worker(n, p.epsilon, rng)
        lo, hi = mech.laplace_worker_interval(out["released"].to_numpy(), p.epsilon)
    else:
        clipped = cells["n_capped"].to_numpy(float)
        out["released"] = mech.employer_laplace(clipped, c.employer_cap, p.epsilon, rng)
        lo, hi = mech.employer_laplace_interval(out["released"].to_numpy(), c.employer_cap, p.epsilon)
    if lo is not None:
        out["ci_low"], out["ci_high"] = lo, hi
    return out


def compare(tables: dict[str, pd.DataFrame], cells: pd.DataFrame) -> pd.DataFrame:
    """Per mechanism and size band: cells, mean absolute error, mean signed error (bias), median
    relative error, against the exact totals (PRIVATE)."""
    band = pd.cut(cells["n"], BANDS, right=False, labels=["1-9", "10-99", "100-999", "1000+"])
    rows = []
    for name, t in tables.items():
        err = t["released"].to_numpy() - cells["n"].to_numpy()
        for b in band.cat.categories:
            m = (band == b).to_numpy()
            if m.any():
                rows.append({"mechanism": name, "band": b, "cells": int(m.sum()), "mae": float(np.abs(err[m]).mean()),
                             "bias": float(err[m].mean()),
                             "median_rel_error": float(np.median(np.abs(err[m]) / cells["n"].to_numpy()[m]))})
    return pd.DataFrame(rows)


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=lodes (module docstring). Returns the published mechanism's mean absolute error."""
    conf: LodesRunConfig = OmegaConf.to_object(cfg)
    validate_lodes(conf)
    c, p = conf.lodes, conf.privacy
    jobs = simulate_jobs(conf.seed, establishments=c.establishments)
    cells = jobs.cell_totals(("place", "sector", "ownership"))
    capped = np.minimum(jobs.size, c.employer_cap)
    key = pd.DataFrame({"place": jobs.place, "sector": jobs.sector, "ownership": jobs.ownership, "n": capped})
    per = key.groupby(["place", "sector", "ownership"], sort=True)["n"].sum().to_numpy()
    cells = cells.assign(n_capped=per)
    secret = Randomness.fresh()
    tables = {name: release(name, cells, conf, secret.numpy(f"lodes-{name}")) for name in MECHANISMS}
    for name, table in tables.items():
        where = run_dir / "tables" if name == c.publish else private_dir(run_dir) / "tables"
        where.mkdir(parents=True, exist_ok=True)
        atomic_write_text(where / f"{name}.csv", table.to_csv(index=False, float_format="%.6g"))
    comparison = compare(tables, cells)
    atomic_write_text(private_dir(run_dir) / "comparison.csv", comparison.to_csv(index=False, float_format="%.6g"))
    g = guarantees(c.alpha, p.epsilon, p.delta, c.employer_cap)
    chosen = g[c.publish]
    report = {"task": "lodes", "published": c.publish, "guarantee": f"{chosen['guarantee']}: {chosen['protects']}; "
              f"bias: {chosen['bias']}; one table of disjoint cells (each establishment in one cell: parallel "
              "composition)", "mechanisms": g, "alpha": c.alpha, "epsilon": p.epsilon, "delta": p.delta,
              "public": "each establishment's existence, place, sector and ownership (so the list of non-empty "
                        "cells), the simulator's seed", "cells": int(len(cells)),
              "noise": "numpy's floating-point Laplace and the exact rejection sampler of the quartic noise "
                       "(not OpenDP's integer samplers)"}
    write_json(run_dir / "privacy.json", report)
    atomic_write_text(run_dir / "privacy.txt", report["guarantee"] + "\n")
    private = {f"private/tables/{n}.csv": "another mechanism's table (publishing it too composes the guarantees; "
               "laplace_worker's is not ER-EE)" for n in MECHANISMS if n != c.publish}
    private.update({"private/comparison.csv": "every mechanism against the exact totals, per size band",
                    "private/dptrain.log": "the log"})
    write_manifest(run_dir, publishable={"privacy.json, privacy.txt": "this report",
                                         f"tables/{c.publish}.csv": "the published table (covered by the guarantee)",
                                         "FILES.txt": "this list", ".hydra/": "the configuration"},
                   private=private, guarantee=report["guarantee"], report="privacy.json")
    log.info("lodes: %d jobs, %d establishments, %d cells (place x sector x ownership); published %s: %s",
             jobs.n_jobs, jobs.n_establishments, len(cells), c.publish, chosen["guarantee"])
    mine = comparison[comparison.mechanism == c.publish]
    return float((mine.mae * mine.cells).sum() / mine.cells.sum())
