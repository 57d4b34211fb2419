"""task=tabulate: DP counts of every cell of the requested marginals of a table, over its
declared domain (:mod:`dptrain.release.tables`), post-processed into consistent nonnegative
integer tables; one report (privacy.json, privacy.txt) and FILES.txt. Settings checked, THEN the
rows read."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from dptrain.core.errors import DPTrainError
from dptrain.data import load_dataset, write_data_diagnostics
from dptrain.data import schema_from_config as data_schema
from dptrain.privacy.randomness import Randomness
from dptrain.privacy.report import LOG_AND_REFUSALS
from dptrain.release.oneshot import ONE_SHOT
from dptrain.release.tables.domain import domain_columns, row_codes
from dptrain.release.tables.marginals import Column, Marginal, consistent_tables, workload
from dptrain.release.units import UnitBound, capped, dataset_units, table_sensitivity, write_unit_facts
from dptrain.runfolder.folder import Report, RunFolder
from dptrain.settings.tabulate import MAX_CELLS, TabulateRunConfig, table_settings, unit_bound, validate_tabulate

log = logging.getLogger("dptrain.tabulate")

NEIGHBOURS = "add/remove one row (one person's record): each marginal's counts move by one in one cell"
NOT_COVERED = [
    "the declared domain (columns, category lists, numeric bounds and bins): assumed public, declared in the "
    "config, not fitted on the rows",
    LOG_AND_REFUSALS,
    "private/evaluation.json (data=adult or synthetic only): the released tables' error against the exact counts",
]


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=tabulate (module docstring). Returns the released tables' mean absolute error per
    cell against the exact counts for public or simulated data (the private evaluation), else NaN."""
    conf: TabulateRunConfig = OmegaConf.to_object(cfg)
    validate_tabulate(conf)
    schema = data_schema(conf.data)
    columns = domain_columns(schema, bins=conf.tabulate.bins)
    chosen = _chosen_columns(conf, columns)
    sets = _workload(conf, chosen, columns)
    sizes = [c.size for c in columns]
    cells = [int(np.prod([sizes[c] for c in s])) for s in sets]
    if conf.tabulate.sparse:
        return _run_sparse(conf, run_dir, schema, columns, sets)
    if sum(cells) > MAX_CELLS:
        raise DPTrainError(f"tabulate.marginals={conf.tabulate.marginals!r}: {sum(cells)} cells in all, above "
                           f"{MAX_CELLS}; allowed: fewer or smaller marginals, fewer tabulate.bins or tabulate.columns")
    plan = _plan(conf, cells)  # every public number of the release, before any row is read
    bound, folder = plan["bound"], RunFolder.of(run_dir)
    data = load_dataset(conf.data, seed=conf.seed)
    codes = _capped_codes(data, schema, conf.tabulate.bins, bound, folder)
    exact = [_count(codes, s, sizes) for s in sets]
    mechanism, budget, sens = plan["mechanism"], plan["budget"], _sensitivity(bound)
    noisy = [mechanism.measure(t, w, budget, **sens) for t, w in zip(exact, plan["shares"])]
    marginals = [Marginal(s, t, mechanism.variance(w, budget, **sens)) for s, t, w in zip(sets, noisy, plan["shares"])]
    released = consistent_tables(marginals, sizes) if conf.tabulate.consistent else noisy
    folder.publishable("tables/", "the released marginals (covered by the guarantee)")
    files = _write_tables(folder, sets, released, columns)
    error = _evaluate(conf, folder, sets, released, exact)
    report = _report(conf, plan, sets, cells, columns, files)
    folder.record(write_data_diagnostics(run_dir, data))
    folder.finish(guarantee=report["guarantee"], finite_guarantee=True, report=Report(
        "privacy.json", report, "this report (the guarantee, the budget split; no count)", text=_text))
    log.info("privacy: %s", report["guarantee"])
    log.info("tables: %d marginals, %d cells, total %d (a noisy count) -> %s/tables/", len(sets), sum(cells),
             int(released[0].sum()), run_dir)
    return float("nan") if error is None else error


