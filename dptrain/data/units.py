"""Units of privacy: the rows of one person (household, establishment) as one unit.

With ``data.privacy_unit=COLUMN`` a run's neighbouring data sets differ by ALL rows of one value
of that column. Two primitives serve training and the releases alike:

* :func:`unit_codes`: the unit column as dense codes 0..n_units-1 (equal ids, compared as the
  stripped strings of :func:`dptrain.data.labels.cell_label`, get one code; the codes follow the
  sorted ids, so they do not depend on the order of the rows). A missing id is a stated rule:
  ``missing="error"`` (the default) refuses the table, ``missing="drop"`` codes such rows -1 for
  the caller to leave out and count PRIVATELY (``private/`` files only).
* :func:`cap_rows_per_unit`: at most k rows per unit, each unit's kept rows a uniform random
  choice among its rows, drawn from the run's SECRET randomness (the caller passes the
  generator: :meth:`dptrain.privacy.randomness.Randomness.numpy`, never the public seed). Which
  rows were dropped, and how many, is private.

How many rows a unit has, how many units there are and how many rows the cap dropped are
private counts: nothing here logs them; callers write them to ``private/`` only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dptrain.data.files import DataError
from dptrain.data.labels import cell_label, nfc

__all__ = ["MISSING_RULES", "unit_codes", "cap_rows_per_unit", "rows_per_unit", "unit_of_rows"]

#: what a missing unit id does: error (refuse the table) | drop (code -1: left out, counted privately)
MISSING_RULES = ("error", "drop")


def unit_codes(values: Any, *, missing: str = "error", column: str = "data.privacy_unit") -> np.ndarray:
    """The unit ids ``values`` (a column: a pandas Series, an array or a list) as dense int64
    codes 0..n_units-1, in the sorted order of the ids as compared strings (1, 1.0 and " 1" are
    one unit). A missing id (None, NaN, an empty string): ``missing="error"`` raises DataError
    naming ``column`` (no count, no value); ``missing="drop"`` gives it code -1."""
    if missing not in MISSING_RULES:
        raise ValueError(f"missing={missing!r}: must be one of {', '.join(MISSING_RULES)}")
    col = values if isinstance(values, pd.Series) else pd.Series(np.asarray(values, dtype=object), dtype=object)
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    labels = [nfc(cell_label(u)) for u in uniques]
    labels = [None if lab == "" else lab for lab in labels]
    distinct = sorted({lab for lab in labels if lab is not None})
    dense = {lab: i for i, lab in enumerate(distinct)}
    remap = np.array([dense[lab] if lab is not None else -1 for lab in labels] + [-1], dtype=np.int64)
    out = remap[np.asarray(codes, dtype=np.int64)]  # pandas' sentinel -1 indexes the trailing -1
    if missing == "error" and (out < 0).any():
        raise DataError(f"{column}: some rows have no unit id (a missing or empty value); a row must belong to a "
                        "unit. Fix the file, or leave such rows out and count them privately with the rule "
                        "missing=drop")
    return out


def rows_per_unit(codes: np.ndarray) -> np.ndarray:
    """How many rows each unit has (index: the unit's code; codes -1 ignored). PRIVATE counts."""
    codes = np.asarray(codes, dtype=np.int64)
    return np.bincount(codes[codes >= 0]) if codes.size else np.zeros(0, dtype=np.int64)


def cap_rows_per_unit(codes: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (ascending) of the rows kept when each unit keeps at most ``k`` of its rows: a unit
    with more than ``k`` keeps a uniformly random subset of ``k`` (every subset of size k equally
    likely), drawn from ``rng`` (the run's SECRET generator); a unit with at most ``k`` keeps all.
    Codes must be >= 0 (leave missing units out first). The dropped count is private."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k={k!r}: must be an integer >= 1")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy Generator from the run's secret randomness")
    codes = np.asarray(codes, dtype=np.int64)
    if codes.ndim != 1 or (codes.size and codes.min() < 0):
        raise ValueError("codes must be a 1-d array of unit codes >= 0")
    n = codes.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = rng.random(n)  # a uniform random order within each unit: its first k rows are a uniform k-subset
    order = np.lexsort((keys, codes))
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    rank = np.arange(n) - group_start
    return np.sort(order[rank < int(k)])


def unit_of_rows(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """(dense codes, n_units) of ``codes`` restricted to some rows (e.g. the training part, or the
    rows the cap kept): codes renumbered 0..n_units-1 in their order, so a segment-sum over
    units has no empty unit. ``n_units`` is PRIVATE (it is the accountant's N)."""
    codes = np.asarray(codes, dtype=np.int64)
    uniq, dense = np.unique(codes, return_inverse=True)
    return dense.astype(np.int64), int(uniq.size)
