"""A release run (task=release): listed cells -> estimates -> the chosen method -> release.csv and
release.json (publishable), and, for simulated data by default, a private evaluation of every
method against exact values in ``<run>/private/evaluation/``.

What a run publishes and why (docs/release.md):

* the cells come from a public declaration or a DP selection (:mod:`dptrain.release.cell_domain`),
  decided before any row is read; rows of unlisted cells are left out one by one;
* the estimates are the public API's (:func:`dptrain.release.api.estimates_for_listed`): OLS is
  computed once and every method, the sensitivities and the evaluation share it;
* ``release.method`` names a method of the registry (:mod:`dptrain.release.methods`); the runner
  runs it at its comparison epsilon (replace-one methods at 2 epsilon) and writes release.csv and
  release.json from the method's own output and facts (:mod:`dptrain.release.report`); MOS (NOT
  differentially private) and suppression (exact values) say so in words;
* every noise draw comes from the run's :class:`~dptrain.privacy.randomness.Randomness`, one
  stream per method ("release-<method>"); no output holds a seed;
* logs and errors name settings, never a private count (rows, rows per cell, released cells).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from dptrain.data import read_table
from dptrain.data.atlas import design_cells, simulate_atlas, simulate_figure2
from dptrain.data.rules import CHECK_HINT, parse_numbers
from dptrain.data.schema import number_format
from dptrain.data.units import unit_codes
from dptrain.privacy.randomness import Randomness, data_digest, settings_digest
from dptrain.privacy.report import LOG_AND_REFUSALS
from dptrain.release import report
from dptrain.release.api import estimates_for_listed, release_custom
from dptrain.release.cell_domain import (
    CellDomain,
    chi_group_labels,
    from_table,
    from_values,
    read_keys_file,
    select_cells,
)
from dptrain.release.cells import Domain, ReleaseError
from dptrain.release.dp_mos import REASON_NO_CHI, REASON_SMALL, REASON_TEST
from dptrain.release.evaluation import write_evaluation
from dptrain.release.methods import (
    RELEASE_METHODS,
    MethodResult,
    ReleaseMethod,
    check_release_method,
    evaluation_methods,
    run_method,
)
from dptrain.release.mos import NOT_DP
from dptrain.release.prepared import ReleaseRun
from dptrain.release.spec import ReleaseSpec
from dptrain.release.total import first_line, planned_total, total_disagreement
from dptrain.release.units import UnitBound, capped, per_row_spec, unit_first_line, unit_release_facts
from dptrain.runfolder.folder import PRIVATE_DIR, Report, RunFolder
from dptrain.runfolder.tracking import finite_epsilon
from dptrain.settings.release import (
    ReleaseConfig,
    ReleaseRunConfig,
    release_spec,
    release_unit,
    resolved_domain,
    validate_release_run,
)

log = logging.getLogger(__name__)

EVALUATION_DIR = "evaluation"
DIAGNOSTICS = "data_diagnostics.json"  # under private/: how many x / y values were clipped (PRIVATE counts)


def run_task(cfg: DictConfig, *, run_dir: Path) -> float:
    """task=release: the composed config -> checks -> randomness -> the release. Bad settings and
    bad data raise a :class:`~dptrain.core.errors.DPTrainError` naming the setting, before anything is
    written. Returns the objective: the released method's RMSE in the private evaluation, or NaN."""
    conf = OmegaConf.to_object(cfg)
    validate_release_run(conf)
    spec = release_spec(conf.release)  # the typed settings the release library reads, built once
    check_release_method(spec)
    randomness = build_randomness(cfg, conf=conf, run_dir=run_dir)
    return run_release(conf, per_row_spec(spec, release_unit(conf)), run_dir, randomness=randomness)


def build_randomness(cfg: DictConfig, *, conf: ReleaseRunConfig, run_dir: Path) -> Randomness:
    """The run's secret randomness: fresh from the OS CSPRNG, or, opted in with
    ``privacy.noise_seed_file=PATH``, derived from that secret file and a digest of this run's
    settings (no output holds the secret)."""
    seed_file = conf.privacy.noise_seed_file
    if seed_file is None:
        return Randomness.fresh()
    label = settings_digest(OmegaConf.to_container(cfg, resolve=True))
    return Randomness.from_seed_file(seed_file, run_label=label, run_dir=run_dir)


