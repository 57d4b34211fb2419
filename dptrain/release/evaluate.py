"""How releases are judged (docs/release.md section 6), by cell-size band, vectorised over cells.

Every metric is computed for each band of N (``bands``: half-open intervals [lo, hi)) and for
all cells together (band ``"all"``). The reference ("truth") is the true cell parameter when
``truth`` is given (simulated data), else the non-private OLS estimate. Definitions, for the
cells of a band, with R = released cells whose released value is finite:

* ``share_released`` = |R| / cells in the band;
* ``rmse_ols``, ``p68_ols``: sqrt(mean e^2) and the 68th percentile of |e| over R (cells with a
  finite OLS estimate), e = theta_released - ols_theta; ``rmse_truth``, ``p68_truth`` likewise
  against ``truth``;
* ``ols_se_rms`` = sqrt(mean ols_se^2) over the same cells; ``rmse_ratio_se`` =
  rmse_ols / ols_se_rms and ``p68_ratio_se`` = p68_ols / ols_se_rms (privacy error against
  sampling error; the aim is <= 1);
* ``tail_top`` (``tail_bottom``): of the cells whose reference value is in the top (bottom)
  quintile of the band's reference values (>= the 0.8 quantile, <= the 0.2 quantile, numpy's
  linear interpolation), the share that are released AND have a released value in the top
  (bottom) quintile of the band's released values; unreleased cells count as misses;
* ``noise_var_share`` = Var(theta_released - ols_theta) / Var(theta_released) over R (population
  variances); it can exceed 1 when the noise is negatively correlated with the estimate;
* ``slope_released``: OLS slope of theta_released on ``covariate`` over R; ``slope_truth``: the
  slope of the reference on ``covariate`` over all band cells with a finite reference;
  ``slope_bias`` = slope_released - slope_truth (downstream bias, the paper's teen-birth example);
* ``coverage95``: over R with a released 95% interval (columns ``ci_low``, ``ci_high``, finite),
  the share whose interval holds the truth (needs ``truth``); a frame without interval columns
  but with ``se_released`` is judged on theta_released +/- 1.96 se_released;
* ``interval_share``: the share of R with a finite interval; ``ci_width``: the median width
  (ci_high - ci_low) over those cells.

A metric that cannot be computed (no cells, no truth, no covariate) is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dptrain.release.cells import ReleaseError

__all__ = ["DEFAULT_BANDS", "METRICS", "compare_methods", "evaluate_release", "to_markdown"]

DEFAULT_BANDS: tuple[tuple[float, float], ...] = (
    (1, 20),
    (20, 50),
    (50, 100),
    (100, 300),
    (300, math.inf),
)
METRICS: tuple[str, ...] = (
    "n_cells",
    "n_released",
    "share_released",
    "rmse_ols",
    "p68_ols",
    "rmse_truth",
    "p68_truth",
    "ols_se_rms",
    "rmse_ratio_se",
    "p68_ratio_se",
    "tail_top",
    "tail_bottom",
    "noise_var_share",
    "slope_released",
    "slope_truth",
    "slope_bias",
    "coverage95",
    "interval_share",
    "ci_width",
)


def _band_label(lo: float, hi: float) -> str:
    def f(v: float) -> str:
        return "inf" if math.isinf(v) else f"{v:g}"

    return f"[{f(lo)},{f(hi)})"


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """OLS slope of y on x ACROSS cells (released values on a cell covariate): not a per-cell fit,
    so not ``cells.ols``."""
    if x.size < 2:
        return math.nan
    xc = x - x.mean()
    sxx = float(xc @ xc)
    return float(xc @ (y - y.mean())) / sxx if sxx > 0 else math.nan


def _tail(ref: np.ndarray, rel: np.ndarray, released: np.ndarray) -> tuple[float, float]:
    """Shares of true top/bottom-quintile cells released in the top/bottom released quintile."""
    ok = np.isfinite(ref)
    if ok.sum() == 0 or released.sum() == 0:
        return (math.nan, math.nan) if ok.sum() == 0 else (0.0, 0.0)
    r_lo, r_hi = np.quantile(ref[ok], [0.2, 0.8])
    q_lo, q_hi = np.quantile(rel[released], [0.2, 0.8])
    true_top, true_bot = ok & (ref >= r_hi), ok & (ref <= r_lo)
    rel_top, rel_bot = released & (rel >= q_hi), released & (rel <= q_lo)
    return float((true_top & rel_top).sum() / true_top.sum()), float(
        (true_bot & rel_bot).sum() / true_bot.sum()
    )


def _error_stats(err: np.ndarray) -> tuple[float, float]:
    err = err[np.isfinite(err)]
    if err.size == 0:
        return math.nan, math.nan
    return float(np.sqrt(np.mean(err * err))), float(np.quantile(np.abs(err), 0.68))


def _band_metrics(
    rel: np.ndarray,
    released: np.ndarray,
    ci: tuple[np.ndarray, np.ndarray] | None,
    ols_theta: np.ndarray,
    ols_se: np.ndarray,
    truth: np.ndarray | None,
    covariate: np.ndarray | None,
) -> dict:
    out: dict[str, float] = dict.fromkeys(METRICS, math.nan)
    out["n_cells"], out["n_released"] = rel.size, int(released.sum())
    if rel.size == 0:
        return out
    out["share_released"] = released.mean()
    r = released & np.isfinite(ols_theta)
    e_ols = rel[r] - ols_theta[r]
    out["rmse_ols"], out["p68_ols"] = _error_stats(e_ols)
    if r.any():
        se = ols_se[r]
        se = se[np.isfinite(se)]
        out["ols_se_rms"] = float(np.sqrt(np.mean(se * se))) if se.size else math.nan
        out["rmse_ratio_se"] = out["rmse_ols"] / out["ols_se_rms"]
        out["p68_ratio_se"] = out["p68_ols"] / out["ols_se_rms"]
        v = float(np.var(rel[r]))
        out["noise_var_share"] = float(np.var(e_ols)) / v if v > 0 else math.nan
    ref = ols_theta if truth is None else truth
    if truth is not None:
        out["rmse_truth"], out["p68_truth"] = _error_stats(rel[released] - truth[released])
    out["tail_top"], out["tail_bottom"] = _tail(ref, rel, released)
    if covariate is not None:
        ok = np.isfinite(ref) & np.isfinite(covariate)
        out["slope_truth"] = _slope(covariate[ok], ref[ok])
        rc = released & np.isfinite(covariate)
        out["slope_released"] = _slope(covariate[rc], rel[rc])
        out["slope_bias"] = out["slope_released"] - out["slope_truth"]
    if ci is not None:
        lo, hi = ci
        has = released & np.isfinite(lo) & np.isfinite(hi)
        if released.any():
            out["interval_share"] = float(has.sum() / released.sum())
        if has.any():
            out["ci_width"] = float(np.median(hi[has] - lo[has]))
        if truth is not None:
            c = has & np.isfinite(truth)
            if c.any():
                out["coverage95"] = float(np.mean((lo[c] <= truth[c]) & (truth[c] <= hi[c])))
    return out


def _pick(a: np.ndarray | None, m: np.ndarray) -> np.ndarray | None:
    return None if a is None else a[m]


def _pick_ci(ci: tuple[np.ndarray, np.ndarray] | None, m: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    return None if ci is None else (ci[0][m], ci[1][m])


def _as_array(name: str, v, g: int | None) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    if g is not None and a.size != g:
        raise ReleaseError(
            f"evaluate_release: {name} has {a.size} entries but released has {g} cells; "
            "allowed: one entry per cell, in cell order"
        )
    return a


def _released_columns(released: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, tuple | None]:
    """(theta_released, released and finite, (ci_low, ci_high) or None) of a released frame: the
    method's own interval, else theta_released -/+ 1.96 se_released, else None."""
    for col in ("released", "theta_released"):
        if col not in released.columns:
            raise ReleaseError(
                f"evaluate_release: released has no column {col!r} (columns: "
                f"{list(released.columns)}); allowed: released, theta_released[, se_released]"
            )
    rel = released["theta_released"].to_numpy(dtype=np.float64)
    is_rel = released["released"].to_numpy(dtype=bool) & np.isfinite(rel)
    if {"ci_low", "ci_high"} <= set(released.columns):
        ci = (released["ci_low"].to_numpy(dtype=np.float64), released["ci_high"].to_numpy(dtype=np.float64))
    elif "se_released" in released.columns:
        se = released["se_released"].to_numpy(dtype=np.float64)
        ci = (rel - 1.96 * se, rel + 1.96 * se)
    else:
        ci = None
    return rel, is_rel, ci


