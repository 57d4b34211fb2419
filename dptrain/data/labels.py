"""Labels as a run compares them: a cell as its stripped string (1.0 -> "1"; None for missing), in
Unicode's composed form (NFC), looked up in a declared list of labels (numbers compare as numbers,
``data.label_map`` applied first). Vectorised: only a column's distinct values are converted.
The one definition for the schema's declared labels, the encoding, the split's key words, ``dptrain
check`` and a release's cells."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dptrain.data.files import DataError

_NESTED = (list, tuple, dict, set, frozenset, np.ndarray, Mapping)


def cell_label(v: Any) -> str | None:
    """A cell as the stripped string it is compared with (1.0 -> "1"); None for missing."""
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return None
        return str(int(f)) if f.is_integer() else repr(f)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, bytes):
        v = v.decode("utf-8", errors="replace")
    return str(v).strip()


def nfc(label: str | None) -> str | None:
    """A label in Unicode's composed form (NFC): 'Süd' typed or stored either way is one label."""
    return None if label is None else unicodedata.normalize("NFC", label)


def has_nested(col: pd.Series) -> bool:
    """Whether some cell is a container (a Parquet list/struct/map value), not a scalar label."""
    if col.dtype != object:
        return False
    return bool(col.map(lambda v: isinstance(v, _NESTED)).any())


def factorize(col: pd.Series) -> tuple[np.ndarray, Any]:
    """(codes, uniques) of a column, -1 for missing: a categorical column's own codes (no pass
    over the rows), else ``pd.factorize``."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(), col.cat.categories
    return pd.factorize(col, use_na_sentinel=True)


def label_lookup(col: pd.Series, labels: Sequence[str], *, lower: bool = False,
                 setting: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(codes, lookup): ``lookup[codes]`` is each cell's index in ``labels`` (-1 if absent or
    missing; :func:`label_codes`). Only the distinct values are converted to strings."""
    codes, lookup, _, _ = declared_lookup(col, labels, lower=lower, setting=setting)
    return codes, lookup


def declared_lookup(col: pd.Series, labels: Sequence[str], *, label_map: Mapping[str, str] | None = None,
                    lower: bool = False, setting: str | None = None) -> tuple[np.ndarray, ...]:
    """(codes, lookup, mapped, blank): as :func:`label_lookup`, each distinct cell compared as its
    stripped string in Unicode's composed form (NFC), after ``label_map`` (data.label_map: a file's
    label -> a declared one); ``mapped[codes]`` is True where the map changed a cell, ``blank[codes]``
    where the cell is missing or empty. Only the distinct values are converted to strings."""
    try:
        codes, uniques = factorize(col)
    except TypeError:  # unhashable cells: Parquet lists / structs / maps (no value is quoted)
        where = setting or f"column {col.name!r}"
        what = "nested entries (lists/structs/maps)" if has_nested(col) else "values that cannot be compared as labels"
        raise DataError(
            f"{where}: column {col.name!r} has {what}; allowed: one scalar label "
            "(text or number) per row"
        ) from None
    as_str = [nfc(cell_label(u)) for u in uniques]
    blank = np.array([s is None or s == "" for s in as_str] + [True])
    mapped = np.array([bool(label_map) and s in label_map for s in as_str] + [False])
    if label_map:
        as_str = [label_map.get(s, s) for s in as_str]
    if lower:
        as_str = [s.lower() if s is not None else None for s in as_str]
    lookup = pd.Index(list(labels), dtype=object).get_indexer(pd.Index(as_str, dtype=object))
    by_number: dict[float, int] = {}
    for i, label in enumerate(labels):  # declared '1.0' or 1 matches a stored 1.0: numbers compare as numbers
        number = as_number(label)
        if number is not None:
            by_number.setdefault(number, i)
    if by_number:
        for j, u in enumerate(uniques):
            if lookup[j] < 0 and isinstance(u, (int, float, np.integer, np.floating)) and not isinstance(
                    u, (bool, np.bool_)):
                lookup[j] = by_number.get(float(u), -1)
    lookup = np.append(np.asarray(lookup, dtype=np.int64), -1)  # code -1 (missing) -> last entry -> -1
    return codes, lookup, mapped, blank


def label_codes(col: pd.Series, labels: Sequence[str], *, lower: bool = False,
                setting: str | None = None) -> np.ndarray:
    """Index of each cell's stripped-string label in ``labels``; -1 if absent or missing.
    Vectorised: only the distinct values are converted to strings. ``lower``: compare the
    cells lower-cased (``labels`` must then be lower-case). A column of nested values (lists,
    structs) is refused with a DataError naming ``setting`` (no value, no count)."""
    codes, lookup = label_lookup(col, labels, lower=lower, setting=setting)
    return lookup[codes]


def as_number(label: Any) -> float | None:
    """A declared label as a finite number ('1', '1.0', ' 2 ', 3), or None for any other text."""
    try:
        number = float(str(label).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None