def private_evaluation_enabled(conf: ReleaseRunConfig) -> bool:
    """release.private_evaluation: auto (only for simulated data, data=atlas) | true | false."""
    mode = str(conf.release.private_evaluation).strip().lower()
    return mode == "true" or (mode == "auto" and conf.data.name == "atlas")


def load_rows(conf: ReleaseRunConfig) -> tuple[pd.DataFrame, pd.DataFrame | None, str, pd.DataFrame | None]:
    """(rows, per-cell truth or None, one-line description of the source, the simulator's PUBLIC
    cell design or None)."""
    d, unit = conf.data, release_unit(conf).column
    if d.name == "atlas":
        if d.generator == "figure2":
            rows, truth = simulate_figure2(seed=conf.seed)
        else:
            rows, truth = simulate_atlas(seed=conf.seed, n_cells=d.n_cells)
        source = f"simulated Atlas-like cells (generator={d.generator}, seed={conf.seed})"
        return rows, truth, source, design_cells(truth)

    r = conf.release
    thousands, decimal = number_format(d)  # numbers written with separators: x and y read as text, then parsed
    text = None if thousands is None and decimal == "." else [r.x, r.y]
    df = read_table(d.path, fmt=d.format, delimiter=d.delimiter, text_columns=text,
                    required=[("release.x", r.x), ("release.y", r.y), *(("release.cells", c) for c in r.cells),
                              *((("data.privacy_unit", unit),) if unit else ())])
    for col in text or ():
        df[col] = parse_numbers(df[col].astype(object), thousands=thousands, decimal=decimal)[0]
    return df, None, f"table {d.path}", None


def clipped_counts(df: pd.DataFrame, conf: ReleaseRunConfig, domain: Domain) -> dict[str, dict[str, int]]:
    """How many x / y values lie outside release.domain (clipped into it, or refused with
    release.clip=false). PRIVATE counts: written to private/data_diagnostics.json only; the log
    names the columns, never a count."""
    r = conf.release
    out = {}
    for setting, col, lo, hi in (("release.x", r.x, domain.x_lo, domain.x_hi),
                                 ("release.y", r.y, domain.y_lo, domain.y_hi)):
        if col not in df.columns:
            continue  # estimates_for_listed refuses it by name
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=float("nan"))
        out[col] = {"setting": setting, "below_lower": int((v < lo).sum()), "above_upper": int((v > hi).sum())}
    hit = [f"{c} ({n['setting']})" for c, n in out.items() if n["below_lower"] or n["above_upper"]]
    if hit and r.clip:
        log.warning("values outside release.domain were clipped into it in column(s) %s (how many: "
                    "private/%s, PRIVATE); a domain that misses the data releases little or nothing",
                    ", ".join(hit), DIAGNOSTICS)
    return out


def declared_cells(conf: ReleaseRunConfig) -> CellDomain | None:
    """The user's declaration (read before any row), or None (simulator design / private selection)."""
    r = conf.release
    cells = list(r.cells)
    if r.cell_values is not None:
        return from_values(dict(r.cell_values), cells)
    if r.cell_keys_file is not None:
        return from_table(read_keys_file(r.cell_keys_file, cells), cells, origin="declared",
                          description=f"declared: release.cell_keys_file={r.cell_keys_file!r}",
                          setting=f"release.cell_keys_file={r.cell_keys_file!r}")
    return None


def list_cells(conf: ReleaseRunConfig, df: pd.DataFrame, design: pd.DataFrame | None,
               declared: CellDomain | None, randomness: Randomness) -> CellDomain:
    r = conf.release
    cells = list(r.cells)
    if declared is not None:
        return declared
    if r.cell_selection == "private":
        return select_cells(df, cells, epsilon=r.selection_epsilon, delta=r.selection_delta,
                            rng=randomness.numpy("release-cell-selection"))
    if design is not None:
        missing = [c for c in cells if c not in design.columns]
        if missing:
            raise ReleaseError(f"release.cells={cells!r}: the simulator declares cells by {list(design.columns)}; "
                               "allowed: those columns, or declare the cells with release.cell_values")
        return from_table(design, cells, origin="simulator", setting="release.cells", collapse=True,
                          description="declared by the simulator's public design (every simulated cell)")
    raise ReleaseError("release.cell_values / release.cell_keys_file: no cells declared; allowed: declare them, "
                       "or release.cell_selection=private")


