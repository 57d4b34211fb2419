"""Reading tables and encoding them with the PUBLIC schema declared in the data config.

Nothing here is fitted on the rows (PRIVACY.md, "What leaks outside the accountant"):

* numeric column: clipped into the declared ``[lower, upper]`` (then ``log1p`` of value and
  bounds when ``transform: log1p``), scaled to ``[0, 1]`` by those bounds;
* categorical column: one-hot over the declared category list plus one ``<other>`` slot for
  every value not in the list, missing values included;
* target: 1 where the value (as a stripped string) equals ``data.positive``, else 0; with
  ``positive: null`` the column must already be numeric 0/1;
* train/test split: the ``split_column`` ("train"/"test") or a permutation drawn from the seed
  (it depends on the seed and the row count only).

Refused (DataError): empty / header-only files, non-UTF-8 CSV, CSV rows whose field count differs
from the header's (pandas would pad, truncate or shift them silently), duplicate column names,
missing declared columns, non-numeric / non-finite numeric entries, nested (list / struct)
labels, a target that is not binary or whose training rows are all in one class.

Error messages name the setting, the column and counts of rows; they never quote a value read
from the file (a headerless file's "column names" are row values, so those are not quoted
either).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import logging
import lzma
import math
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dptrain.config import ConfigError

log = logging.getLogger("dptrain.data")

OTHER = "<other>"  # name of the extra one-hot slot: feature "col=<other>"
FORMATS = ("csv", "parquet", "dta")
_CSV_COMPRESSION = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


class DataError(ValueError):
    """The data does not fit the declared schema, or cannot be read.

    The message names the setting / column, says what was found in counts of rows (never a
    value from the file) and what is allowed."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """Encoded features and 0/1 labels; all tensors float32 and contiguous."""

    x_train: torch.Tensor  # (N, d)
    y_train: torch.Tensor  # (N,)
    x_test: torch.Tensor  # (M, d)
    y_test: torch.Tensor  # (M,)
    feature_names: tuple[str, ...]
    source: str  # one line: what data, licence / attribution

    def __post_init__(self) -> None:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or not t.is_contiguous():
                raise TypeError(f"Dataset.{name} must be a contiguous float32 tensor")
        if self.x_train.dim() != 2 or self.x_test.dim() != 2 or self.y_train.dim() != 1 or self.y_test.dim() != 1:
            raise ValueError("Dataset: x_* must be 2-D (rows, features), y_* 1-D")
        if self.x_train.shape[0] != self.y_train.shape[0] or self.x_test.shape[0] != self.y_test.shape[0]:
            raise ValueError("Dataset: x and y row counts differ")
        d = len(self.feature_names)
        if self.x_train.shape[1] != d or self.x_test.shape[1] != d:
            raise ValueError("Dataset: feature_names does not match the feature width")

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.x_test.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])


# --------------------------------------------------------------------------------------------
# Schema (from DataConfig, a DictConfig of it, or a plain mapping)
# --------------------------------------------------------------------------------------------


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


@dataclass(frozen=True)
class NumericSpec:
    name: str
    lower: float
    upper: float
    transform: str = "none"


@dataclass(frozen=True)
class Schema:
    """The public schema, checked. Built by :func:`schema_from_config`."""

    target: str
    positive: str | None
    numeric: tuple[NumericSpec, ...]
    categorical: tuple[tuple[str, tuple[str, ...]], ...]
    split_column: str | None = None
    nonfinite: str = "error"
    test_fraction: float = 0.25

    @property
    def feature_columns(self) -> list[str]:
        return [s.name for s in self.numeric] + [c for c, _ in self.categorical]

    @property
    def columns(self) -> list[str]:
        cols = [self.target] + self.feature_columns
        return cols + ([self.split_column] if self.split_column else [])

    @property
    def feature_names(self) -> tuple[str, ...]:
        names = [s.name for s in self.numeric]
        for col, cats in self.categorical:
            names += [f"{col}={c}" for c in cats] + [f"{col}={OTHER}"]
        return tuple(names)


def _number(setting: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{setting}={value!r} is not allowed: must be a number")
    return float(value)


def numeric_spec(name: str, spec: Any) -> NumericSpec:
    """Normalise one ``data.numeric.<name>`` entry (NumericColumn, DictConfig or mapping)."""
    setting = f"data.numeric.{name}"
    if spec is None:
        raise ConfigError(f"{setting}=None is not allowed: give {{lower: ..., upper: ...}}")
    lo = _number(f"{setting}.lower", _get(spec, "lower", 0.0))
    hi = _number(f"{setting}.upper", _get(spec, "upper", 1.0))
    transform = _get(spec, "transform", "none") or "none"
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError(f"{setting}='[{lo}, {hi}]' is not allowed: bounds must be finite with lower < upper")
    if transform not in ("none", "log1p"):
        raise ConfigError(f"{setting}.transform={transform!r} is not allowed: must be none or log1p")
    if transform == "log1p" and lo <= -1:
        raise ConfigError(f"{setting}.lower={lo!r} is not allowed: log1p needs lower > -1")
    return NumericSpec(name, lo, hi, transform)


def schema_from_config(cfg: Any, *, numeric: Mapping[str, Any] | None = None) -> Schema:
    """Check the data config's schema part and return it normalised. Raises ConfigError."""
    target = _get(cfg, "target")
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(f"data.target={target!r} is not allowed: name the label column of the table")
    target = target.strip()
    positive = _get(cfg, "positive")
    if positive is not None:
        positive = str(positive).strip()
    nums = [numeric_spec(str(k).strip(), v) for k, v in (numeric if numeric is not None else (_get(cfg, "numeric") or {})).items()]
    cats: list[tuple[str, tuple[str, ...]]] = []
    for col, lst in (_get(cfg, "categorical") or {}).items():
        col = str(col).strip()
        setting = f"data.categorical.{col}"
        if lst is None or isinstance(lst, (str, bytes, Mapping)) or not hasattr(lst, "__iter__"):
            raise ConfigError(f"{setting}={lst!r} is not allowed: must be a list of category labels")
        items = tuple(_label(c) for c in lst)
        if len(items) == 0:
            raise ConfigError(f"{setting}=[] is not allowed: a category list must not be empty")
        if any(c is None for c in items):
            raise ConfigError(f"{setting} is not allowed: a category label is null (missing values go to the other slot)")
        if len(set(items)) != len(items):
            raise ConfigError(f"{setting} is not allowed: the list has {len(items) - len(set(items))} duplicate label(s) (compared as stripped strings)")
        cats.append((col, items))
    if not nums and not cats:
        raise ConfigError("data.numeric/data.categorical='{}' is not allowed: declare at least one feature column")
    seen: dict[str, str] = {}
    for setting, col in [(f"data.numeric.{s.name}", s.name) for s in nums] + [(f"data.categorical.{c}", c) for c, _ in cats]:
        if col in seen:
            raise ConfigError(f"{setting} is not allowed: column {col!r} is also declared as {seen[col]}")
        if col == target:
            raise ConfigError(f"{setting} is not allowed: column {col!r} is the target (data.target); a label cannot be a feature")
        seen[col] = setting
    split = _get(cfg, "split_column")
    split = str(split).strip() if split is not None and str(split).strip() else None
    if split is not None and (split in seen or split == target):
        raise ConfigError(f"data.split_column={split!r} is not allowed: it is also the target or a feature column")
    nonfinite = _get(cfg, "nonfinite", "error")
    if nonfinite not in ("error", "drop"):
        raise ConfigError(f"data.nonfinite={nonfinite!r} is not allowed: must be one of error, drop")
    frac = _get(cfg, "test_fraction", 0.25)
    if split is None and not (isinstance(frac, (int, float)) and 0 < frac < 1):
        raise ConfigError(f"data.test_fraction={frac!r} is not allowed: must be in (0, 1)")
    return Schema(target, positive, tuple(nums), tuple(cats), split, nonfinite, float(frac))


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def detect_format(path: str | Path, fmt: str = "auto") -> str:
    """``csv`` / ``parquet`` / ``dta`` from ``fmt`` or, for ``auto``, from the file suffix."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ConfigError(f"data.format={fmt!r} is not allowed: must be one of auto, {', '.join(FORMATS)}")
        return fmt
    name = Path(path).name.lower()
    if name.endswith(".csv") or any(name.endswith(".csv" + s) for s in _CSV_COMPRESSION):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".dta"):
        return "dta"
    raise DataError(
        f"data.path={str(path)!r}: cannot tell the format from the file name; allowed suffixes: "
        ".csv, .csv.gz, .csv.bz2, .csv.xz, .parquet, .pq, .dta (or set data.format=csv|parquet|dta)"
    )


def _open_binary(p: Path):
    for suffix, opener in _CSV_COMPRESSION.items():
        if p.name.lower().endswith(suffix):
            return opener(p, "rb")
    return open(p, "rb")


def _count_non_utf8_lines(p: Path) -> tuple[int, int]:
    bad = total = 0
    with _open_binary(p) as f:
        for line in f:
            total += 1
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                bad += 1
    return bad, total


def _non_utf8(p: Path) -> DataError:
    try:
        bad, total = _count_non_utf8_lines(p)
        what = f"{bad} of {total} lines contain bytes that are not valid UTF-8"
    except Exception:  # noqa: BLE001 - the count is a courtesy
        what = "it contains bytes that are not valid UTF-8"
    return DataError(
        f"data.path={str(p)!r}: {what}; allowed: UTF-8 text. Re-save the file as UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8, or pandas to_csv(..., encoding='utf-8'))"
    )


def _unreadable(p: Path, fmt: str, exc: BaseException) -> DataError:
    # The exception text is not quoted: parsers may echo a piece of a row.
    m = re.search(r"line (\d+)", str(exc)) if isinstance(exc, pd.errors.ParserError) else None
    where = f" (parser error near line {m.group(1)})" if m else ""
    return DataError(
        f"data.path={str(p)!r}: could not be read as {fmt} ({type(exc).__name__}){where}; "
        f"allowed: a valid CSV, Parquet or Stata .dta file (data.format={fmt} was used)"
    )


def _check_duplicates(p: Path, names: Sequence[str]) -> None:
    stripped = [n.strip() for n in names if n.strip()]
    n_dup = len(stripped) - len(set(stripped))
    if n_dup:
        raise DataError(
            f"data.path={str(p)!r}: the header has {n_dup} duplicate column name(s) (after "
            "stripping spaces); allowed: unique column names"
        )


class _BigFields:
    """Lift the csv module's per-field size limit (128 KiB by default; pandas has none) while
    scanning, so a long text cell is not mistaken for a broken file."""

    def __enter__(self) -> None:
        self.old = csv.field_size_limit()
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

    def __exit__(self, *exc: object) -> None:
        csv.field_size_limit(self.old)


def _is_blank(row: Sequence[str]) -> bool:
    return not any(cell.strip() for cell in row)


def _csv_scan(p: Path) -> tuple[list[str], int, int, int]:
    """The header and the shape of the data rows, in one streaming pass with the csv module:
    ``(header, data rows, ragged rows, line of the first ragged row)``. A ragged row has more or
    fewer fields than the header; pandas would silently pad it with NaN, drop its extra fields
    (with ``usecols``) or, when every row has one extra field, shift all columns by turning the
    first one into the index. Blank lines are skipped, as pandas does."""
    try:
        with _BigFields(), _open_binary(p) as fb:
            f = io.TextIOWrapper(fb, encoding="utf-8-sig", newline="")
            reader = csv.reader(f)
            header = None
            for row in reader:
                if not _is_blank(row):
                    header = row
                    break
            if header is None:
                raise DataError(f"data.path={str(p)!r}: the file is empty (no header line, 0 rows); "
                                "allowed: a header line and at least one row")
            width = len(header)
            counts = Counter(map(len, reader))
            n_rows = sum(c for k, c in counts.items() if k > 0)
            if all(k in (0, width) for k in counts):
                return header, n_rows, 0, 0
        # second pass only for a broken file: exact count (whitespace-only lines are blank) and
        # where the first bad row is
        with _BigFields(), _open_binary(p) as fb:
            reader = csv.reader(io.TextIOWrapper(fb, encoding="utf-8-sig", newline=""))
            seen_header, n_rows, bad, first = False, 0, 0, 0
            for row in reader:
                if _is_blank(row):
                    continue
                if not seen_header:
                    seen_header = True
                    continue
                n_rows += 1
                if len(row) != width:
                    bad += 1
                    first = first or reader.line_num
            return header, n_rows, bad, first
    except UnicodeDecodeError:
        raise _non_utf8(p) from None
    except (OSError, EOFError, csv.Error) as exc:
        raise _unreadable(p, "csv", exc) from None


def _csv_header(p: Path) -> list[str]:
    """The header of a CSV file; refuses an empty file and rows whose field count differs from
    the header's (counts and a line number only, never a value)."""
    header, n_rows, bad, first = _csv_scan(p)
    if bad:
        raise DataError(
            f"data.path={str(p)!r}: {bad} of {n_rows} data rows have a different number of fields than "
            f"the header ({len(header)} columns; the first such row ends on line {first}); allowed: "
            f"exactly {len(header)} comma-separated fields in every row (quote fields that contain commas "
            "or line breaks, and close every quote)"
        )
    return header