def _run_sparse(conf: TabulateRunConfig, run_dir: Path, schema: Any, columns: list[Column],
                sets: list[tuple[int, ...]]) -> float:
    """tabulate.sparse: per marginal the stability-based histogram at its share of epsilon and
    delta / (number of marginals); the listed cells' noisy counts (module docstring of
    :mod:`dptrain.release.tables.marginals`)."""
    p, sizes = conf.privacy, [c.size for c in columns]
    mechanism = ONE_SHOT.get("stability_histogram")
    shares = np.full(len(sets), 1.0 / len(sets))
    data = load_dataset(conf.data, seed=conf.seed)
    codes = row_codes(np.concatenate([data.x_train.numpy(), data.x_test.numpy()]),
                      np.concatenate([data.y_train.numpy(), data.y_test.numpy()]), schema, bins=conf.tabulate.bins)
    folder, files = RunFolder.of(run_dir), []
    folder.publishable("tables/", "the listed cells and their noisy counts (covered by the guarantee)")
    for cols, share in zip(sets, shares):
        shape = [sizes[c] for c in cols]
        ids, noisy = mechanism.release(np.ravel_multi_index(codes[:, list(cols)].T, shape),
                                       epsilon=share * p.epsilon, delta=p.delta / len(sets))
        levels = np.unravel_index(ids, shape)
        frame = pd.DataFrame({columns[c].name: np.asarray(columns[c].levels, dtype=object)[lv]
                              for c, lv in zip(cols, levels)})
        frame["count"] = noisy
        files.append(f"tables/{table_name(cols, columns)}.csv")
        folder.write_text(files[-1], frame.to_csv(index=False))
    guarantee = (f"({p.epsilon:g}, {p.delta:g})-DP: the stability-based histogram on each of {len(sets)} marginals "
                 f"(discrete Laplace at epsilon {p.epsilon / len(sets):.4g} each, a one-row cell listed with "
                 f"probability <= {p.delta / len(sets):.3g}); neighbours: {NEIGHBOURS}; for every file under tables/")
    spent = mechanism.guarantee(mechanism.event((p.epsilon, p.delta)), delta=p.delta)
    report = {"task": "tabulate", "private": True, "guarantee": guarantee, "epsilon": float(spent.epsilon),
              "delta": float(spent.delta), "accountant": spent.accounting, "mechanism": "stability-based histogram",
              "sampler": "OpenDP's exact discrete Laplace (OS CSPRNG)", "neighbours": NEIGHBOURS,
              "marginals": [{"table": table_name(s, columns), "share": float(w), "epsilon": float(w * p.epsilon),
                             "delta": p.delta / len(sets)} for s, w in zip(sets, shares)],
              "post_processing": "none: only the listed cells, their noisy counts", "files": files,
              "not_covered": NOT_COVERED}
    folder.record(write_data_diagnostics(run_dir, data))
    folder.finish(guarantee=guarantee, finite_guarantee=True, report=Report(
        "privacy.json", report, "this report", text=lambda body: json.dumps(body, indent=2) + "\n"))
    log.info("privacy: %s", guarantee)
    return float("nan")


def _chosen_columns(conf: TabulateRunConfig, columns: list[Column]) -> list[int]:
    names = [c.name for c in columns]
    if conf.tabulate.columns is None:
        return list(range(len(columns)))
    unknown = [c for c in conf.tabulate.columns if c not in names]
    if unknown:
        raise DPTrainError(f"tabulate.columns: {unknown[0]!r} is not a declared column; allowed: {', '.join(names)}")
    return [names.index(c) for c in conf.tabulate.columns]


def _workload(conf: TabulateRunConfig, chosen: list[int], columns: list[Column]) -> list[tuple[int, ...]]:
    spec = conf.tabulate.marginals
    if isinstance(spec, int):
        return [tuple(chosen[i] for i in s) for s in workload(len(chosen), spec)]
    names = [c.name for c in columns]
    for s in spec:
        for c in s:
            if c not in names:
                raise DPTrainError(f"tabulate.marginals: {c!r} is not a declared column; allowed: {', '.join(names)}")
    return workload(len(columns), [[names.index(c) for c in s] for s in spec])


def _plan(conf: TabulateRunConfig, cells: list[int]) -> dict[str, Any]:
    """The registered table mechanism (privacy.mechanism), the budget in its unit (epsilon for
    laplace, rho for gaussian) and each marginal's share."""
    p = conf.privacy
    mechanism = ONE_SHOT.get(p.mechanism)
    shares = mechanism.shares(cells, table_settings(conf.tabulate))
    return {"mechanism": mechanism, "shares": shares, "budget": mechanism.budget(epsilon=p.epsilon, delta=p.delta),
            "bound": unit_bound(conf)}


def _sensitivity(bound: UnitBound) -> dict[str, float]:
    """The table mechanisms' ``sensitivity`` keyword: k with a unit of privacy, none per row (so a
    plugin mechanism written for one row runs unchanged without a unit)."""
    return {} if bound.per_row else {"sensitivity": float(bound.k)}


def _capped_codes(data: Any, schema: Any, bins: int, bound: UnitBound, folder: RunFolder) -> np.ndarray:
    """Every row's cell codes (training and test rows), each unit's rows capped at k first (a
    secret uniform choice; the dropped count to private/units.json only)."""
    codes = row_codes(np.concatenate([data.x_train.numpy(), data.x_test.numpy()]),
                      np.concatenate([data.y_train.numpy(), data.y_test.numpy()]), schema, bins=bins)
    if bound.per_row:
        return codes
    keep, dropped = capped(dataset_units(data), bound, Randomness.fresh().numpy("tabulate-unit-cap"))
    write_unit_facts(folder, bound, dropped)
    return codes[keep]


