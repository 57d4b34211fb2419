"""Reading tables and encoding them with the PUBLIC schema declared in the data config.

Nothing here is fitted on the rows (docs/privacy.md):

* numeric column: clipped into the declared ``[lower, upper]`` (then ``log1p`` of value and
  bounds when ``transform: log1p``), scaled to ``[0, 1]`` by those bounds;
* categorical column: one-hot over the declared category list plus one ``<other>`` slot for
  every value not in the list, missing values included (``data.unlisted=drop``: such rows are
  left out instead);
* target: 1 where the value equals ``data.positive``, 0 where it equals ``data.negative`` (both
  declared); with neither, the column holds 0/1; with ``data.classes`` (a multiclass target)
  the index of the value in that PUBLIC list (int64); with ``data.target_bounds`` (a
  continuous target) the value clipped into the PUBLIC ``[lower, upper]`` and scaled to
  ``[0, 1]`` by them. A row whose target is not a declared label (a missing one included) is
  left out and counted, never read as a negative; ``data.label_map`` maps a file's label to a
  declared one first. Labels compare as stripped strings in Unicode's composed form (NFC);
* train/test split: the ``split_column`` ("train"/"test"), or else a per-row hash split
  (:func:`split_scores`) that no single row can move.

The hash split (neighbour invariance: adding or removing one row changes nothing else). Each
kept row gets ``u = H_salt(row) in [0, 1)`` and goes to the test part iff
``u < data.test_fraction``. ``H`` is a
keyed 64-bit hash of the row's content in the split's key columns: ``data.split_key`` (e.g. an
id column) or, by default, every column of the file (the whole raw row, read even where the model
uses fewer columns), so models with different feature sets are compared on the same rows; each
cell as its stripped string (missing values as one marker). The salt is
derived from the run's ``seed`` (public: the same seed gives the same split, another seed another
split). A row's side depends on that row alone, so adding or removing a row (anywhere in the
file, or through ``data.nonfinite=drop``) moves no other row; identical rows share a side. The
test part is about ``test_fraction`` of the rows, not exactly (its size is itself a private
count and is never logged); with few distinct rows (e.g. only a few categorical columns) whole
groups of identical rows share a side: declare a ``split_column`` then. The permutation split
used before moved hundreds of rows of a 1,000-row table when one row was added.

Rows outside the declared domain are handled by declared rules, each row on its own, and counted
(:mod:`dptrain.data.rules`; private/data_diagnostics.json and one console line for the data
holder): nothing about what one row holds is refused (docs/data.md), except with
``data.nonfinite=error``, the user's choice. Refused (DataError) before any row is used:
a missing, empty or header-only file, non-UTF-8 CSV, CSV rows whose field count differs from the
header's (pandas would pad, truncate or shift them silently), duplicate column names, missing
declared columns, nested (list / struct) labels, dates in a numeric column; after the rows are
read, only a read that leaves no training row (:data:`NO_TRAINING_ROWS`).

Large tables: the rows are encoded in blocks straight into preallocated train and test matrices,
and the split's hash runs in place by blocks (:mod:`dptrain.data.blocks`); a numeric column is
read where pandas holds it, widened to float64 one block at a time. The results are those of the
whole-array computation, bit for bit (docs/large_tables.md).

Error messages and log lines name the setting and the column, say what was found in words and
what is allowed. They quote no value read from the file (a headerless file's "column names" are
row values, so those are not quoted either). Counts of rows or entries (left out, lumped, clipped,
per split side) change when one row is added or removed, so they are private: they are in
private/data_diagnostics.json and in ONE console line marked PRIVATE for the data holder (a
user's table), never in an error or a publishable file. The size N of the training set is public
(the accountant's q = B/N uses it), and so is the number of columns in the header.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import logging
import lzma
import math
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError, closest
from dptrain.data.blocks import HashKeys, hash_scores, keyed_word, map_blocks, row_blocks, take
from dptrain.data.rules import CHECK_HINT, RowCounts, counts_line, number_shapes, parse_numbers, shape_setting
from dptrain.data.schema import (  # noqa: F401 - the schema's names, as before from this module
    OTHER,
    NumericSpec,
    Schema,
    _get,
    _label,
    _nfc,
    numeric_spec,
    schema_from_config,
)
from dptrain.models.objectives import DataSpec

log = logging.getLogger("dptrain.data")

FORMATS = ("csv", "parquet", "dta")
_CSV_COMPRESSION = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


class DataError(DPTrainError):
    """The data does not fit the declared schema, or cannot be read.

    The message names the setting / column, says what was found in words (never a value from
    the file, never a count of rows or entries: those are private) and what is allowed."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """Encoded features and labels; all tensors contiguous, float32 except the labels of a
    multiclass target (int64 indices into ``class_names``). A continuous target is scaled to
    [0, 1] by its public ``target_bounds``."""

    x_train: torch.Tensor  # (N, d)
    y_train: torch.Tensor  # (N,)
    x_test: torch.Tensor  # (M, d)
    y_test: torch.Tensor  # (M,)
    feature_names: tuple[str, ...]
    source: str  # one line: what data, licence / attribution
    # PRIVATE facts about the rows (e.g. how many values were clipped into the declared bounds, per
    # column): written only to private/data_diagnostics.json (dptrain.data.write_data_diagnostics)
    diagnostics: dict = field(default_factory=dict)
    target_kind: str = "binary"  # binary | multiclass | continuous (dptrain.models.objectives.TARGET_KINDS)
    class_names: tuple[str, ...] = ()  # multiclass: the declared classes, in label-index order
    target_bounds: tuple[float, float] | None = None  # continuous: the declared public (lower, upper)
    # A sharded read (dptrain.data.shards: trainer.distributed=true on a partitioned Parquet data
    # set): (rank, world size) when the tensors hold only THIS rank's rows, else None; then
    # global_n_train / global_n_test are the job-wide counts (the sum over the ranks' shards).
    shard: tuple[int, int] | None = None
    global_n_train: int | None = None
    global_n_test: int | None = None

    def __post_init__(self) -> None:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            t = getattr(self, name)
            dtype = torch.int64 if name.startswith("y") and self.target_kind == "multiclass" else torch.float32
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or not t.is_contiguous():
                raise TypeError(f"Dataset.{name} must be a contiguous {str(dtype).split('.')[1]} tensor")
        if self.x_train.dim() != 2 or self.x_test.dim() != 2 or self.y_train.dim() != 1 or self.y_test.dim() != 1:
            raise ValueError("Dataset: x_* must be 2-D (rows, features), y_* 1-D")
        if self.x_train.shape[0] != self.y_train.shape[0] or self.x_test.shape[0] != self.y_test.shape[0]:
            raise ValueError("Dataset: x and y row counts differ")
        d = len(self.feature_names)
        if self.x_train.shape[1] != d or self.x_test.shape[1] != d:
            raise ValueError("Dataset: feature_names does not match the feature width")

    @property
    def n_train(self) -> int:
        """N, the job's number of training rows (the mechanism's q = B/N): on a sharded read the
        sum over every rank's shard, not this rank's ``x_train`` rows."""
        return int(self.x_train.shape[0]) if self.global_n_train is None else int(self.global_n_train)

    @property
    def n_test(self) -> int:
        """The job's number of test rows (on a sharded read: over every rank's shard)."""
        return int(self.x_test.shape[0]) if self.global_n_test is None else int(self.global_n_test)

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def spec(self):
        """The data's description for the objective and the model: feature width, target kind,
        the declared classes or target bounds."""
        return DataSpec(n_features=self.n_features, target_kind=self.target_kind,
                        class_names=tuple(self.class_names), target_bounds=self.target_bounds)


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


def _non_utf8(p: Path) -> DataError:
    # no count of bad lines and no line number: both change with one row (private)
    return DataError(
        f"data.path={str(p)!r}: it contains bytes that are not valid UTF-8; allowed: UTF-8 text. "
        "Re-save the file as UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8, or pandas to_csv(..., encoding='utf-8'))"
    )


def _unreadable(p: Path, fmt: str, exc: BaseException) -> DataError:
    # The exception text is not quoted: parsers may echo a piece of a row, and its line number
    # is a private fact too.
    return DataError(
        f"data.path={str(p)!r}: could not be read as {fmt} ({type(exc).__name__}); "
        f"allowed: a valid CSV, Parquet or Stata .dta file (data.format={fmt} was used)"
    )


def _check_duplicates(p: Path, names: Sequence[str]) -> None:
    stripped = [n.strip() for n in names if n.strip()]
    if len(stripped) != len(set(stripped)):  # no count: a headerless file's "names" are row values
        raise DataError(
            f"data.path={str(p)!r}: the header has duplicate column names (after "
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


def _csv_scan(p: Path, delimiter: str = ",") -> tuple[list[str], bool]:
    """The header and whether any data row is ragged, in one streaming pass with the csv
    module. A ragged row has more or fewer fields than the header; pandas would silently pad it
    with NaN, drop its extra fields (with ``usecols``) or, when every row has one extra field,
    shift all columns by turning the first one into the index. Blank lines are skipped, as
    pandas does."""
    try:
        with _BigFields(), _open_binary(p) as fb:
            f = io.TextIOWrapper(fb, encoding="utf-8-sig", newline="")
            reader = csv.reader(f, delimiter=delimiter)
            header = None
            for row in reader:
                if not _is_blank(row):
                    header = row
                    break
            if header is None:
                raise DataError(f"data.path={str(p)!r}: the file is empty (no header line, 0 rows); "
                                "allowed: a header line and at least one row")
            width = len(header)
            if all(len(row) in (0, width) for row in reader):
                return header, False
        # second pass only for a suspect file: whitespace-only lines are blank, not ragged
        with _BigFields(), _open_binary(p) as fb:
            reader = csv.reader(io.TextIOWrapper(fb, encoding="utf-8-sig", newline=""), delimiter=delimiter)
            rows = (row for row in reader if not _is_blank(row))
            next(rows, None)  # the header
            return header, any(len(row) != width for row in rows)
    except UnicodeDecodeError:
        raise _non_utf8(p) from None
    except (OSError, EOFError, csv.Error) as exc:
        raise _unreadable(p, "csv", exc) from None


def _csv_header(p: Path, delimiter: str = ",", wanted: set[str] | None = None) -> list[str]:
    """The header of a CSV file; refuses an empty file and rows whose field count differs from
    the header's (no value, no count of rows, no line number: those are private). A header that
    reads as one column holding another usual separator (and not the columns asked for) is a
    file written with that separator: the message says to set ``data.delimiter``."""
    header, ragged = _csv_scan(p, delimiter)
    if len(header) == 1 and (wanted is None or not wanted <= {header[0].strip()}):
        for sep, shown in ((";", "';'"), ("\t", "'\\t' (tab)"), ("|", "'|'"), (",", "','")):
            if sep != delimiter and sep in header[0]:
                raise DataError(
                    f"data.delimiter={delimiter!r}: the header of data.path={str(p)!r} reads as one column, "
                    f"and it contains {shown}: the file's fields are separated by {shown}; allowed: set "
                    f"data.delimiter={shown.split(' ')[0]} (the file's separator)")
    if ragged:
        fields = "comma-separated fields" if delimiter == "," else f"fields separated by data.delimiter={delimiter!r}"
        raise DataError(
            f"data.path={str(p)!r}: some data rows have a different number of fields than the header "
            f"({len(header)} columns); allowed: exactly {len(header)} {fields} in every row (quote fields "
            "that contain the separator or line breaks, and close every quote)"
        )
    return header


def delimiter_char(value: Any) -> str:
    """``data.delimiter`` as the one character that separates CSV fields (``\\t`` and ``tab``
    written on a command line mean a tab). Raises ConfigError."""
    if value in ("\\t", "tab"):
        return "\t"
    if not (isinstance(value, str) and len(value) == 1 and value not in "\"'\r\n "):
        raise ConfigError(f"data.delimiter={value!r} is not allowed: must be one character other than a quote, a "
                          "line break or a space, e.g. ',' (the default), ';', '|' or '\\t' (tab)")
    return value


def _read_csv(p: Path, delimiter: str, wanted: set[str] | None,
              text: set[str] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """(the CSV's rows in the ``wanted`` columns, every column name of its header); the ``text``
    columns are read as text (numbers written with declared separators: the encoding parses them).
    A byte order mark before the header is skipped."""
    header = _csv_header(p, delimiter, wanted)
    _check_duplicates(p, header)
    usecols = None if wanted is None else (lambda c: str(c).strip() in wanted)
    dtype = {name: str for name in header if name.strip() in text} if text else None
    try:
        df = pd.read_csv(p, encoding="utf-8-sig", usecols=usecols, low_memory=False, sep=delimiter, dtype=dtype)
    except UnicodeDecodeError:
        raise _non_utf8(p) from None
    except pd.errors.EmptyDataError:
        raise DataError(f"data.path={str(p)!r}: the file is empty (no header line, 0 rows); "
                        "allowed: a header line and at least one row") from None
    except Exception as exc:  # noqa: BLE001
        raise _unreadable(p, "csv", exc) from None
    return df, header


def check_file(path: str | Path) -> Path:
    """``path`` as a Path; DataError when it does not exist or is a folder."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data.path={str(path)!r}: no such file; allowed: an existing CSV, Parquet or .dta file")
    if p.is_dir():
        raise DataError(f"data.path={str(path)!r}: is a folder; allowed: a CSV, Parquet or .dta file")
    return p