def read_table(path: str | Path, *, fmt: str = "auto", columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``/``.bz2``/``.xz``), Parquet (``.parquet``, ``.pq``) or
    Stata (``.dta``) file. ``fmt``: ``auto`` (by suffix), ``csv``, ``parquet`` or ``dta``.

    Column names are stripped of surrounding spaces; duplicate names are refused. ``columns``
    (optional) reads only those columns (faster for wide files); names not in the file are
    skipped silently, the caller checks. Raises :class:`DataError` (missing file, empty file,
    unreadable, non-UTF-8 CSV, ragged CSV rows, duplicate names) or ConfigError (bad ``fmt``)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data.path={str(path)!r}: no such file; allowed: an existing CSV, Parquet or .dta file")
    if p.is_dir():
        raise DataError(f"data.path={str(path)!r}: is a folder; allowed: a CSV, Parquet or .dta file")
    kind = detect_format(p, fmt)
    if p.stat().st_size == 0:
        raise DataError(f"data.path={str(path)!r}: the file is empty (0 bytes, 0 rows); allowed: a header and at least one row")
    wanted = None if columns is None else {str(c).strip() for c in columns}
    if kind == "csv":
        header = _csv_header(p)
        _check_duplicates(p, header)
        usecols = None if wanted is None else (lambda c: str(c).strip() in wanted)
        try:
            df = pd.read_csv(p, encoding="utf-8", usecols=usecols, low_memory=False)
        except UnicodeDecodeError:
            raise _non_utf8(p) from None
        except pd.errors.EmptyDataError:
            raise DataError(f"data.path={str(path)!r}: the file is empty (no header line, 0 rows); allowed: a header line and at least one row") from None
        except Exception as exc:  # noqa: BLE001
            raise _unreadable(p, kind, exc) from None
    elif kind == "parquet":
        try:
            import pyarrow.parquet as pq

            names = pq.read_schema(p).names
            _check_duplicates(p, names)
            cols = None if wanted is None else [n for n in names if n.strip() in wanted]
            df = pd.read_parquet(p, columns=cols)
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _unreadable(p, kind, exc) from None
    else:
        try:
            df = pd.read_stata(p)
        except Exception as exc:  # noqa: BLE001
            raise _unreadable(p, kind, exc) from None
        _check_duplicates(p, [str(c) for c in df.columns])
    df.columns = [str(c).strip() for c in df.columns]
    _check_duplicates(p, list(df.columns))
    if wanted is not None:
        df = df[[c for c in df.columns if c in wanted]]
    return df


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _label(v: Any) -> str | None:
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