def prepare(conf: ReleaseRunConfig, spec: ReleaseSpec, run_dir: Path, randomness: Randomness) -> ReleaseRun:
    """The declaration (before any row is read), the rows, the listed cells and their estimates."""
    r = conf.release
    declared = declared_cells(conf)
    df, truth, source, design = load_rows(conf)
    randomness = randomness.for_data(data_digest(df))  # a reused noise key on other rows: independent noise
    bound = release_unit(conf)
    df, dropped = cap_units(df, bound, randomness)
    listed = list_cells(conf, df, design, declared, randomness)
    if listed.n_cells == 0:
        raise ReleaseError("release.cell_selection=private listed no cell (a DP outcome); allowed: a larger "
                           "release.selection_epsilon or release.selection_delta, or declare the cells")
    domain = Domain(*resolved_domain(r, conf.data.name))
    clipped = clipped_counts(df, conf, domain)
    est = estimates_for_listed(df, listed, x=r.x, y=r.y, domain=domain,
                               clip=r.clip, drop_nonfinite=conf.data.name == "atlas" or conf.data.nonfinite == "drop")
    chi_group_labels(listed, list(r.chi_by))  # release.chi_by must name public columns of the cell list
    if conf.data.name != "atlas":  # a user's table: the rules' counts for the data holder (PRIVATE)
        log_counts(est.rows, clipped if r.clip else {}, unit=None if bound.per_row else bound.column)
    diagnostics = {"clipped": clipped, "rows": est.rows, **({} if bound.per_row else {"units": {
        "column": bound.column, "max_rows_per_unit": bound.k, "rows_dropped_by_the_cap": dropped}})}
    return ReleaseRun(spec=spec, run_dir=run_dir, randomness=randomness, truth=truth, source=source,
                      est=est, simulated=conf.data.name == "atlas", diagnostics=diagnostics, unit=bound,
                      budget=(float(conf.release.epsilon_per_statistic), float(conf.release.delta)))


def cap_units(df: pd.DataFrame, bound: UnitBound, randomness: Randomness) -> tuple[pd.DataFrame, int]:
    """With data.privacy_unit: each unit's rows capped at privacy.max_rows_per_unit (a uniform
    choice from the run's secret randomness) before anything else is computed; (rows, dropped: a
    PRIVATE count, for private/data_diagnostics.json only). A row without a unit id belongs to no
    unit: it is left out and counted with the rows the cap drops (whether the run goes ahead never
    depends on one row)."""
    if bound.per_row:
        return df, 0
    codes = unit_codes(df[bound.column], missing="drop", column=f"data.privacy_unit={bound.column!r}")
    has_unit = np.flatnonzero(codes >= 0)
    keep, dropped = capped(codes[has_unit], bound, randomness.numpy("release-unit-cap"))
    return df.iloc[has_unit[keep]].reset_index(drop=True), dropped + int(codes.size - has_unit.size)


def log_counts(rows: dict, clipped: dict, *, unit: str | None = None) -> None:
    """ONE console line of the rows the release left out, per rule, and the values clipped
    (PRIVATE counts for the data holder: the console and private/dptrain.log, never a publishable
    file), and the pointer to ``dptrain check`` when any row was left out. With a unit of privacy
    the rows read and used are not shown: they would tell how many rows the cap per unit dropped
    (private/data_diagnostics.json has them)."""
    parts = ([f"{rows['read']} rows read, {rows['kept']} used, {rows['left_out']} left out"] if unit is None else
             [f"{rows['left_out']} rows left out (rows read and used, after the cap per {unit}: "
              f"private/{DIAGNOSTICS})"])
    parts += [f"{what}: {n} {rule}" for what, rules in rows["left_out_by"].items() for rule, n in rules.items() if n]
    hit = [f"{c} {v['below_lower'] + v['above_upper']}" for c, v in clipped.items() if v["below_lower"] or
           v["above_upper"]]
    if hit:
        parts.append("clipped into release.domain: " + ", ".join(hit))
    (log.warning if rows["left_out"] or hit else log.info)(
        "release data (PRIVATE counts, for the data holder; in private/%s): %s", DIAGNOSTICS, "; ".join(parts))
    if rows["left_out"]:
        log.warning("%s", CHECK_HINT)