def _count(codes: np.ndarray, cols: tuple[int, ...], sizes: list[int]) -> np.ndarray:
    shape = [sizes[c] for c in cols]
    idx = np.ravel_multi_index(codes[:, list(cols)].T, shape)
    return np.bincount(idx, minlength=int(np.prod(shape))).reshape(shape).astype(np.int64)


def table_name(cols: tuple[int, ...], columns: list[Column]) -> str:
    return "__".join(columns[c].name for c in cols)


def _write_tables(folder: RunFolder, sets: list[tuple[int, ...]], tables: list[np.ndarray],
                  columns: list[Column]) -> list[str]:
    """tables/<a>__<b>.csv (placed): one row per cell (the columns' level labels, then ``count``)."""
    out = []
    for cols, table in zip(sets, tables):
        index = pd.MultiIndex.from_product([columns[c].levels for c in cols], names=[columns[c].name for c in cols])
        frame = pd.DataFrame({"count": np.asarray(table).reshape(-1)}, index=index).reset_index()
        out.append(f"tables/{table_name(cols, columns)}.csv")
        folder.write_text(out[-1], frame.to_csv(index=False))
    return out


def _evaluate(conf: TabulateRunConfig, folder: RunFolder, sets: list[tuple[int, ...]], released: list[np.ndarray],
              exact: list[np.ndarray]) -> float | None:
    """private/evaluation.json for public or simulated data only (data=adult, synthetic): per
    marginal the mean absolute error per cell and the L1 error over the total."""
    if conf.data.name not in ("adult", "synthetic"):
        return None
    rows = [{"marginal": list(s), "mean_abs_error_per_cell": float(np.mean(np.abs(r - e))),
             "l1_over_n": float(np.abs(r - e).sum() / max(e.sum(), 1))} for s, r, e in zip(sets, released, exact)]
    folder.write_json("evaluation.json", {"marginals": rows, "note": "exact counts compared: private (never publish)"},
                      "the released tables' error against the exact counts", private=True)
    return float(np.mean([r["mean_abs_error_per_cell"] for r in rows]))


def _report(conf: TabulateRunConfig, plan: dict, sets: list[tuple[int, ...]], cells: list[int],
            columns: list[Column], files: list[str]) -> dict[str, Any]:
    p, shares, budget, mechanism = conf.privacy, plan["shares"], plan["budget"], plan["mechanism"]
    bound = plan["bound"]
    sens = table_sensitivity(bound)
    split = [{"table": table_name(s, columns), "cells": c, "share": float(w),
              **mechanism.spent(w, budget, **_sensitivity(bound)), **sens}
             for s, c, w in zip(sets, cells, shares)]
    spent = mechanism.guarantee(mechanism.event(split), delta=p.delta)
    neighbours = bound.neighbours(NEIGHBOURS)
    return {"task": "tabulate", "private": True, "guarantee": f"{spent.statement}; neighbours: {neighbours}; for "
            "every file under tables/", "epsilon": spent.epsilon, "delta": spent.delta,
            "accountant": spent.accounting, "mechanism": p.mechanism,
            "sampler": "OpenDP's exact discrete samplers (OS CSPRNG; no noise key can reproduce them)",
            "neighbours": neighbours, "unit_of_privacy": bound.describe(**sens), "split": conf.tabulate.split,
            "marginals": split,
            "domain": {c.name: list(c.levels) for c in columns},
            "post_processing": ("consistent nonnegative integers (total and 1-way margins agree exactly)"
                                if conf.tabulate.consistent else "none: the raw noisy counts (may be negative)"),
            "files": files, "not_covered": NOT_COVERED}


def _text(report: dict[str, Any]) -> str:
    unit = report["unit_of_privacy"]
    lines = ["task=tabulate: DP marginals", "", f"guarantee: {report['guarantee']}", "",
             f"unit of privacy: {unit['unit']} (at most {unit['max_rows_per_unit']} rows counted; L1 sensitivity "
             f"{unit['l1_sensitivity']:g}, L2 sensitivity {unit['l2_sensitivity']:g} per marginal)",
             f"mechanism: {report['mechanism']} ({report['sampler']})", f"budget split: {report['split']}"]
    lines += [f"  {m['table']:40s} {m['cells']:>8d} cells  share {m['share']:.4f}" for m in report["marginals"]]
    lines += ["", f"post-processing: {report['post_processing']}", "", "not covered:",
              *[f"  - {x}" for x in report["not_covered"]]]
    return "\n".join(lines) + "\n"