_NESTED = (list, tuple, dict, set, frozenset, np.ndarray, Mapping)


def _nested_entries(col: pd.Series) -> int:
    """Rows whose cell is a container (a Parquet list/struct/map value), not a scalar label."""
    if col.dtype != object:
        return 0
    return int(col.map(lambda v: isinstance(v, _NESTED)).sum())


def label_codes(col: pd.Series, labels: Sequence[str], *, lower: bool = False,
                setting: str | None = None) -> np.ndarray:
    """Index of each cell's stripped-string label in ``labels``; -1 if absent or missing.
    Vectorised: only the distinct values are converted to strings. ``lower``: compare the
    cells lower-cased (``labels`` must then be lower-case). A column of nested values (lists,
    structs) is refused with a DataError naming ``setting`` and the count of such rows."""
    try:
        codes, uniques = pd.factorize(col, use_na_sentinel=True)
    except TypeError:  # unhashable cells: Parquet lists / structs / maps (no value is quoted)
        where = setting or f"column {col.name!r}"
        n_nested = _nested_entries(col)
        what = f"{n_nested} nested entries (lists/structs/maps)" if n_nested else "values that cannot be compared as labels"
        raise DataError(
            f"{where}: column {col.name!r} has {what} of {len(col)} rows; allowed: one scalar label "
            "(text or number) per row"
        ) from None
    if len(uniques) == 0:
        return np.full(len(col), -1, dtype=np.int64)
    as_str = [_label(u) for u in uniques]
    if lower:
        as_str = [s.lower() if s is not None else None for s in as_str]
    lookup = pd.Index(list(labels), dtype=object).get_indexer(pd.Index(as_str, dtype=object))
    lookup = np.append(lookup, -1)  # code -1 (missing) -> last entry -> -1
    return lookup[codes].astype(np.int64)