def methods_to_run(r: ReleaseSpec, evaluate: bool) -> list[str]:
    """The chosen method, then (for the private evaluation) every other evaluated method."""
    return [r.method] + ([n for n in evaluation_methods(r) if n != r.method] if evaluate else [])


def run_release(conf: ReleaseRunConfig, spec: ReleaseSpec, run_dir: Path, *, randomness: Randomness) -> float:
    """Run one release. Returns the released method's RMSE against the reference (truth, else
    OLS) when the private evaluation ran, else NaN (nothing exact leaves the evaluation)."""
    selection = planned_selection(conf.release)
    planned = planned_total(spec, selection)
    line = first_line(spec, planned, selection, conf.release.stat_fn)
    log.info("%s", unit_first_line(line, planned, release_unit(conf)))  # before any row is read
    run = prepare(conf, spec, Path(run_dir), randomness)
    log.info("release cells: %s", run.est.listed.description)
    r = run.spec
    if r.statistic == "custom":
        return run_custom(run, conf.release.stat_fn)
    method = RELEASE_METHODS.get(r.method)
    warning = method.warning(r.method, r)
    if warning:
        log.warning("%s", warning)
    evaluate = private_evaluation_enabled(conf)
    names = methods_to_run(r, evaluate)
    results = {}
    # the private evaluation runs every method (dp_sgd's per-cell DP-SGD alone takes ~35 s on 2,000 cells):
    # one progress line naming the method that runs (public: the registry's list, not the data's)
    with tqdm(total=len(names), desc="release + private evaluation", unit="method", disable=len(names) == 1,
              bar_format="{desc}: {n_fmt}/{total_fmt} methods{postfix}") as bar:
        for name in names:
            bar.set_postfix_str(name)
            results[name] = run_method(name, run.est, epsilon=r.epsilon_per_statistic,
                                       rng=run.randomness.numpy(f"release-{name}"), config=r)
            bar.update()
    say_if_nothing_released(results[r.method], r.method)
    folder = RunFolder.of(run.run_dir)
    facts = write_release(folder, run, method, results[r.method])
    write_diagnostics(folder, run)
    rmse = float("nan")
    if evaluate:
        eval_dir = folder.path / PRIVATE_DIR / EVALUATION_DIR
        files, rmse = write_evaluation(eval_dir, run, results)
        folder.record({f"{PRIVATE_DIR}/{EVALUATION_DIR}/{p.name}": why for p, why in files.items()})
        log.warning("private evaluation (exact values, every method) written to %s: never publish it", eval_dir)
    disagreement = total_disagreement(planned, facts.get("total") or {}, r.method)
    if disagreement:
        log.warning("%s", disagreement)
    covered = method.has_guarantee and finite_epsilon((facts.get("total") or {}).get("epsilon"))
    folder.finish(guarantee=report.guarantee_line(facts), finite_guarantee=covered, report=Report(
        "release.json", facts, "the facts of that release: method, neighbours, epsilon, delta, guarantee"))
    log.info("release written: release.csv, release.json (%s%s)", total_epsilon_text(facts), facts["guarantee"])
    return rmse


def planned_selection(r: ReleaseConfig) -> dict | None:
    """The private cell selection's (epsilon, delta) as its settings give them; None for declared
    cells (they cost nothing)."""
    if r.cell_selection != "private":
        return None
    return {"epsilon": float(r.selection_epsilon), "delta": float(r.selection_delta)}


def total_epsilon_text(facts: dict) -> str:
    """``epsilon T in all (theta 1 + se 1 + n 1); `` from release.json's epsilon (a per-statistic
    dict with its total), or '' when the release states one number."""
    eps = facts.get("epsilon")
    if not isinstance(eps, dict) or "total" not in eps:
        return ""
    parts = " + ".join(f"{k} {v:g}" for k, v in eps.items() if not k.startswith("total"))
    return f"epsilon {eps['total']:g} in all ({parts}); "