def evaluate_release(
    *,
    released: pd.DataFrame,
    ols_theta: np.ndarray,
    ols_se: np.ndarray,
    n: np.ndarray,
    truth: np.ndarray | None = None,
    covariate: np.ndarray | None = None,
    bands: Sequence[tuple[float, float]] = DEFAULT_BANDS,
) -> pd.DataFrame:
    """Judge one release against OLS (and the truth) by cell-size band (module docstring).

    Args:
        released: one row per cell in cell order; columns ``released`` (bool),
            ``theta_released`` (NaN where not released) and optionally ``ci_low`` / ``ci_high``
            (the method's 95% interval) or ``se_released``.
        ols_theta, ols_se: the non-private per-cell estimate and its standard error.
        n: per-cell size N_g (true N, not the noisy one) used for the bands.
        truth: the true cell parameter (simulated data), else the reference is ``ols_theta``.
        covariate: a cell-level covariate for the downstream slope.
        bands: half-open intervals [lo, hi) of N; a cell in none of them counts only in "all".

    Returns:
        One row per band then an ``"all"`` row: columns ``band, n_lo, n_hi`` and ``METRICS``.
    """
    rel, is_rel, ci = _released_columns(released)
    g = len(released)
    ols_theta, ols_se, n = (
        _as_array("ols_theta", ols_theta, g),
        _as_array("ols_se", ols_se, g),
        _as_array("n", n, g),
    )
    truth = None if truth is None else _as_array("truth", truth, g)
    covariate = None if covariate is None else _as_array("covariate", covariate, g)
    rows = []
    for lo, hi in list(bands) + [(-math.inf, math.inf)]:
        m = (n >= lo) & (n < hi)
        met = _band_metrics(
            rel[m],
            is_rel[m],
            _pick_ci(ci, m),
            ols_theta[m],
            ols_se[m],
            _pick(truth, m),
            _pick(covariate, m),
        )
        label = "all" if math.isinf(lo) else _band_label(lo, hi)
        rows.append({"band": label, "n_lo": lo, "n_hi": hi, **met})
    out = pd.DataFrame(rows)
    out[["n_cells", "n_released"]] = out[["n_cells", "n_released"]].astype(np.int64)
    return out