def numeric_values(col: pd.Series, setting: str) -> np.ndarray:
    """The column as float64 (NaN for missing). Non-numeric entries -> DataError (counts only)."""
    name, n = col.name, len(col)
    if pd.api.types.is_bool_dtype(col.dtype) or (
        pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_complex_dtype(col.dtype)
    ):
        return col.to_numpy(dtype=np.float64, na_value=np.nan)
    if pd.api.types.is_datetime64_any_dtype(col.dtype) or pd.api.types.is_timedelta64_dtype(col.dtype):
        raise DataError(f"{setting}: column {name!r} holds dates/times ({n} rows), not numbers; allowed: numeric values")
    obj = col.astype(object)
    num = pd.to_numeric(obj, errors="coerce")
    bad = int((num.isna() & obj.notna()).sum())
    if bad:
        raise DataError(
            f"{setting}: column {name!r} has {bad} non-numeric entries of {n} rows; allowed: numbers "
            "(declare the column under data.categorical if it holds labels)"
        )
    return pd.Series(num).to_numpy(dtype=np.float64, na_value=np.nan)


def _scale(v: np.ndarray, spec: NumericSpec) -> np.ndarray:
    lo, hi = spec.lower, spec.upper
    v = np.clip(v, lo, hi)
    if spec.transform == "log1p":
        v, lo, hi = np.log1p(v), math.log1p(lo), math.log1p(hi)
    return (v - lo) / (hi - lo)


