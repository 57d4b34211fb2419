"""A release run (task=release): cells -> estimates -> local sensitivity -> MOS and baselines ->
release.csv, release.json, comparison.csv/.md and figures in the run folder.

MOS is NOT differentially private (chi is computed from the private data); every file that
carries a MOS output says so.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dptrain.config import Config
from dptrain.release import baselines as bl
from dptrain.release.cells import (
    Cells,
    Domain,
    ReleaseError,
    group_cells,
    ols,
    standard_error,
    statistic,
)
from dptrain.release.evaluate import compare_methods, evaluate_release, to_markdown
from dptrain.release.mos import NOT_DP, release_mos
from dptrain.release.noise import make_rng
from dptrain.release.sensitivity import local_sensitivity, se_local_sensitivity
from dptrain.tracking import atomic_write_text, write_json

log = logging.getLogger(__name__)


def load_rows(conf: Config) -> tuple[pd.DataFrame, pd.DataFrame | None, str]:
    """(rows, per-cell truth or None, one-line description of the source)."""
    d = conf.data
    if d.name == "atlas":
        from dptrain.data.atlas import simulate_atlas, simulate_figure2

        if d.generator == "figure2":
            rows, truth = simulate_figure2(seed=conf.seed)
        else:
            rows, truth = simulate_atlas(seed=conf.seed, n_cells=d.n_cells)
        return rows, truth, f"simulated Atlas-like cells (generator={d.generator}, seed={conf.seed})"
    from dptrain.data import read_table

    return read_table(d.path, fmt=d.format), None, f"table {d.path}"


def chi_groups(df: pd.DataFrame, cells: Cells, by: list[str]) -> np.ndarray | None:
    """The group label of every cell for chi (columns ``by`` must be constant within a cell)."""
    if not by:
        return None
    for col in by:
        if col not in df.columns:
            raise ReleaseError(f"release.chi_by: column {col!r} is not in the data ({len(df)} rows)")
    label = df[by].astype(str).agg("|".join, axis=1).to_numpy()
    codes, uniq = pd.factorize(label)
    per_cell = pd.DataFrame({"cell": cells.codes, "g": codes}).groupby("cell")["g"]
    if int((per_cell.nunique() > 1).sum()):
        raise ReleaseError(f"release.chi_by={by!r}: {int((per_cell.nunique() > 1).sum())} cells span several "
                           "groups; allowed: columns constant within each cell")
    return np.asarray(uniq)[per_cell.first().to_numpy()]


def min_n_rule(sens, cells: Cells, min_n: int):
    """Cells with N < min_n get an infinite LS (so they are neither released nor in chi)."""
    small = (cells.n < min_n) & np.isfinite(sens.ls)
    if not small.any():
        return sens
    reason = sens.reason.copy()
    reason[small] = f"N < release.min_n = {min_n}"
    return dataclasses.replace(sens, ls=np.where(small, np.inf, sens.ls), reason=reason)


def baseline_runs(cells: Cells, conf: Config, rng: np.random.Generator) -> dict[str, Callable[[float], tuple]]:
    """Each baseline as a function of the (add/remove) epsilon it is compared at. Replace-one
    methods run at 2 epsilon replace-one, the replace-one guarantee that every add/remove
    epsilon-DP method also has (a replacement = one removal + one addition)."""
    r = conf.release
    s = r.statistic
    gens = dict(zip(["ss", "ns", "ts", "tw", "gd", "sgd"], rng.spawn(6)))
    runs: dict[str, Callable[[float], tuple]] = {
        f"suppression_{k}": (lambda e, k=k: bl.suppression(cells, statistic=s, k=k, rate_outcome=r.rate_outcome))
        for k in r.suppression_k
    }
    runs.update({
        "ss_laplace": lambda e: bl.sufficient_stats_laplace(cells, statistic=s, epsilon=e, rng=gens["ss"]),
        "noisy_stats": lambda e: bl.noisy_stats(cells, statistic=s, epsilon=2 * e, rng=gens["ns"]),
        "theil_sen": lambda e: bl.dp_theil_sen(cells, statistic=s, epsilon=2 * e, rng=gens["ts"]),
        "theil_sen_wide": lambda e: bl.dp_theil_sen(cells, statistic=s, epsilon=2 * e, rng=gens["tw"], wide=True),
        "dp_gd": lambda e: bl.dp_gradient_descent(cells, statistic=s, epsilon=e, delta=r.delta, rng=gens["gd"]),
        "dp_sgd": lambda e: bl.dp_sgd_engine(cells, statistic=s, epsilon=e, delta=r.delta, rng=gens["sgd"]),
    })
    return runs


def _mos(cells: Cells, conf: Config, groups, sens, se_sens, epsilon: float, seed):
    r = conf.release
    return release_mos(cells, statistic=r.statistic, epsilon=epsilon, neighbors=r.neighbors, noise=r.noise,
                       chi_groups=groups, seed=seed, sensitivity=sens, se_sensitivity=se_sens)


def release_json(mos, conf: Config, *, source: str, method: str, method_meta: dict | None) -> dict[str, Any]:
    frame = mos.frame
    not_released = frame.loc[~frame["released"], "reason"].value_counts().to_dict()
    out = {
        "method": method,
        "statistic": conf.release.statistic,
        "data": source,
        "neighbours": conf.release.neighbors,
        "noise": conf.release.noise,
        "epsilon": mos.epsilon if method == "mos" else (method_meta or {}).get("epsilon"),
        "epsilon_note": "epsilon is per statistic (theta, SE, N); a cell costs their sum (sequential "
        "composition); disjoint cells compose in parallel, so the release's total is the per-cell sum",
        "chi": mos.chi_table.to_dict(orient="records"),
        "chi_by": list(conf.release.chi_by) or "all cells",
        "cells": len(frame),
        "cells_released": int(frame["released"].sum()),
        "cells_not_released": {str(k): int(v) for k, v in not_released.items()},
        "randomness": mos.info.get("rng"),
        "privacy": NOT_DP if method == "mos" else (method_meta or {}).get("guarantee"),
        "mos_details": {k: v for k, v in mos.info.items() if k not in ("privacy",)},
    }
    if method != "mos":
        out["method_meta"] = method_meta
        out["note"] = "chi and the MOS details above describe the MOS release run beside this method"
    return out


def run_release(conf: Config, run_dir: Path) -> float:
    """Run one release; returns MOS's RMSE against the reference (truth, else OLS)."""
    r = conf.release
    run_dir = Path(run_dir)
    df, truth, source = load_rows(conf)
    domain = Domain(r.domain.x_lo, r.domain.x_hi, r.domain.y_lo, r.domain.y_hi)
    cells = group_cells(df, x=r.x, y=r.y, cells=list(r.cells), domain=domain, clip=r.clip)
    groups = chi_groups(df, cells, list(r.chi_by))
    if r.statistic == "custom":
        return run_custom(cells, conf, run_dir, source)
    log.info("release: %d rows in %d cells; statistic=%s, neighbors=%s, epsilon=%g per statistic",
             len(df), cells.n_cells, r.statistic, r.neighbors, r.epsilon)
    fit = ols(cells)
    theta, se = statistic(fit, r.statistic, domain), standard_error(fit, r.statistic, domain)
    sens = min_n_rule(local_sensitivity(cells, statistic=r.statistic, neighbors=r.neighbors), cells, r.min_n)
    se_sens = min_n_rule(se_local_sensitivity(cells, statistic=r.statistic, neighbors=r.neighbors), cells, r.min_n)
    mos = _mos(cells, conf, groups, sens, se_sens, r.epsilon, r.seed)
    rng, _ = make_rng(r.seed)
    runs = baseline_runs(cells, conf, rng)
    results = {"mos": mos.frame[["released", "theta_released", "se_released"]]}
    metas: dict[str, dict] = {}
    if r.method != "mos" and r.method not in runs:
        raise ReleaseError(f"release.method={r.method!r} is not allowed: one of mos, {', '.join(runs)}")
    for name, fn in runs.items():
        if r.compare or name == r.method:
            log.info("baseline %s", name)
            frame, meta = fn(r.epsilon)
            results[name], metas[name] = frame.reset_index(drop=True), meta

    released = mos.to_frame() if r.method == "mos" else pd.concat(
        [cells.keys.reset_index(drop=True), results[r.method]], axis=1)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "release.csv", released.to_csv(index=False))
    write_json(run_dir / "release.json", release_json(mos, conf, source=source, method=r.method,
                                                      method_meta=metas.get(r.method)))
    ref = truth_of(truth, r.y, r.statistic)
    cov = truth["z"].to_numpy() if truth is not None and "z" in truth else None
    common = dict(ols_theta=theta, ols_se=se, n=cells.n, truth=ref, covariate=cov)
    if r.compare:
        table = compare_methods(results, **common)
        atomic_write_text(run_dir / "comparison.csv", table.to_csv(index=False))
        atomic_write_text(run_dir / "comparison.md", comparison_markdown(table, conf, metas, source))
    if r.figures:
        from dptrain.release.report_figures import write_figures

        write_figures(run_dir, df=df, cells=cells, conf=conf, sens=sens, mos=mos, results=results, common=common,
                      tail_fn=lambda e: tail_shares(cells, conf, groups, sens, se_sens, runs, e, common))
    overall = evaluate_release(released=results["mos"], **common)
    rmse = float(overall.loc[overall["band"] == "all", "rmse_truth" if ref is not None else "rmse_ols"].iloc[0])
    log.info("MOS: %d of %d cells released; RMSE %.4g; %s", int(mos.frame["released"].sum()), cells.n_cells,
             rmse, NOT_DP)
    return rmse


