"""Which cells a release lists: a public declaration, or a differentially private selection.

Why this matters. If the list of cells were the cells that have rows, removing the only person
of a cell would remove that cell from release.csv, whatever noise the method adds to the values:
the list itself would reveal that someone with that cell's characteristics is in the data. So a
release run lists cells in one of two ways, decided before any row is read:

* **declared** (``release.cell_values`` or ``release.cell_keys_file``; for simulated data the
  simulator's own design): a list fixed without looking at the data. Every declared cell is
  listed, with or without rows; a row whose cell is not declared (or has a missing cell value) is
  left out, each row on its own, so adding or removing one row changes nothing else.
* **private** (``release.cell_selection=private``): a stability-based histogram. Each OBSERVED
  cell's row count gets discrete Laplace noise of scale 1 / epsilon_sel (on the integer grid of
  :mod:`dptrain.release.noise`), and the cell is listed only if its noisy count reaches a
  threshold tau chosen (exactly, for the discrete Laplace law) so that a cell with one row is
  listed with probability <= delta_sel. Neighbouring data sets (one row added or removed) change
  one cell's count by 1: if the cell is observed in both, the discrete Laplace gives a privacy
  loss of at most epsilon_sel; if the row is its only one, the cell is listed at all only with
  probability <= delta_sel. So the list is (epsilon_sel, delta_sel)-DP under add/remove
  neighbours; the noisy counts are discarded (never released), and the list is sorted so that
  its order says nothing about the rows.

Cell values are compared as stripped strings (1, 1.0 and " 1" are the same cell; a missing value
is no cell). Messages name settings and declared (public) values, never a count of rows.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dptrain.core.validation import ConfigError, bad, finite_positive, is_real
from dptrain.data.labels import cell_label
from dptrain.release.cells import ReleaseError
from dptrain.release.noise import add_noise

MAX_DECLARED_CELLS = 50_000_000


@dataclass(frozen=True)
class CellSource:
    """Where a release's cells are to come from, as declared before any row is read: declared
    values (``release.cell_values``), a declared keys file (``release.cell_keys_file``: its path,
    or None), a private selection at (``selection_epsilon``, ``selection_delta``) when
    ``selection`` is "private", or, for simulated data, the simulator's public design."""

    has_values: bool
    keys_file: Any
    selection: str
    selection_epsilon: Any
    selection_delta: Any
    simulated: bool


def check_listing(source: CellSource) -> None:
    """Refuse, before any row is read, a release whose cells would come from the rows present
    (whether a cell is listed would tell whether anyone is in it), a double declaration, and a
    private selection beside a declaration or with a bad budget. One message for the command line
    and the Python API (:func:`dptrain.release.api.fit_cells`). Raises ConfigError."""
    if source.has_values and source.keys_file is not None:
        raise bad("release.cell_keys_file", source.keys_file,
                  "declare the cells once: release.cell_values OR release.cell_keys_file, not both")
    if source.selection == "private":
        if source.has_values or source.keys_file is not None:
            raise bad("release.cell_selection", "private", "select cells privately only when none are declared; "
                      "with release.cell_values / release.cell_keys_file set release.cell_selection=declared")
        finite_positive("release.selection_epsilon", source.selection_epsilon)
        if not (is_real(source.selection_delta) and 0 < source.selection_delta < 1):
            raise bad("release.selection_delta", source.selection_delta, "must be in (0, 1), e.g. 1e-6")
    elif not (source.has_values or source.keys_file is not None or source.simulated):
        raise ConfigError(
            "release.cell_values=null and release.cell_keys_file=null: the release is refused (no row was read). "
            "The list of cells must not come from the rows present: a cell that appears only when someone is in "
            "it would reveal them. Allowed: declare the public cells, release.cell_values={COLUMN: [v1, v2, ...]} "
            "for each release.cells column (the cells are the cross product), or release.cell_keys_file=PATH "
            "(a CSV/Parquet with one column per release.cells column, one row per cell); or set "
            "release.cell_selection=private (cells selected with (release.selection_epsilon, "
            "release.selection_delta)-DP, composed into the release's totals)")