def _target(col: pd.Series, schema: Schema, rows: np.ndarray) -> np.ndarray:
    n = len(rows)
    setting = f"data.target={schema.target!r}"
    if schema.positive is not None:
        y = (label_codes(col, [schema.positive], setting=setting) == 0)[rows]
        if not y.any():
            raise DataError(
                f"data.positive={schema.positive!r}: no row of column {schema.target!r} ({n} rows) has "
                "this label; allowed: the exact label of the positive class (compared as stripped "
                "strings, case-sensitive)"
            )
        return y.astype(np.float32)
    v = numeric_values(col.iloc[rows], f"{setting} (data.positive=null)")
    missing = int(np.isnan(v).sum())
    if missing:
        raise DataError(
            f"{setting}: column {schema.target!r} has {missing} missing entries of {n} rows; allowed "
            "with data.positive=null: 0 or 1 in every row (or set data.positive to the positive label)"
        )
    other = int(((v != 0) & (v != 1)).sum())
    if other:
        raise DataError(
            f"{setting}: column {schema.target!r} has {other} entries of {n} rows that are not 0 or 1; "
            "allowed with data.positive=null: numeric 0/1 (or set data.positive to the positive label)"
        )
    return v.astype(np.float32)


def _check_two_classes(y_train: np.ndarray, schema: Schema) -> None:
    """Refuse a target whose training rows are all in one class: no classifier can be fitted
    (the non-private baseline would crash) and test AUC is meaningless. Counts only."""
    nt, pos = len(y_train), int(y_train.sum())
    if 0 < pos < nt:
        return
    rule = (f"label 1 where it equals data.positive={schema.positive!r}" if schema.positive is not None
            else "data.positive=null: numeric 0/1")
    raise DataError(
        f"data.target={schema.target!r}: all {nt} training rows are in one class ({pos} positive, "
        f"{nt - pos} negative; {rule}); allowed: a binary target with both classes among the training "
        "rows (check data.target, data.positive and data.split_column)"
    )


