"""The PRIVATE evaluation of a release run: every method on the same cells, against exact values.

Everything here uses exact private quantities (per-cell OLS estimates, true N, the truth of
simulated cells, raw rows in figure 1), so it is written only to ``<run>/private/evaluation/``
and only when ``release.private_evaluation`` allows it (by default: simulated data only). Nothing
here is covered by any guarantee; the release's publishable files never depend on it.

The methods compared are those of the registry (``dptrain.release.methods``) whose
``in_evaluation`` says so; the tail figure draws those with ``tail_figure``. The evaluation is
about MOS (:data:`REFERENCE`): it comes first, and figures 1-2 show its sensitivities and chi.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dptrain.release.cell_domain import cell_label
from dptrain.release.evaluate import compare_methods, evaluate_release, to_markdown
from dptrain.release.methods import RELEASE_METHODS, MethodResult, evaluation_methods, run_method
from dptrain.release.mos import NOT_DP
from dptrain.release.prepared import ReleaseRun
from dptrain.release.report_figures import write_figures
from dptrain.runfolder.tracking import atomic_write_text

REFERENCE = "mos"  # the method the evaluation is about: listed first, its LS and chi in figures 1-2


def truth_of(truth: pd.DataFrame | None, y: str, stat: str) -> np.ndarray | None:
    """The true cell parameter of a simulated release: the y line's p25/p75/slope, or, for the
    rare binary outcome (its rate does not depend on x), p_rare (slope 0)."""
    if truth is None:
        return None
    if y == "y_rare" and "p_rare" in truth:
        return np.zeros(len(truth)) if stat == "slope" else truth["p_rare"].to_numpy()
    return truth[stat].to_numpy()


def aligned_truth(truth: pd.DataFrame | None, listed: Any) -> pd.DataFrame | None:
    """The simulator's truth in the order of the listed cells (NaN for a listed cell the simulator
    does not know); None when the cells are not the simulator's cells (cells=[cell])."""
    if truth is None or list(listed.keys.columns) != ["cell"] or "cell" not in truth:
        return None
    idx = pd.Index(truth["cell"].map(cell_label))
    pos = idx.get_indexer(listed.keys["cell"].map(cell_label))
    out = truth.reset_index(drop=True).reindex(np.where(pos >= 0, pos, len(truth)))
    return out.reset_index(drop=True)


def tail_shares(run: ReleaseRun, common: dict, epsilon: float, index: int) -> dict[str, float]:
    """Mean of top- and bottom-quintile classification shares at one epsilon, for every evaluated
    method drawn in the tail figure (the fast ones)."""
    r = run.spec
    out = {}
    for name in evaluation_methods(r):
        if not RELEASE_METHODS.get(name).tail_figure:
            continue
        rng = run.randomness.numpy(f"evaluation-tail-{name}", index)
        frame = run_method(name, run.est, epsilon=epsilon, rng=rng, config=r).frame.reset_index(drop=True)
        row = evaluate_release(released=frame, **common).query("band == 'all'").iloc[0]
        out[name] = float((row["tail_top"] + row["tail_bottom"]) / 2)
    return out


def _relations(run: ReleaseRun, results: dict[str, MethodResult]) -> str:
    """Each compared method's neighbour relation and the epsilon it ran at."""
    r = run.spec
    parts = []
    for name in results:
        method = RELEASE_METHODS.get(name)
        rel = method.relation(r)
        parts.append(f"{name} (no noise: EXACT values, not private)" if rel is None else
                     f"{name} ({rel.value}, epsilon {method.run_epsilon(r.epsilon_per_statistic, r):g})")
    return ", ".join(parts)


def comparison_markdown(table: pd.DataFrame, run: ReleaseRun, results: dict[str, MethodResult]) -> str:
    r = run.spec
    cols = ["method", "band", "n_cells", "share_released", "rmse_truth", "rmse_ols", "p68_ols",
            "rmse_ratio_se", "tail_top", "tail_bottom", "noise_var_share", "slope_released", "slope_truth",
            "coverage95", "interval_share", "ci_width"]
    cols = [c for c in cols if c in table.columns and not table[c].isna().all()]
    lines = [
        f"# PRIVATE evaluation: statistic {r.statistic}, release.epsilon_per_statistic {r.epsilon_per_statistic}",
        "",
        ("This table is computed from EXACT private values (per-cell OLS, true N, simulated truth): keep it "
         "with the data, never publish it."),
        "",
        (f"Data: {run.source}. Same cells, same epsilon for every method's theta: add/remove (and add) methods "
         "run at epsilon; replace-one methods run at 2 epsilon, the replace-one guarantee every add/remove "
         f"epsilon-DP method also has; (epsilon, delta) methods use delta={r.delta}. Each method's neighbour "
         f"relation and the epsilon it ran at: {_relations(run, results)}."),
        "",
        f"**{NOT_DP}**",
        "",
        "Guarantees: " + "; ".join(f"{k}: {res.meta.get('guarantee', '')}" for k, res in results.items()),
        "",
        to_markdown(table[cols]),
    ]
    return "\n".join(lines) + "\n"


def _common(run: ReleaseRun) -> dict:
    """The exact references every method is judged against (OLS from the run's one fit)."""
    r, est = run.spec, run.est
    t = aligned_truth(run.truth, est.listed)
    return {"ols_theta": est.theta(r.statistic), "ols_se": est.se(r.statistic), "n": est.cells.n,
            "truth": truth_of(t, r.y, r.statistic),
            "covariate": t["z"].to_numpy() if t is not None and "z" in t else None}


def write_evaluation(eval_dir: Path, run: ReleaseRun,
                     results: dict[str, MethodResult]) -> tuple[dict[Path, str], float]:
    """comparison.csv, comparison.md and the figures; returns ({file: description}, the released
    method's RMSE against the reference)."""
    r = run.spec
    results = {name: results[name] for name in sorted(results, key=lambda n: n != REFERENCE)}
    frames = {name: res.frame.reset_index(drop=True) for name, res in results.items()}
    eval_dir.mkdir(parents=True, exist_ok=True)
    common = _common(run)
    table = compare_methods(frames, **common)
    atomic_write_text(eval_dir / "comparison.csv", table.to_csv(index=False))
    atomic_write_text(eval_dir / "comparison.md", comparison_markdown(table, run, results))
    files = {eval_dir / "comparison.csv": "every method against exact values, by true-N band (PRIVATE)",
             eval_dir / "comparison.md": "the same as a table (PRIVATE)"}
    tail_eps = list(r.tail_epsilons)
    figs = write_figures(eval_dir, run=run, reference=results[REFERENCE], frames=frames, common=common,
                         tail_fn=lambda e: tail_shares(run, common, e, tail_eps.index(e)))
    for p in figs:
        files[Path(p)] = "figure from exact values (raw rows, true N, errors) (PRIVATE)"
    overall = evaluate_release(released=frames[r.method], **common)
    col = "rmse_truth" if common["truth"] is not None else "rmse_ols"
    return files, float(overall.loc[overall["band"] == "all", col].iloc[0])