def compare_methods(results: dict[str, pd.DataFrame], **same_kwargs) -> pd.DataFrame:
    """Evaluate several releases of the same cells: a long table with columns ``method, band, ...``.

    ``results`` maps a method name to its released frame; ``same_kwargs`` are the other
    arguments of :func:`evaluate_release` (ols_theta, ols_se, n, truth, covariate, bands)."""
    frames = [
        evaluate_release(released=df, **same_kwargs).assign(method=name)
        for name, df in results.items()
    ]
    if not frames:
        raise ReleaseError(
            "compare_methods: results={} is empty; allowed: at least one method -> released frame"
        )
    out = pd.concat(frames, ignore_index=True)
    return out[["method"] + [c for c in out.columns if c != "method"]]


def _cell(v, floatfmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return (
            "inf"
            if math.isinf(v) and v > 0
            else ("-inf" if math.isinf(v) else format(float(v), floatfmt))
        )
    return str(v).replace("|", "\\|").replace("\n", " ")


def to_markdown(table: pd.DataFrame, *, floatfmt: str = ".4g", index: bool = False) -> str:
    """A GitHub-flavoured markdown table (no dependency on ``tabulate``); NaN prints as empty,
    numbers are right-aligned."""
    df = table.reset_index() if index else table
    header = [str(c) for c in df.columns]
    body = [[_cell(v, floatfmt) for v in row] for row in df.itertuples(index=False, name=None)]
    numeric = [
        pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        for c in df.columns
    ]
    width = [max([len(h)] + [len(r[j]) for r in body]) for j, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, width, numeric)
            )
            + " |"
        )

    sep = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(width, numeric)
        )
        + "|"
    )
    return "\n".join([line(header), sep] + [line(r) for r in body]) + "\n"