def read_table(path: str | Path, *, fmt: str = "auto", columns: Sequence[str] | None = None,
               delimiter: str = ",", text_columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``/``.bz2``/``.xz``), Parquet (``.parquet``, ``.pq``) or
    Stata (``.dta``) file. ``fmt``: ``auto`` (by suffix), ``csv``, ``parquet`` or ``dta``.

    Column names are stripped of surrounding spaces; duplicate names are refused. ``columns``
    (optional) reads only those columns (faster for wide files); names not in the file are
    skipped silently, the caller checks; ``df.attrs["file_columns"]`` keeps every column name of
    the file (for the caller's messages). ``delimiter``: the CSV field separator
    (``data.delimiter``); ``text_columns``: CSV columns read as text, not as numbers (numbers
    written with data.thousands / data.decimal). Raises :class:`DataError` (missing file, empty file, unreadable,
    non-UTF-8 CSV, ragged CSV rows, one-column header holding another separator, duplicate
    names) or ConfigError (bad ``fmt`` or ``delimiter``)."""
    p = check_file(path)
    kind = detect_format(p, fmt)
    if p.stat().st_size == 0:
        raise DataError(f"data.path={str(path)!r}: the file is empty (0 bytes, 0 rows); "
                        "allowed: a header and at least one row")
    wanted = None if columns is None else {str(c).strip() for c in columns}
    file_columns: list[str] | None = None
    if kind == "csv":
        df, file_columns = _read_csv(p, delimiter_char(delimiter), wanted,
                                     None if text_columns is None else {str(c).strip() for c in text_columns})
    elif kind == "parquet":
        try:
            import pyarrow.parquet as pq

            names = pq.read_schema(p).names
            _check_duplicates(p, names)
            file_columns = list(names)
            cols = None if wanted is None else [n for n in names if n.strip() in wanted]
            # pyarrow's own conversion, freeing each Arrow column as it is converted (peak memory:
            # about one copy of the columns read, not two); the same frame as pd.read_parquet
            df = pq.read_table(p, columns=cols).to_pandas(split_blocks=True, self_destruct=True)
            release_arrow_memory()  # the file's compressed pages and the decoding's scratch
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
    file_columns = [str(c).strip() for c in (file_columns if file_columns is not None else df.columns)]
    if wanted is not None:
        df = df[[c for c in df.columns if c in wanted]]
    df.attrs["file_columns"] = file_columns
    return df


def release_arrow_memory() -> None:
    """Hand the memory Arrow's allocator kept after a Parquet read back to the operating system
    (the frame's columns lived in Arrow buffers; freed, they stay in the pool for a while): call it
    once the frame is gone. Nothing happens where pyarrow was never imported."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


_NESTED = (list, tuple, dict, set, frozenset, np.ndarray, Mapping)


def _has_nested(col: pd.Series) -> bool:
    """Whether some cell is a container (a Parquet list/struct/map value), not a scalar label."""
    if col.dtype != object:
        return False
    return bool(col.map(lambda v: isinstance(v, _NESTED)).any())


def _factorize(col: pd.Series) -> tuple[np.ndarray, Any]:
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
        codes, uniques = _factorize(col)
    except TypeError:  # unhashable cells: Parquet lists / structs / maps (no value is quoted)
        where = setting or f"column {col.name!r}"
        what = "nested entries (lists/structs/maps)" if _has_nested(col) else "values that cannot be compared as labels"
        raise DataError(
            f"{where}: column {col.name!r} has {what}; allowed: one scalar label "
            "(text or number) per row"
        ) from None
    as_str = [_nfc(_label(u)) for u in uniques]
    blank = np.array([s is None or s == "" for s in as_str] + [True])
    mapped = np.array([bool(label_map) and s in label_map for s in as_str] + [False])
    if label_map:
        as_str = [label_map.get(s, s) for s in as_str]
    if lower:
        as_str = [s.lower() if s is not None else None for s in as_str]
    lookup = pd.Index(list(labels), dtype=object).get_indexer(pd.Index(as_str, dtype=object))
    by_number: dict[float, int] = {}
    for i, label in enumerate(labels):  # declared '1.0' or 1 matches a stored 1.0: numbers compare as numbers
        number = _as_number(label)
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


def _as_number(label: Any) -> float | None:
    """A declared label as a finite number ('1', '1.0', ' 2 ', 3), or None for any other text."""
    try:
        number = float(str(label).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


LABELS_HINT = "(declare the column under data.categorical if it holds labels)"


def numeric_values(col: pd.Series, setting: str, hint: str = LABELS_HINT) -> np.ndarray:
    """The column as float64 (NaN for missing). Non-numeric entries -> DataError (no value, no
    count); ``hint`` says what to do instead."""
    name = col.name
    if pd.api.types.is_bool_dtype(col.dtype) or (
        pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_complex_dtype(col.dtype)
    ):
        return col.to_numpy(dtype=np.float64, na_value=np.nan)
    if pd.api.types.is_datetime64_any_dtype(col.dtype) or pd.api.types.is_timedelta64_dtype(col.dtype):
        raise DataError(f"{setting}: column {name!r} holds dates/times, not numbers; allowed: numeric values")
    obj = col.astype(object)
    num = pd.to_numeric(obj, errors="coerce")
    if bool((num.isna() & obj.notna()).any()):
        raise DataError(f"{setting}: column {name!r} has non-numeric entries; allowed: numbers {hint}")
    return pd.Series(num).to_numpy(dtype=np.float64, na_value=np.nan)


def _scale(v: np.ndarray, spec: NumericSpec) -> np.ndarray:
    """``v`` clipped into the declared bounds (log1p of value and bounds with ``transform: log1p``)
    and scaled to [0, 1], in float64 (a new array)."""
    return _scale_in_place(np.array(v, dtype=np.float64), spec)


def _scale_in_place(v: np.ndarray, spec: NumericSpec) -> np.ndarray:
    """:func:`_scale` overwriting the float64 array ``v`` (the same operations, the same bits)."""
    lo, hi = spec.lower, spec.upper
    np.clip(v, lo, hi, out=v)
    if spec.transform == "log1p":
        np.log1p(v, out=v)
        lo, hi = math.log1p(lo), math.log1p(hi)
    v -= lo
    v /= hi - lo
    return v


def _target(col: pd.Series, schema: Schema, numeric: Mapping[str, np.ndarray], counts: RowCounts) -> np.ndarray:
    """Every row's label: the index in the declared labels (a binary target's (negative, positive)
    as float32 0/1, a multiclass target's classes as int64), the 0/1 value of a target declared by
    neither label, or a continuous target clipped and scaled by its declared bounds. A row whose
    target is not a declared label (a missing one included) is left out and counted (``counts``),
    never read as a negative; its label here is -1."""
    setting = f"data.target={schema.target!r}"
    if schema.target_bounds is not None:  # its non-finite rows are left out by data.nonfinite
        lo, hi = schema.target_bounds
        values = np.asarray(numeric[schema.target], dtype=np.float64)  # exact from any real dtype
        return _scale(values, NumericSpec(schema.target, lo, hi)).astype(np.float32)
    labels = schema.target_labels
    if labels is not None:
        codes, lookup, mapped, blank = declared_lookup(col, labels, label_map=schema.labels_map(schema.target),
                                                       setting=setting)
        y = lookup[codes]
        missing = blank[codes]
        counts.leave_out("target", schema.target, "missing", missing)
        counts.leave_out("target", schema.target, "undeclared", (y < 0) & ~missing)
        counts.count_mapped(schema.target, mapped, codes, declared=bool(schema.labels_map(schema.target)))
        return y if schema.classes is not None else y.astype(np.float32)
    v, text = _numbers(col, Schema(schema.target, None, (), ()))  # 0 and 1, written as numbers (a view)
    missing = np.isnan(v) if v.dtype.kind == "f" else np.zeros(len(v), dtype=bool)
    if text is not None:
        missing &= ~text
    counts.leave_out("target", schema.target, "missing", missing)
    counts.leave_out("target", schema.target, "not_0_or_1", ~missing & (v != 0) & (v != 1))
    return (v == 1).astype(np.float32)


def split_salt(seed: int) -> bytes:
    """The 16-byte key of the hash split, derived from the run's (public) ``seed`` with BLAKE2b."""
    return hashlib.blake2b(str(_seed(seed)).encode(), digest_size=16, person=b"dptrain-split").digest()


def _label_words(col: pd.Series, rows: np.ndarray | None, salt: bytes) -> Callable[[int, int], np.ndarray]:
    """Per block of the kept rows, one keyed 64-bit word per row: BLAKE2b of the cell's
    stripped-string label (one marker, not valid UTF-8, for a missing cell). Only the distinct
    values are hashed (once, for every block)."""
    codes, uniques = _factorize(col)
    labels = [_label(u) for u in uniques]
    words = [keyed_word(salt, b"\xff" if s is None else s.encode("utf-8", "surrogatepass")) for s in labels]
    lookup = np.array(words + [keyed_word(salt, b"\xff")], dtype=np.uint64)  # code -1 -> missing
    return lambda start, stop: lookup[take(codes, rows, start, stop)]


def _column_words(col: pd.Series, rows: np.ndarray | None, salt: bytes) -> Callable[[int, int], np.ndarray]:
    """Per block, one 64-bit word per row of a key column: a numeric column's float64 bits (-0.0 as
    0.0, every missing value one NaN), any other column's keyed label words."""
    if pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype):
        plain = isinstance(col.dtype, np.dtype)  # numpy-backed: a view, converted block by block
        values = col.to_numpy(copy=False) if plain else col.to_numpy(dtype=np.float64, na_value=np.nan)

        def words(start: int, stop: int) -> np.ndarray:
            v = take(values, rows, start, stop).astype(np.float64)
            v += 0.0
            v[np.isnan(v)] = np.nan
            return v.view(np.uint64)

        return words
    return _label_words(col, rows, salt)


def split_scores(df: pd.DataFrame, schema: Schema, *, seed: int, rows: np.ndarray | None = None,
                 groups: np.ndarray | None = None) -> np.ndarray:
    """``u`` in [0, 1) for each of ``rows`` (default all): a keyed hash of the row's content in the
    split's key columns (``data.split_key``; by default every column of the file, in name order:
    the whole raw row, so the split does not change with the declared feature set) AND of its
    occurrence number among the rows of the same content (0 for the first copy, 1 for the second,
    in file order); a row is a test row iff ``u < test_fraction``.

    Identical rows are different people: each copy gets its own, independent ``u``, so a table of
    few distinct rows (a survey of discrete columns) is split row by row, not by whole combinations
    of values. ``u`` depends on the row's cells, its occurrence number and the seed only, never on
    the other rows' contents, their number or their order: adding or removing one row renumbers
    only the later copies of that same content, so the training rows (a multiset) change by at most
    that one row. A numeric column's cell enters as its float64 bits, any other cell as its
    stripped string (missing values as one marker). The columns' words are combined with SplitMix64
    rounds keyed by :func:`split_salt`, in numpy uint64 arithmetic (no dependence on pandas'
    hashing), block by block and in place (:func:`dptrain.data.blocks.hash_scores`). ``groups``
    (a sharded read: each row's Parquet piece) numbers the copies within each group."""
    if rows is not None and len(rows) == len(df) and (len(rows) == 0 or (rows[0] == 0 and rows[-1] == len(df) - 1)):
        rows = None  # every row, in order (rows comes from flatnonzero: sorted and distinct)
    n = len(df) if rows is None else len(rows)
    salt = split_salt(seed)
    key = schema.split_key if schema.split_key is not None else sorted(df.columns)

    words = [_column_words(df[col], rows, salt) for col in key]
    return hash_scores(n, words, HashKeys.derive(salt, len(key)), workers=torch.get_num_threads(), groups=groups)


def _split(df: pd.DataFrame, schema: Schema, idx: np.ndarray, seed: int,
           groups: np.ndarray | None = None) -> np.ndarray:
    """For the kept rows ``idx`` (into df): True where the row is a test row (``groups``: each
    row's Parquet piece in a sharded read, :func:`split_scores`)."""
    if schema.split_column is not None:
        col = schema.split_column
        codes = label_codes(df[col], ["train", "test"], lower=True, setting=f"data.split_column={col!r}")[idx]
        if bool((codes < 0).any()):
            raise DataError(
                f"data.split_column={col!r}: some entries are neither 'train' nor 'test' "
                "(or are missing); allowed: train / test in every row"
            )
        return codes == 1
    kept_groups = None if groups is None else np.asarray(groups)[idx]
    return split_scores(df, schema, seed=seed, rows=idx, groups=kept_groups) < schema.test_fraction


def _seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed={seed!r} is not allowed: must be an integer >= 0")
    return int(seed)


def encode_features(df: pd.DataFrame, schema: Schema, rows: np.ndarray | None = None,
                    numeric: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Encode ``df`` (rows ``rows``, default all) with the public schema -> float32 (n, d).

    Numeric columns must be finite here (``numeric`` may pass pre-parsed columns)."""
    if numeric is None:
        numeric = {s.name: _native(df[s.name], f"data.numeric.{s.name}", LABELS_HINT) for s in schema.numeric}
    kept = None if rows is None or _all_rows(rows, len(df)) else np.asarray(rows)
    n = len(df) if kept is None else len(kept)
    return _encode_blocks(schema, numeric, _category_codes(df, schema), kept, None, n)[0][0]


def _all_rows(rows: np.ndarray, n: int) -> bool:
    """Whether ``rows`` (sorted, distinct: from np.flatnonzero or np.arange) is every row of n."""
    return len(rows) == n and (n == 0 or (int(rows[0]) == 0 and int(rows[-1]) == n - 1))


def _category_codes(df: pd.DataFrame, schema: Schema,
                    counts: RowCounts | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per declared categorical column, (its codes, the lookup from a code to its slot): the
    index of the row's label (after data.label_map) in the declared list, or len(list) (the
    ``<other>`` slot) for any other label or a missing one (:func:`declared_lookup`; the blocks
    gather the slots). With ``counts``: the rows data.label_map relabelled are counted, and with
    ``data.unlisted=drop`` the rows of any other label are left out (counted)."""
    out = []
    for col, cats in schema.categorical:
        if len(cats) == 0:
            raise ConfigError(f"data.categorical.{col}=[] is not allowed: a category list must not be empty")
        codes, lookup, mapped, blank = declared_lookup(df[col], cats, label_map=schema.labels_map(col),
                                                       setting=f"data.categorical.{col}")
        if counts is not None:
            counts.count_mapped(col, mapped, codes, declared=bool(schema.labels_map(col)))
            if schema.unlisted == "drop":
                missing = blank[codes]
                counts.leave_out("categorical", col, "missing", missing)
                counts.leave_out("categorical", col, "undeclared", (lookup < 0)[codes] & ~missing)
        out.append((codes, np.where(lookup < 0, len(cats), lookup).astype(np.int64)))
    return out


#: rows per block of the encoding pass: a block of 16 float32 features is 1 MiB, and every
#: temporary of a block stays below glibc's mmap threshold (a larger block's fresh pages cost more
#: than its work)
ENCODE_BLOCK_ROWS = 1 << 14


def _encode_blocks(schema: Schema, nums: Mapping[str, np.ndarray], codes: Sequence[tuple[np.ndarray, np.ndarray]],
                   rows: np.ndarray | None, is_test: np.ndarray | None, n: int) -> tuple[list[np.ndarray], dict]:
    """The encoded matrices and the PRIVATE facts of the feature columns (clipped counts, the rows
    whose categorical value went to <other>, missing or undeclared, per column), in one pass over
    blocks of the kept rows
    (:func:`dptrain.data.blocks.map_blocks`, on torch's number of threads): each block's numeric
    values are converted to float64 (exact), clipped, scaled in place and written as float32, its
    one-hot slots set, and its rows copied to their place in the train or the test matrix
    (``is_test`` None: one matrix of every kept row), in row order. ``codes``: per categorical
    column, (the column's codes, the lookup from a code to its slot). Preallocated outputs: no
    whole-table temporary."""
    d = len(schema.feature_names)
    if is_test is None:
        is_test = np.zeros(0, dtype=bool)
        outs = [np.empty((n, d), dtype=np.float32)]
    else:
        n_test = int(np.count_nonzero(is_test))
        outs = [np.empty((n - n_test, d), dtype=np.float32), np.empty((n_test, d), dtype=np.float32)]
    # where each block's test rows start in the test matrix: the test rows before the block
    tests_before = np.concatenate([[0], np.cumsum(is_test, dtype=np.int64)]) if len(outs) == 2 else None

    def block(start: int, stop: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        x = np.zeros((stop - start, d), dtype=np.float32)
        clipped = []
        for j, spec in enumerate(schema.numeric):
            v = take(nums[spec.name], rows, start, stop).astype(np.float64)
            clipped.append((int(np.count_nonzero(v < spec.lower)), int(np.count_nonzero(v > spec.upper))))
            x[:, j] = _scale_in_place(v, spec)
        j, base, flat, lumped = len(schema.numeric), np.arange(stop - start) * d, x.reshape(-1), []
        for (_, cats), (column_codes, lookup) in zip(schema.categorical, codes):
            code = take(column_codes, rows, start, stop)
            slot = lookup[code]
            other = slot == len(cats)
            missing = int(np.count_nonzero(other & (code < 0)))
            lumped.append((missing, int(np.count_nonzero(other)) - missing))
            flat[base + (j + slot)] = 1.0
            j += len(cats) + 1
        if tests_before is None:
            outs[0][start:stop] = x
        else:  # np.take into fresh pages: several times faster than np.compress or a boolean mask here
            test, t0, t1 = is_test[start:stop], int(tests_before[start]), int(tests_before[stop])
            np.take(x, np.flatnonzero(~test), axis=0, out=outs[0][start - t0:stop - t1])
            np.take(x, np.flatnonzero(test), axis=0, out=outs[1][t0:t1])
        return clipped, lumped

    results = map_blocks(n, block, torch.get_num_threads(), size=ENCODE_BLOCK_ROWS)
    clipped = {s.name: {"below_lower": sum(r[0][i][0] for r in results),
                        "above_upper": sum(r[0][i][1] for r in results)} for i, s in enumerate(schema.numeric)}
    lumped = {col: {"missing": sum(r[1][i][0] for r in results), "undeclared": sum(r[1][i][1] for r in results)}
              for i, (col, _) in enumerate(schema.categorical)}
    return outs, {"clipped": clipped, "lumped": lumped}


def _native(col: pd.Series, setting: str, hint: str) -> np.ndarray:
    """A numeric column's values: pandas' own numpy array (a view, no copy: float32 stays float32,
    integers stay integers; the blocks convert them to float64, which is exact) where pandas holds
    one, else :func:`numeric_values`' float64 (nullable, object columns: parsed, or refused)."""
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "fiub":
        return col.to_numpy(copy=False)
    return numeric_values(col, setting, hint)


def _numeric_settings(schema: Schema) -> list[tuple[str, NumericSpec]]:
    """(setting, spec) of every numeric column read: the numeric features and, for a continuous
    target, the target with its declared bounds (``data.target_bounds``)."""
    out = [(f"data.numeric.{s.name}", s) for s in schema.numeric]
    if schema.target_bounds is not None:
        out.append(("data.target_bounds", NumericSpec(schema.target, *schema.target_bounds)))
    return out


def _numbers(col: pd.Series, schema: Schema) -> tuple[np.ndarray, np.ndarray | None]:
    """(a numeric column's values, the mask of its entries that are text but no number, or None):
    pandas' own numpy array (a view) where pandas holds one, else the text parsed with
    data.thousands and data.decimal (:func:`dptrain.data.rules.parse_numbers`)."""
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "fiub":
        return col.to_numpy(copy=False), None
    if pd.api.types.is_datetime64_any_dtype(col.dtype) or pd.api.types.is_timedelta64_dtype(col.dtype):
        raise DataError(f"column {col.name!r} holds dates/times, not numbers; allowed: numeric values")
    if pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_complex_dtype(col.dtype):
        return col.to_numpy(dtype=np.float64, na_value=np.nan), None  # nullable integers / floats, booleans
    try:
        return parse_numbers(col.astype(object), thousands=schema.thousands, decimal=schema.decimal)
    except TypeError:  # unhashable cells: Parquet lists / structs / maps (no value is quoted)
        raise DataError(f"column {col.name!r} has nested entries (lists/structs/maps); allowed: one number per "
                        "row") from None


def _nonfinite_error(setting: str, col: pd.Series, v: np.ndarray, text: np.ndarray | None) -> DataError:
    """data.nonfinite=error: the refusal of a column with a missing, NaN, infinite or non-numeric
    entry, naming the kinds (non-numeric text by its shape, with the setting that reads it), never
    an entry or a count. It depends on the rows: the data holder's choice (data.nonfinite)."""
    nan = bool((np.isnan(v) & (True if text is None else ~text)).any())
    inf = bool(np.isinf(v).any())
    parts = [f"non-finite entries ({' and '.join(k for k, hit in (('missing/NaN', nan), ('infinite', inf)) if hit)})"
             ] if nan or inf else []
    if text is not None:
        shapes = [name + (f": {shape_setting(name)} reads them" if shape_setting(name).startswith("data.") else "")
                  for name in number_shapes(col, text)]
        parts.append(f"non-numeric entries ({'; '.join(shapes)})")
    labels = "; a column of labels belongs under data.categorical" if text is not None else ""
    return DataError(f"{setting}: column {col.name!r} has {' and '.join(parts)}; allowed with data.nonfinite=error: "
                     "finite numbers in every row (data.nonfinite=drop leaves such rows out and counts them; dptrain "
                     f"check lists them{labels})")


def _numeric_columns(df: pd.DataFrame, schema: Schema, counts: RowCounts) -> dict[str, np.ndarray]:
    """Numeric columns as numpy arrays (:func:`_numbers`: views where possible). A missing, NaN,
    infinite or non-numeric entry is refused with ``data.nonfinite=error``; with ``drop`` its row
    is left out, each row on its own, and counted per column and kind (``counts``; private)."""
    nums: dict[str, np.ndarray] = {}
    for setting, spec in _numeric_settings(schema):
        col = df[spec.name]
        try:
            v, text = _numbers(col, schema)
        except DataError as err:
            raise DataError(f"{setting}: {err}") from None
        nonfin = ~np.isfinite(v)
        if nonfin.any():
            if schema.nonfinite == "error":
                raise _nonfinite_error(setting, col, v, text)
            infinite = np.isinf(v)
            counts.leave_out("numeric", spec.name, "missing", nonfin & ~infinite & (True if text is None else ~text))
            counts.leave_out("numeric", spec.name, "infinite", infinite)
            if text is not None:
                counts.leave_out("numeric", spec.name, "not_a_number", text)
                counts.shapes[spec.name] = number_shapes(col, text)
        nums[spec.name] = v
    return nums


def _split_column_rule(df: pd.DataFrame, schema: Schema, counts: RowCounts) -> None:
    """A split column's entry that is neither train nor test (any case; a missing one included):
    its row is left out and counted."""
    if schema.split_column is not None:
        col = schema.split_column
        codes = label_codes(df[col], ["train", "test"], lower=True, setting=f"data.split_column={col!r}")
        counts.leave_out("split_column", col, "not_train_or_test", codes < 0)


@dataclass
class EncodedRows:
    """Rows encoded with the public schema and split, before the checks that need EVERY row of the
    data set (:func:`check_rows`): a whole table's, or one shard's of a sharded read
    (:mod:`dptrain.data.shards`), whose ``facts`` are combined across ranks first. The train and
    test rows are each in the table's row order."""

    x_train: np.ndarray  # (n_train, d) float32
    y_train: np.ndarray  # (n_train,)
    x_test: np.ndarray  # (n_test, d) float32
    y_test: np.ndarray  # (n_test,)
    # PRIVATE facts about the rows, for the check and the diagnostics only (never in an error):
    # any_train, any_test, clipped (per numeric column), rows (the rules' counts: RowCounts.as_dict)
    facts: dict[str, Any]


def missing_columns(schema: Schema, names: Collection[str]) -> list[tuple[str, str]]:
    """(setting, column) of every declared column not in ``names``, in schema order."""
    return [
        (setting, col)
        for setting, col in [("data.target", schema.target)]
        + [(f"data.numeric.{s.name}", s.name) for s in schema.numeric]
        + [(f"data.categorical.{c}", c) for c, _ in schema.categorical]
        + ([("data.split_column", schema.split_column)] if schema.split_column else [])
        + [("data.split_key", c) for c in schema.split_key or ()]
        if col not in names
    ]


def encode_rows(df: pd.DataFrame, schema: Schema, *, seed: int, groups: np.ndarray | None = None) -> EncodedRows:
    """Parse, encode and split ``df``'s rows, each on its own (the declared columns are in
    ``df``). A row outside the declared domain is handled by its declared rule and counted
    (:mod:`dptrain.data.rules`): its target not a declared label, a missing / non-finite /
    non-numeric number (``data.nonfinite=drop``; ``error`` refuses), a categorical value outside
    its list (``data.unlisted``), a split entry neither train nor test. Nothing else about the
    rows is refused here; the one check over every row is :func:`check_rows`'. The numeric columns
    are read in place and the encoded rows written straight into their train or test matrix
    (:func:`_encode_blocks`). ``groups``: a sharded read's Parquet piece of each row (identical rows
    are numbered within their piece)."""
    seed = _seed(seed)
    counts = RowCounts(len(df))
    nums = _numeric_columns(df, schema, counts)
    y = _target(df[schema.target], schema, nums, counts)
    codes = _category_codes(df, schema, counts)
    _split_column_rule(df, schema, counts)
    idx = counts.kept()
    kept = None if _all_rows(idx, len(df)) else idx
    y = y if kept is None else y[idx]
    is_test = _split(df, schema, idx, seed, groups) if len(idx) else np.zeros(0, dtype=bool)
    (x_train, x_test), seen = _encode_blocks(schema, nums, codes, kept, is_test, len(idx))
    clipped = seen["clipped"]
    if schema.target_bounds is not None:
        clipped.update(clipped_counts(schema, nums, idx, only=schema.target))
    counts.lumped = seen["lumped"]
    y_train, y_test = y[~is_test], y[is_test]
    facts = {"any_train": len(y_train) > 0, "any_test": len(y_test) > 0, "clipped": clipped,
             "rows": counts.as_dict(train=len(y_train), test=len(y_test))}
    return EncodedRows(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, facts=facts)


#: the one refusal that depends on the rows, the same whatever left the training part empty
NO_TRAINING_ROWS = ("{origin}: no training rows: the declared rules left every row out, or the split put none in "
                    "the training part; a run needs at least one (this is the one outcome of a run that depends on "
                    "the rows: it tells a table without a usable training row from its neighbours with one); "
                    "allowed: a table with rows inside the declared domain (dptrain check lists why rows are left "
                    "out)")


def check_rows(facts: Mapping[str, Any], schema: Schema, origin: str, *, holder: bool = False) -> None:
    """The check over every row (``facts`` of the whole data set: :func:`encode_rows`'s, or combined
    over a sharded read's ranks): at least one training row, the only refusal that depends on the
    rows. A test part without rows, one class only, a declared label or category no row has: all
    run. ``holder``: log the rules' counts in one console line for the data holder (a user's table;
    PRIVATE: the log is private/dptrain.log) and, when any row was left out or lumped, point to
    ``dptrain check``; else the log names the clipped columns only, never a count."""
    rows = facts["rows"]
    if holder:
        changed = rows["left_out"] or any(sum(v.values()) for v in rows["lumped"].values()) or any(
            rows["mapped"].values()) or any(n["below_lower"] or n["above_upper"] for n in facts["clipped"].values())
        (log.warning if changed else log.info)("%s", counts_line(rows, facts["clipped"]))
        if rows["left_out"] or any(sum(v.values()) for v in rows["lumped"].values()):
            log.warning("%s", CHECK_HINT)
    if not facts["any_train"]:
        hint = ("; a target of labels needs data.positive and data.negative (data.positive=null reads 0/1)"
                if schema.target_kind == "binary" and schema.positive is None else "")
        raise DataError(NO_TRAINING_ROWS.format(origin=origin) + hint)
    hit = [c for c, n in facts["clipped"].items() if n["below_lower"] or n["above_upper"]]
    if hit and not holder:
        log.warning("values outside the declared bounds were clipped into them in numeric column(s) %s "
                    "(data.numeric.<column>.lower/upper, data.target_bounds for the target; how many: "
                    "private/data_diagnostics.json, PRIVATE)", ", ".join(repr(c) for c in hit))


def build_dataset(df: pd.DataFrame, schema: Schema, *, seed: int, source: str, origin: str,
                  holder: bool = False) -> Dataset:
    """Check ``df`` against the schema, encode, split. ``origin`` names the data in messages
    (e.g. ``data.path='x.csv'``); ``holder``: the rules' counts in one console line
    (:func:`check_rows`). Errors name settings and columns, never a value or a count."""
    rows = encode_checked(df, schema, seed=seed, origin=origin, holder=holder)
    return dataset_from_rows(rows, schema, source=source, diagnostics=diagnostics(rows.facts))


def diagnostics(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The PRIVATE diagnostics of a read (private/data_diagnostics.json): the values clipped per
    numeric column and the rules' counts (rows read, left out, lumped, relabelled)."""
    return {"clipped": facts["clipped"], "rows": facts["rows"]}


def encode_checked(df: pd.DataFrame, schema: Schema, *, seed: int, origin: str, holder: bool = False) -> EncodedRows:
    """:func:`encode_rows` after the checks of the frame (declared columns present, at least one
    row) and before the check over every row (:func:`check_rows`)."""
    seed = _seed(seed)
    missing = missing_columns(schema, df.columns)
    if missing:
        raise missing_column_error(missing, df.attrs.get("file_columns", list(df.columns)), origin)
    if len(df) == 0:
        raise DataError(f"{origin} has 0 rows (header only); allowed: at least one row")
    rows = encode_rows(df, schema, seed=seed)
    check_rows(rows.facts, schema, origin, holder=holder)
    return rows


def dataset_from_rows(rows: EncodedRows, schema: Schema, *, source: str, diagnostics: dict, **shard: Any) -> Dataset:
    """The :class:`Dataset` of encoded rows, sharing their memory (``shard``: its shard fields on a
    sharded read)."""
    return Dataset(
        x_train=torch.from_numpy(np.ascontiguousarray(rows.x_train)),
        y_train=torch.from_numpy(np.ascontiguousarray(rows.y_train)),
        x_test=torch.from_numpy(np.ascontiguousarray(rows.x_test)),
        y_test=torch.from_numpy(np.ascontiguousarray(rows.y_test)),
        feature_names=schema.feature_names,
        source=source,
        diagnostics=diagnostics,
        target_kind=schema.target_kind, class_names=tuple(schema.classes or ()), target_bounds=schema.target_bounds,
        **shard,
    )


def missing_column_error(missing: list[tuple[str, str]], file_columns: Sequence[Any], origin: str) -> DataError:
    """The first declared column the file lacks, with the file's column names closest to it
    (difflib; only close matches, never the whole header: a headerless file's "names" are
    values of its first row)."""
    setting, col = missing[0]
    more = f" ({len(missing) - 1} more declared column(s) are missing too)" if len(missing) > 1 else ""
    names = [str(c) for c in file_columns]
    folded = {n.lower(): n for n in reversed(names)}  # case-insensitive: 'Age' is close to 'age'
    near = [folded[n] for n in closest(col.lower(), list(folded))]
    hint = f"; the file's closest column names: {', '.join(repr(c) for c in near)}" if near else ""
    return DataError(
        f"{setting}: column {col!r} is not in {origin}{more}{hint}; allowed: a column of "
        "the file (names compared after stripping spaces, case-sensitive; a CSV not separated by commas "
        "needs data.delimiter)"
    )


def clipped_counts(schema: Schema, nums: Mapping[str, np.ndarray], rows: np.ndarray, *,
                   only: str | None = None) -> dict[str, dict[str, int]]:
    """Per numeric column (and a continuous target, under its column's name; ``only``: that column
    alone), how many values of the kept ``rows`` lay below ``lower`` / above ``upper`` and were
    clipped into the declared bounds, compared in float64 block by block. PRIVATE counts: they go
    to private/data_diagnostics.json only; the log (:func:`check_rows`) names the columns, never a
    count."""
    out: dict[str, dict[str, int]] = {}
    for _, spec in _numeric_settings(schema):
        if only is not None and spec.name != only:
            continue
        kept = None if _all_rows(rows, len(nums[spec.name])) else rows
        below = above = 0
        for start, stop in row_blocks(len(rows)):
            v = take(nums[spec.name], kept, start, stop).astype(np.float64)
            below += int(np.count_nonzero(v < spec.lower))
            above += int(np.count_nonzero(v > spec.upper))
        out[spec.name] = {"below_lower": below, "above_upper": above}
    return out