def say_if_nothing_released(result: MethodResult, name: str) -> None:
    """A release in which no cell could be released still finishes (release.csv lists every cell
    as not released, with its reason); the log says so, with no count."""
    frame = result.frame
    if "released" in frame.columns and not frame["released"].astype(bool).any():
        reasons = sorted({str(r) for r in frame.get("reason", pd.Series(dtype=object)).dropna() if str(r)})
        helps = [HELPS[r] for r in reasons if r in HELPS] or [
            "release.domain (rows outside it are clipped onto its edge), release.min_n and release.cells"]
        log.warning("release.method=%s released no cell: every listed cell is marked not released in release.csv "
                    "(reasons: %s). What would help: %s", name, "; ".join(reasons) or "none given",
                    "; ".join(dict.fromkeys(helps)))


#: per reason a cell was not released (release.csv's reason column), the settings that would help
HELPS = {
    REASON_SMALL: "cells with more rows, or a lower release.min_n (the eligibility threshold is also at least "
                  "k* + 4, which a larger release.epsilon_per_statistic or release.dp_mos_split.test lowers)",
    REASON_TEST: "a larger release.epsilon_per_statistic or release.dp_mos_split.test, or "
                 "release.dp_mos_chi_quantile closer to 1 (a larger chi: more cells pass, each with more noise)",
    REASON_NO_CHI: "cells with more rows, or a lower release.min_n (no cell of the group was eligible)",
}


def write_diagnostics(folder: RunFolder, run: ReleaseRun) -> None:
    """private/data_diagnostics.json (PRIVATE counts), when there are any."""
    if run.diagnostics:
        folder.write_json(DIAGNOSTICS, run.diagnostics, "counts about the private rows (rows read and left out per "
                          "rule, x / y values outside release.domain)", private=True)


def write_release(folder: RunFolder, run: ReleaseRun, method: ReleaseMethod, result: MethodResult) -> dict:
    """release.csv of the chosen method (its own output); returns release.json's facts (written
    by the folder with FILES.txt: :meth:`~dptrain.runfolder.folder.RunFolder.finish`)."""
    name = run.spec.method
    facts = unit_release_facts(method.release_json(name, result, facts=run.facts()), run.unit,
                               epsilon=run.budget[0], delta=run.budget[1])
    if not run.simulated:  # a user's table: what its log, console and refusals do not cover
        facts["not_covered"] = [*facts.get("not_covered", []), LOG_AND_REFUSALS]
    folder.write_text("release.csv", method.published(run.est, result).to_csv(index=False),
                      f"the released cells of method {name} (one row per listed cell)")
    return facts


def load_stat_fn(spec: str) -> Callable:
    """Import ``package.module:function`` (the user's module: the one import by name here)."""
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ReleaseError(f"release.stat_fn={spec!r} cannot be imported ({err}); allowed: "
                           "'package.module:function' importable from the working directory") from None


def run_custom(run: ReleaseRun, stat_fn: str) -> float:
    """MOS for a user statistic (``stat_fn``, package.module:function) by brute-force refits (no
    closed form, so no baselines)."""
    r = run.spec
    if r.chi_by:
        raise ReleaseError("release.chi_by is not supported with release.statistic=custom; allowed: []")
    if r.method != "mos":
        raise ReleaseError(f"release.method={r.method!r} is not allowed with release.statistic=custom: mos")
    log.warning("release.statistic=custom (MOS): %s", NOT_DP)
    rel = release_custom(run.est.cells, load_stat_fn(stat_fn), epsilon=r.epsilon_per_statistic, neighbors=r.neighbors,
                         rng=run.randomness.numpy("release-mos-custom"))
    folder = RunFolder.of(run.run_dir)
    folder.write_text("release.csv", rel.to_frame().to_csv(index=False), "the released cells (MOS, custom statistic)")
    write_diagnostics(folder, run)
    folder.finish(guarantee=NOT_DP, finite_guarantee=False, report=Report(
        "release.json", report.custom_json(rel, stat_fn=stat_fn, facts=run.facts()), "its facts"))
    log.info("release written: release.csv, release.json (MOS, custom statistic %s)", stat_fn)
    return float("nan")