def _label_column(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes per row into ``uniq``, -1 for missing; the labels ``uniq``), labelling each
    distinct value once."""
    codes, uniq = pd.factorize(col, use_na_sentinel=True)
    labels = np.array([cell_label(u) for u in np.asarray(uniq, dtype=object)], dtype=object)
    missing = np.array([lab is None for lab in labels], dtype=bool)
    if missing.any():
        codes = np.where((codes >= 0) & missing[np.maximum(codes, 0)], -1, codes)
    return codes, labels


@dataclass(frozen=True)
class CellDomain:
    """The listed cells. ``keys``: one row per listed cell, the ``release.cells`` columns (in
    listing order: declared order, or sorted for a private selection). ``public``: the same rows
    with every public column known per cell (extra columns of a key file, the simulator's design),
    for ``release.chi_by``. ``origin``: "declared" | "simulator" | "private_selection".
    ``selection``: facts of a private selection (epsilon, delta, threshold), else None."""

    keys: pd.DataFrame
    public: pd.DataFrame
    origin: str
    description: str
    selection: dict | None = None

    @property
    def n_cells(self) -> int:
        return len(self.keys)

    def row_codes(self, df: pd.DataFrame) -> np.ndarray:
        """Per row of ``df`` the index of its listed cell, -1 if its cell is not listed or a cell
        value is missing (each row decided on its own)."""
        cols = list(self.keys.columns)
        for col in cols:
            if col not in df.columns:
                raise ReleaseError(f"release.cells: column {col!r} is not in the data; allowed: a column of the table")
        row_code = np.zeros(len(df), dtype=np.int64)
        key_code = np.zeros(len(self.keys), dtype=np.int64)
        ok = np.ones(len(df), dtype=bool)
        radix = 1
        for col in cols:
            key_labels = np.array([cell_label(v) for v in self.keys[col].to_numpy(dtype=object)], dtype=object)
            vocab = pd.Index(pd.unique(key_labels))
            codes, labels = _label_column(df[col])
            per_value = vocab.get_indexer(labels) if len(labels) else np.zeros(0, dtype=np.int64)
            rc = np.where(codes >= 0, per_value[np.maximum(codes, 0)] if len(labels) else -1, -1)
            ok &= rc >= 0
            if radix > (2**62) // max(len(vocab), 1):
                raise ReleaseError("release.cells: too many distinct declared values to index; allowed: fewer cells")
            row_code += np.maximum(rc, 0) * radix
            key_code += vocab.get_indexer(key_labels) * radix
            radix *= max(len(vocab), 1)
        out = pd.Index(key_code).get_indexer(row_code)
        return np.where(ok, out, -1).astype(np.int64)


def _check_unique(keys: pd.DataFrame, setting: str) -> None:
    labels = keys.apply(lambda col: col.map(cell_label))
    if labels.isna().to_numpy().any():
        raise ReleaseError(f"{setting}: a declared cell value is missing; allowed: a value in every cell column")
    dup = labels.duplicated()
    if dup.any():
        first = keys[dup.to_numpy()].iloc[0].to_dict()
        raise ReleaseError(f"{setting}: the cell {first} is declared twice (values compare as stripped strings); "
                           "allowed: each cell once")


def from_values(values: dict[str, list[Any]], cells: list[str]) -> CellDomain:
    """The cross product of ``release.cell_values`` (one list per cell column)."""
    for col in cells:
        labels = [cell_label(v) for v in values[col]]
        if any(lab is None for lab in labels) or len(set(labels)) != len(labels):
            raise ReleaseError(f"release.cell_values.{col}={list(values[col])!r}: values must be present and distinct "
                               "(compared as stripped strings)")
    size = math.prod(len(values[c]) for c in cells)
    if size > MAX_DECLARED_CELLS:
        raise ReleaseError(f"release.cell_values declares {size:,} cells; allowed: at most {MAX_DECLARED_CELLS:,}")
    keys = pd.DataFrame(list(itertools.product(*(list(values[c]) for c in cells))), columns=cells)
    return CellDomain(keys=keys, public=keys.copy(), origin="declared",
                      description=f"declared: release.cell_values, the cross product of the listed values of "
                                  f"{', '.join(cells)} ({len(keys)} cells, public)")


def read_keys_file(path: str, cells: list[str]) -> pd.DataFrame:
    """The table of ``release.cell_keys_file`` (CSV, Parquet or .dta), column names stripped."""
    p = Path(path).expanduser()
    setting = f"release.cell_keys_file={path!r}"
    if not p.is_file():
        raise ReleaseError(f"{setting}: no such file; allowed: a CSV or Parquet file listing the cells")
    name = p.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            table = pd.read_parquet(p)
        elif name.endswith(".dta"):
            table = pd.read_stata(p, convert_categoricals=False)
        else:
            table = pd.read_csv(p, encoding="utf-8", low_memory=False)
    except Exception as exc:  # noqa: BLE001 - any failure to read the (public) key file
        raise ReleaseError(f"{setting}: cannot be read ({type(exc).__name__}); allowed: a CSV (UTF-8) or "
                           "Parquet file with a header line and one row per cell") from None
    table.columns = [str(c).strip() for c in table.columns]
    missing = [c for c in cells if c not in table.columns]
    if missing:
        raise ReleaseError(f"{setting}: has no column {missing}; allowed: one column per release.cells column "
                           f"{cells} (found {list(table.columns)})")
    if len(table) == 0:
        raise ReleaseError(f"{setting}: lists no cell; allowed: one row per cell")
    return table


def from_table(table: pd.DataFrame, cells: list[str], *, origin: str, description: str,
               setting: str, collapse: bool = False) -> CellDomain:
    """Cells listed by a public table (a key file, or the simulator's design). ``collapse``: rows
    repeating a cell are merged (the design lists finer units); else a repeated cell is refused.
    Extra columns constant within each cell are kept as public columns (for chi_by)."""
    if collapse:
        labels = table[cells].apply(lambda col: col.map(cell_label))
        first = ~labels.duplicated().to_numpy()
        group = labels.groupby(list(cells), sort=False, dropna=False).ngroup().to_numpy()
        extra = [c for c in table.columns if c not in cells
                 and (pd.Series(table[c].to_numpy()).groupby(group).nunique(dropna=False) <= 1).all()]
        table = table.loc[first, cells + extra]
    _check_unique(table[cells], setting)
    table = table.reset_index(drop=True)
    return CellDomain(keys=table[cells].copy(), public=table.copy(), origin=origin,
                      description=f"{description} ({len(table)} cells, public)")


def selection_threshold(epsilon: float, delta: float) -> int:
    """The least integer tau such that a cell with ONE row passes ``1 + K >= tau`` with
    probability <= delta, for K discrete Laplace, P(K = k) = (1 - q)/(1 + q) q^|k|, q = e^-eps.

    P(K >= m) = q^m / (1 + q) for m >= 1 and 1 - q^(1-m) / (1 + q) for m <= 0; tau = 1 + m*,
    m* the least m with P(K >= m) <= delta (computed in logs, then checked on both sides)."""
    if not (math.isfinite(epsilon) and epsilon > 0) or not (0 < delta < 1):
        raise ReleaseError(f"release.selection_epsilon={epsilon!r}, release.selection_delta={delta!r}: "
                           "allowed: epsilon > 0 and delta in (0, 1)")
    q = math.exp(-epsilon)

    def tail(m: int) -> float:
        return math.exp(-epsilon * m) / (1.0 + q) if m >= 1 else 1.0 - math.exp(-epsilon * (1 - m)) / (1.0 + q)

    m = max(1, math.ceil(-(math.log(delta) + math.log1p(q)) / epsilon))
    while tail(m) > delta:
        m += 1
    while tail(m - 1) <= delta:
        m -= 1
    return 1 + m


def select_cells(df: pd.DataFrame, cells: list[str], *, epsilon: float, delta: float,
                 rng: np.random.Generator) -> CellDomain:
    """The stability-based histogram (module docstring): (epsilon, delta)-DP, add/remove. The
    noisy counts are used for the decision only and then discarded."""
    for col in cells:
        if col not in df.columns:
            raise ReleaseError(f"release.cells: column {col!r} is not in the data; allowed: a column of the table")
    tau = selection_threshold(epsilon, delta)
    per_col = [_label_column(df[c]) for c in cells]
    ok = np.ones(len(df), dtype=bool)
    for codes, _ in per_col:
        ok &= codes >= 0
    if len(cells) == 1:
        combo = per_col[0][0][ok]
        cell_codes, uniq = pd.factorize(combo)
        label_rows = [per_col[0][1][np.asarray(uniq, dtype=np.int64)]]
    else:
        frame = pd.DataFrame({c: per_col[i][0][ok] for i, c in enumerate(cells)})
        cell_codes, uniq = pd.MultiIndex.from_frame(frame).factorize()
        uniq_frame = uniq.to_frame(index=False)
        label_rows = [per_col[i][1][uniq_frame.iloc[:, i].to_numpy(dtype=np.int64)] for i in range(len(cells))]
    counts = np.bincount(cell_codes, minlength=len(label_rows[0])).astype(np.float64)
    noisy = add_noise(counts, 1.0 / epsilon, kind="laplace", rng=rng, step=1.0)
    keep = noisy >= tau
    del noisy, counts
    keys = pd.DataFrame({c: label_rows[i][keep] for i, c in enumerate(cells)}, dtype=object)
    keys = keys.sort_values(cells, kind="stable").reset_index(drop=True)
    info = {
        "mode": "private",
        "mechanism": "stability-based histogram: discrete Laplace noise of scale 1/epsilon on each observed "
                     "cell's row count; a cell is listed if its noisy count >= threshold; noisy counts discarded",
        "epsilon": float(epsilon),
        "delta": float(delta),
        "threshold": int(tau),
        "neighbours": "add_remove",
        "guarantee": f"the list of cells is ({epsilon:g}, {delta:g})-DP under add/remove-one-row neighbours: a cell "
                     f"with one row is listed with probability <= {delta:g}",
    }
    return CellDomain(keys=keys, public=keys.copy(), origin="private_selection",
                      description="selected privately from the rows (release.cell_selection=private, "
                                  f"epsilon {epsilon:g}, delta {delta:g}, threshold {tau})", selection=info)


def chi_group_labels(domain: CellDomain, chi_by: list[str]) -> np.ndarray | None:
    """The chi group of every listed cell, from PUBLIC columns of the cell list (never from rows,
    so a cell without rows has a group too). None when ``chi_by`` is empty."""
    if not chi_by:
        return None
    missing = [c for c in chi_by if c not in domain.public.columns]
    if missing:
        raise ReleaseError(f"release.chi_by={list(chi_by)!r}: {missing} is not a column of the cell list; allowed: "
                           f"columns of it {list(domain.public.columns)} (release.cells, extra columns of "
                           "release.cell_keys_file, or the simulator's design)")
    labels = domain.public[list(chi_by)].apply(lambda col: col.map(cell_label))
    return labels.astype(str).agg("|".join, axis=1).to_numpy()