def load_stat_fn(spec: str) -> Callable:
    """Import ``package.module:function``."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ReleaseError(f"release.stat_fn={spec!r} cannot be imported ({err}); allowed: "
                           "'package.module:function' importable from the working directory") from None


def run_custom(cells: Cells, conf: Config, run_dir: Path, source: str) -> float:
    """MOS for a user statistic by brute-force refits (no closed form, so no baselines)."""
    from dptrain.release.api import release_custom

    r = conf.release
    if r.chi_by:
        raise ReleaseError("release.chi_by is not supported with release.statistic=custom; allowed: []")
    rel = release_custom(cells, load_stat_fn(r.stat_fn), epsilon=r.epsilon, neighbors=r.neighbors, seed=r.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "release.csv", rel.to_frame().to_csv(index=False))
    frame = rel.frame
    write_json(run_dir / "release.json", {
        **{k: v for k, v in rel.info.items()}, "stat_fn": r.stat_fn, "data": source, "epsilon": rel.epsilon,
        "cells": len(frame), "cells_released": int(frame["released"].sum()),
        "cells_not_released": {str(k): int(v) for k, v in frame.loc[~frame.released, "reason"].value_counts().items()},
        "note": "custom statistic: theta and N released (no SE); no baseline comparison (baselines need OLS)",
    })
    log.info("MOS (custom statistic %s): %d of %d cells released; %s", r.stat_fn, int(frame.released.sum()),
             cells.n_cells, NOT_DP)
    return float("nan")


def truth_of(truth: pd.DataFrame | None, y: str, stat: str) -> np.ndarray | None:
    """The true cell parameter of a simulated release: the y line's p25/p75/slope, or, for the
    rare binary outcome (its rate does not depend on x), p_rare (slope 0)."""
    if truth is None:
        return None
    if y == "y_rare" and "p_rare" in truth:
        return np.zeros(len(truth)) if stat == "slope" else truth["p_rare"].to_numpy()
    return truth[stat].to_numpy()


def tail_shares(cells, conf, groups, sens, se_sens, runs, epsilon: float, common) -> dict[str, float]:
    """Mean of top- and bottom-quintile classification shares at one epsilon (fast methods)."""
    seed = None if conf.release.seed is None else conf.release.seed + int(epsilon * 1000)
    frames = {"mos": _mos(cells, conf, groups, sens, se_sens, epsilon, seed).frame}
    for name in ("ss_laplace", "noisy_stats", "suppression_10"):
        if name in runs:
            frames[name] = runs[name](epsilon)[0].reset_index(drop=True)
    out = {}
    for name, frame in frames.items():
        row = evaluate_release(released=frame, **common).query("band == 'all'").iloc[0]
        out[name] = float((row["tail_top"] + row["tail_bottom"]) / 2)
    return out


def comparison_markdown(table: pd.DataFrame, conf: Config, metas: dict, source: str) -> str:
    r = conf.release
    cols = ["method", "band", "n_cells", "share_released", "rmse_truth", "rmse_ols", "p68_ols",
            "rmse_ratio_se", "tail_top", "tail_bottom", "noise_var_share", "slope_released", "slope_truth",
            "coverage95"]
    cols = [c for c in cols if c in table.columns and not table[c].isna().all()]
    lines = [
        f"# Release comparison: statistic {r.statistic}, epsilon {r.epsilon} per statistic",
        "",
        f"Data: {source}. Same cells, same epsilon for every method's theta. Neighbour relations: MOS "
        f"({r.neighbors}), sufficient-statistic Laplace, DP-GD and DP-SGD (add/remove) run at epsilon; "
        "NoisyStats and DP Theil-Sen are replace-one mechanisms and run at 2 epsilon, the replace-one "
        "guarantee every add/remove epsilon-DP method also has. DP-GD and DP-SGD are (epsilon, "
        f"delta={r.delta})-DP. Suppression adds no noise and its privacy loss is uncontrolled.",
        "",
        f"**{NOT_DP}**",
        "",
        "Guarantees: " + "; ".join(f"{k}: {m.get('guarantee', '')}" for k, m in metas.items()),
        "",
        to_markdown(table[cols]),
    ]
    return "\n".join(lines) + "\n"


