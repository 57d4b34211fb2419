"""The PRIVATE evaluation of a release run: every method on the same cells, against exact values.

Everything here uses exact private quantities (per-cell OLS estimates, true N, the truth of
simulated cells, raw rows in figure 1), so it is written only to ``<run>/private/evaluation/``
and only when ``release.private_evaluation`` allows it (by default: simulated data only). Nothing
here is covered by any guarantee; the release's publishable files never depend on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dptrain.release.cell_domain import cell_label
from dptrain.release.cells import ols, standard_error, statistic
from dptrain.release.evaluate import compare_methods, evaluate_release, to_markdown
from dptrain.release.mos import NOT_DP
from dptrain.tracking import atomic_write_text


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


def tail_shares(mos_in: Any, cells: Any, conf: Any, randomness: Any, epsilon: float, index: int,
                common: dict) -> dict[str, float]:
    """Mean of top- and bottom-quintile classification shares at one epsilon (fast methods)."""
    from dptrain.release.run import method_runner

    frames = {"mos": mos_in.release(epsilon, randomness.numpy("evaluation-tail-mos", index)).frame}
    for name in ("ss_laplace", "noisy_stats", "suppression_10"):
        if name != "suppression_10" or 10 in conf.release.suppression_k:
            rng = randomness.numpy(f"evaluation-tail-{name}", index)
            frames[name] = method_runner(name, cells, conf, rng)(epsilon)[0].reset_index(drop=True)
    out = {}
    for name, frame in frames.items():
        row = evaluate_release(released=frame, **common).query("band == 'all'").iloc[0]
        out[name] = float((row["tail_top"] + row["tail_bottom"]) / 2)
    return out


def comparison_markdown(table: pd.DataFrame, conf: Any, metas: dict, source: str) -> str:
    r = conf.release
    cols = ["method", "band", "n_cells", "share_released", "rmse_truth", "rmse_ols", "p68_ols",
            "rmse_ratio_se", "tail_top", "tail_bottom", "noise_var_share", "slope_released", "slope_truth",
            "coverage95"]
    cols = [c for c in cols if c in table.columns and not table[c].isna().all()]
    lines = [
        f"# PRIVATE evaluation: statistic {r.statistic}, epsilon {r.epsilon} per statistic",
        "",
        ("This table is computed from EXACT private values (per-cell OLS, true N, simulated truth): keep it "
         "with the data, never publish it."),
        "",
        (f"Data: {source}. Same cells, same epsilon for every method's theta. Neighbour relations: MOS "
         f"({r.neighbors}), sufficient-statistic Laplace, DP-GD and DP-SGD (add/remove) run at epsilon; "
         "NoisyStats and DP Theil-Sen are replace-one mechanisms and run at 2 epsilon, the replace-one "
         "guarantee every add/remove epsilon-DP method also has. DP-GD and DP-SGD are (epsilon, "
         f"delta={r.delta})-DP. Suppression adds no noise: it releases exact values and is not private."),
        "",
        f"**{NOT_DP}**",
        "",
        "Guarantees: " + "; ".join(f"{k}: {m.get('guarantee', '')}" for k, m in metas.items()),
        "",
        to_markdown(table[cols]),
    ]
    return "\n".join(lines) + "\n"


def write_evaluation(eval_dir: Path, *, df: pd.DataFrame, cells: Any, conf: Any, truth: pd.DataFrame | None,
                     listed: Any, results: dict[str, pd.DataFrame], metas: dict, mos: Any, mos_in: Any,
                     source: str, randomness: Any) -> tuple[dict[Path, str], float]:
    """comparison.csv, comparison.md and the figures; returns ({file: description}, the released
    method's RMSE against the reference)."""
    from dptrain.release.report_figures import write_figures

    r = conf.release
    eval_dir.mkdir(parents=True, exist_ok=True)
    fit = ols(cells)
    theta, se = statistic(fit, r.statistic, cells.domain), standard_error(fit, r.statistic, cells.domain)
    t = aligned_truth(truth, listed)
    ref = truth_of(t, r.y, r.statistic)
    cov = t["z"].to_numpy() if t is not None and "z" in t else None
    common = {"ols_theta": theta, "ols_se": se, "n": cells.n, "truth": ref, "covariate": cov}
    files: dict[Path, str] = {}
    table = compare_methods(results, **common)
    atomic_write_text(eval_dir / "comparison.csv", table.to_csv(index=False))
    atomic_write_text(eval_dir / "comparison.md", comparison_markdown(table, conf, metas, source))
    files[eval_dir / "comparison.csv"] = "every method against exact values, by true-N band (PRIVATE)"
    files[eval_dir / "comparison.md"] = "the same as a table (PRIVATE)"
    tail_eps = list(r.tail_epsilons)
    figs = write_figures(eval_dir, df=df, cells=cells, conf=conf, sens=mos_in.sens, mos=mos, results=results,
                         common=common, tail_fn=lambda e: tail_shares(mos_in, cells, conf, randomness, e,
                                                                     tail_eps.index(e), common))
    for p in figs:
        files[Path(p)] = "figure from exact values (raw rows, true N, errors) (PRIVATE)"
    overall = evaluate_release(released=results[r.method], **common)
    col = "rmse_truth" if ref is not None else "rmse_ols"
    return files, float(overall.loc[overall["band"] == "all", col].iloc[0])