def _split(df: pd.DataFrame, schema: Schema, keep: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (into df) of the train and test parts, each ascending."""
    idx = np.flatnonzero(keep)
    n = len(idx)
    if schema.split_column is not None:
        col = schema.split_column
        codes = label_codes(df[col], ["train", "test"], lower=True, setting=f"data.split_column={col!r}")[idx]
        bad = int((codes < 0).sum())
        if bad:
            raise DataError(
                f"data.split_column={col!r}: {bad} entries of {n} rows are neither 'train' nor 'test' "
                "(or are missing); allowed: train / test in every row"
            )
        train, test = idx[codes == 0], idx[codes == 1]
        for part, rows in (("train", train), ("test", test)):
            if len(rows) == 0:
                raise DataError(f"data.split_column={col!r}: 0 '{part}' rows of {n}; allowed: at least one train and one test row")
        return train, test
    if n < 2:
        raise DataError(f"the data has {n} row(s); a random train/test split needs at least 2")
    n_test = min(max(round(schema.test_fraction * n), 1), n - 1)
    is_test = np.zeros(n, dtype=bool)
    is_test[split_rng(seed).permutation(n)[:n_test]] = True
    return idx[~is_test], idx[is_test]


def split_rng(seed: int) -> np.random.Generator:
    """The generator of the seeded train/test split (depends on the seed only)."""
    return np.random.default_rng([_seed(seed), 2])


def _seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed={seed!r} is not allowed: must be an integer >= 0")
    return int(seed)


def encode_features(df: pd.DataFrame, schema: Schema, rows: np.ndarray | None = None,
                    numeric: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Encode ``df`` (rows ``rows``, default all) with the public schema -> float32 (n, d).

    Numeric columns must be finite here (``numeric`` may pass pre-parsed float64 columns)."""
    if rows is None:
        rows = np.arange(len(df))
    n = len(rows)
    x = np.zeros((n, len(schema.feature_names)), dtype=np.float32)
    j = 0
    for spec in schema.numeric:
        v = numeric[spec.name] if numeric is not None else numeric_values(df[spec.name], f"data.numeric.{spec.name}")
        x[:, j] = _scale(v[rows], spec)
        j += 1
    ar = np.arange(n)
    for col, cats in schema.categorical:
        if len(cats) == 0:
            raise ConfigError(f"data.categorical.{col}=[] is not allowed: a category list must not be empty")
        codes = label_codes(df[col], cats, setting=f"data.categorical.{col}")[rows]
        codes[codes < 0] = len(cats)  # the other slot
        x[ar, j + codes] = 1.0
        j += len(cats) + 1
    return x


def build_dataset(df: pd.DataFrame, schema: Schema, *, seed: int, source: str, origin: str) -> Dataset:
    """Check ``df`` against the schema, encode, split. ``origin`` names the data in messages
    (e.g. ``data.path='x.csv'``)."""
    seed = _seed(seed)
    missing = [
        (setting, col)
        for setting, col in [("data.target", schema.target)]
        + [(f"data.numeric.{s.name}", s.name) for s in schema.numeric]
        + [(f"data.categorical.{c}", c) for c, _ in schema.categorical]
        + ([("data.split_column", schema.split_column)] if schema.split_column else [])
        if col not in df.columns
    ]
    if missing:
        setting, col = missing[0]
        more = f" ({len(missing) - 1} more declared column(s) are missing too)" if len(missing) > 1 else ""
        raise DataError(
            f"{setting}: column {col!r} is not in {origin} ({len(df)} rows){more}; allowed: a column of "
            "the file (names compared after stripping spaces, case-sensitive)"
        )
    n = len(df)
    if n == 0:
        raise DataError(f"{origin} has 0 rows (header only); allowed: at least one row")
    nums: dict[str, np.ndarray] = {}
    bad_rows = np.zeros(n, dtype=bool)
    per_col = []
    for spec in schema.numeric:
        v = numeric_values(df[spec.name], f"data.numeric.{spec.name}")
        nonfin = ~np.isfinite(v)
        k = int(nonfin.sum())
        if k:
            if schema.nonfinite == "error":
                n_nan = int(np.isnan(v).sum())
                raise DataError(
                    f"data.numeric.{spec.name}: column {spec.name!r} has {k} non-finite entries of {n} rows "
                    f"({n_nan} missing/NaN, {k - n_nan} infinite); allowed with data.nonfinite=error: finite "
                    "numbers (set data.nonfinite=drop to drop those rows)"
                )
            bad_rows |= nonfin
            per_col.append(f"{spec.name}: {k}")
        nums[spec.name] = v
    keep = ~bad_rows
    n_drop = int(bad_rows.sum())
    if n_drop:
        log.warning("data.nonfinite=drop: dropped %d of %d rows with NaN/inf in numeric columns (%s)",
                    n_drop, n, ", ".join(per_col))
        if n_drop == n:
            raise DataError(f"{origin}: all {n} rows have NaN/inf in a numeric column and were dropped (data.nonfinite=drop); 0 rows left")
    train, test = _split(df, schema, keep, seed)
    rows = np.concatenate([train, test])
    y = _target(df[schema.target], schema, rows)
    x = encode_features(df, schema, rows, nums)
    nt = len(train)
    _check_two_classes(y[:nt], schema)
    return Dataset(
        x_train=torch.from_numpy(x[:nt]),
        y_train=torch.from_numpy(np.ascontiguousarray(y[:nt])),
        x_test=torch.from_numpy(x[nt:]),
        y_test=torch.from_numpy(np.ascontiguousarray(y[nt:])),
        feature_names=schema.feature_names,
        source=source,
    )
