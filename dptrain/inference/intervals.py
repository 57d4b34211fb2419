"""Intervals and the coefficient table (coefficients.csv, the summary in privacy.txt and the log).

:func:`aggregate_parts` is subsample-and-aggregate's interval (Nissim, Raskhodnikova & Smith
2007 for the framework; the t interval over disjoint parts is the classical "batch means"
interval): K part estimates, each from a disjoint part of the rows and each with its own DP
noise, are K independent draws of the same estimator; their mean estimates its expectation,
``sd / sqrt(K)`` its standard error, and ``mean +- t_{K-1, 1-alpha/2} sd / sqrt(K)`` is a
(1 - alpha) interval that holds exactly when the part estimates are normal and approximately
when they are near-normal. It covers the sampling noise AND the privacy noise of each part,
because both vary across parts. It covers the TRUE coefficient only when each part estimate is
(near) unbiased for it (enough rows per part; clipping and an unconverged optimiser bias DP-SGD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dptrain.core.errors import DPTrainError

__all__ = ["COLUMNS", "Interval", "aggregate_parts", "coefficient_frame", "format_table"]

#: the columns of coefficients.csv
COLUMNS = ("term", "estimate", "std_error", "ci_lower", "ci_upper", "claimed", "reason", "method")


@dataclass(frozen=True)
class Interval:
    """Per-term estimate, standard error and interval (arrays of one entry per term)."""

    estimate: np.ndarray
    std_error: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    level: float


def aggregate_parts(estimates: np.ndarray, *, level: float = 0.95) -> Interval:
    """Mean, SE = sd / sqrt(K) (sd with K - 1 degrees of freedom) and the t interval with K - 1
    degrees of freedom, per column of ``estimates`` (K parts x terms)."""
    a = np.asarray(estimates, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise DPTrainError("subsample-and-aggregate needs at least 2 part estimates (estimator.parts >= 2)")
    if not 0 < level < 1:
        raise DPTrainError(f"estimator.level={level!r} is not allowed: must be in (0, 1)")
    k = a.shape[0]
    mean = a.mean(axis=0)
    se = a.std(axis=0, ddof=1) / np.sqrt(k)
    from scipy import stats  # here, not at the top: a run without intervals never imports scipy.stats

    t = float(stats.t.ppf(0.5 + level / 2, df=k - 1))
    return Interval(mean, se, mean - t * se, mean + t * se, level)


def coefficient_frame(terms: list[str], estimate: np.ndarray, interval: Interval | None, *,
                      method: str, claimed: Any = False, reasons: Any = None) -> pd.DataFrame:
    """The table of coefficients.csv: one row per term. ``claimed``: whether each term's interval
    is claimed valid (one bool, or one per term); a term that is not claimed shows no standard error
    or interval (an interval nobody vouches for is not published). ``reasons``: why, per term (one
    text, or one per term; default: the claim in words)."""
    n = len(terms)
    if len(estimate) != n:
        raise DPTrainError(f"{len(estimate)} estimates for {n} terms")
    nan = np.full(n, np.nan)
    iv = interval
    ok = np.broadcast_to(np.asarray(claimed, dtype=bool), (n,)) & (iv is not None)
    if reasons is None:
        reasons = ["claimed" if c else "NOT CLAIMED" if iv is not None else "no interval" for c in ok]
    elif isinstance(reasons, str):
        reasons = [reasons] * n

    def shown(values: np.ndarray | None) -> np.ndarray:
        return nan if values is None else np.where(ok, values, np.nan)

    return pd.DataFrame({
        "term": terms, "estimate": np.asarray(estimate, dtype=np.float64),
        "std_error": shown(iv.std_error if iv is not None else None),
        "ci_lower": shown(iv.lower if iv is not None else None),
        "ci_upper": shown(iv.upper if iv is not None else None),
        "claimed": ok.copy(), "reason": list(reasons), "method": [method] * n,
    }, columns=list(COLUMNS))


def format_table(frame: pd.DataFrame, *, title: str, level: float = 0.95) -> str:
    """A statsmodels-like summary of the table (fixed-width text)."""
    width = max([len("term"), *(len(t) for t in frame["term"])])
    pct = f"{level * 100:g}%"
    head = (f"{'term':<{width}}  {'estimate':>11}  {'std err':>10}  {'[' + pct + ' lower':>12}  {pct + ' upper]':>12}"
            "  claimed")
    rule = "=" * len(head)
    lines = [title, rule, head, "-" * len(head)]
    for row in frame.itertuples(index=False):
        cells = [f"{v:>{w}.5g}" if np.isfinite(v) else f"{'':>{w}}"
                 for v, w in ((row.std_error, 10), (row.ci_lower, 12), (row.ci_upper, 12))]
        claim = ("yes" if row.claimed else "NO") if np.isfinite(row.std_error) else ""
        lines.append((f"{row.term:<{width}}  {row.estimate:>11.5g}  " + "  ".join(cells) + f"  {claim:>7}").rstrip())
    lines += [rule, f"method: {frame['method'].iloc[0]}" if len(frame) else "method: -"]
    return "\n".join(lines)
