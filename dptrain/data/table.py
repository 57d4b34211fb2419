"""Reading tables and encoding them with the PUBLIC schema declared in the data config.

Nothing here is fitted on the rows (docs/privacy.md):

* numeric column: clipped into the declared ``[lower, upper]`` (then ``log1p`` of value and
  bounds when ``transform: log1p``), scaled to ``[0, 1]`` by those bounds;
* categorical column: one-hot over the declared category list plus one ``<other>`` slot for
  every value not in the list, missing values included;
* target: 1 where the value (as a stripped string) equals ``data.positive``, else 0; with
  ``positive: null`` the column must already be numeric 0/1 (a binary target); with
  ``data.classes`` (a multiclass target) the index of the value in that PUBLIC list (int64),
  every row's label must be one of them; with ``data.target_bounds`` (a continuous target)
  the value clipped into the PUBLIC ``[lower, upper]`` and scaled to ``[0, 1]`` by them;
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

Refused (DataError): empty / header-only files, non-UTF-8 CSV, CSV rows whose field count differs
from the header's (pandas would pad, truncate or shift them silently), duplicate column names,
missing declared columns, non-numeric / non-finite numeric entries, nested (list / struct)
labels, a binary target that is not 0/1 or whose training rows are all in one class, a multiclass
target with a label not among ``data.classes`` (a missing label included; the error never says
which label or how many rows) or with one class only among the training rows, a continuous target
with non-numeric entries (non-finite ones follow ``data.nonfinite``), a split with no train or no
test row.

Large tables: the rows are encoded in blocks straight into preallocated train and test matrices,
and the split's hash runs in place by blocks (:mod:`dptrain.data.blocks`); a numeric column is
read where pandas holds it, widened to float64 one block at a time. The results are those of the
whole-array computation, bit for bit (docs/large_tables.md).

Error messages and log lines name the setting and the column, say what was found in words and
what is allowed. They quote no value read from the file (a headerless file's "column names" are
row values, so those are not quoted either) and no count of rows or of entries (bad entries,
dropped rows, rows per class or per split side, line numbers): such counts change when one row
is added or removed, so they are private. The size N of the training set is public (the
accountant's q = B/N uses it), and so is the number of columns in the header.
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
from dptrain.models.objectives import DataSpec

log = logging.getLogger("dptrain.data")

OTHER = "<other>"  # name of the extra one-hot slot: feature "col=<other>"
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
    classes: tuple[str, ...] | None = None  # a multiclass target's PUBLIC class list (data.classes)
    target_bounds: tuple[float, float] | None = None  # a continuous target's PUBLIC bounds (data.target_bounds)
    #: the hash split's key columns (data.split_key); None: every column of the file (the raw row)
    split_key: tuple[str, ...] | None = None

    @property
    def target_kind(self) -> str:
        return "multiclass" if self.classes is not None else ("continuous" if self.target_bounds is not None
                                                              else "binary")

    def data_spec(self, *, extra_features: int = 0) -> Any:
        """The :class:`dptrain.models.objectives.DataSpec` of this schema (no row is read)."""
        return DataSpec(n_features=len(self.feature_names) + extra_features, target_kind=self.target_kind,
                        class_names=tuple(self.classes or ()), target_bounds=self.target_bounds)

    @property
    def feature_columns(self) -> list[str]:
        return [s.name for s in self.numeric] + [c for c, _ in self.categorical]

    @property
    def columns(self) -> list[str]:
        cols = [self.target] + self.feature_columns
        return cols + ([self.split_column] if self.split_column else [])

    @property
    def read_columns(self) -> list[str] | None:
        """The columns a reader must load: the declared ones and the split's key (None: every
        column, the hash split keyed on the whole raw row)."""
        if self.split_column is None and self.split_key is None:
            return None
        return list(dict.fromkeys(self.columns + list(self.split_key or ())))

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


def numeric_spec(name: str, spec: Any, *, setting: str | None = None) -> NumericSpec:
    """Normalise one ``data.numeric.<name>`` entry (NumericColumn, DictConfig or mapping);
    ``setting`` names it in errors (default ``data.numeric.<name>``)."""
    setting = setting or f"data.numeric.{name}"
    if spec is None or not (isinstance(spec, Mapping) or hasattr(spec, "lower")):
        raise ConfigError(f"{setting}={spec!r} is not allowed: give {{lower: ..., upper: ...}} (optionally "
                          "transform: log1p)")
    for bound in ("lower", "upper"):  # no default range: a silent [0, 1] clips every age to 1
        if _get(spec, bound) is None:
            raise ConfigError(f"{setting}.{bound} is missing: declare both PUBLIC bounds, e.g. "
                              f"'++{setting}={{lower: 0, upper: 100}}'; allowed: finite numbers with lower < upper "
                              "(from documentation or domain knowledge, never from the rows)")
    lo = _number(f"{setting}.lower", _get(spec, "lower"))
    hi = _number(f"{setting}.upper", _get(spec, "upper"))
    for bound, value in (("lower", lo), ("upper", hi)):
        if not math.isfinite(value):
            raise ConfigError(f"{setting}.{bound}={value!r} is not allowed: must be a finite number (a public bound)")
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
    nums = [numeric_spec(str(k).strip(), v)
            for k, v in (numeric if numeric is not None else (_get(cfg, "numeric") or {})).items()]
    cats = [(str(col).strip(), _label_list(f"data.categorical.{str(col).strip()}", lst))
            for col, lst in (_get(cfg, "categorical") or {}).items()]
    if not nums and not cats:
        raise ConfigError("data.numeric/data.categorical='{}' is not allowed: declare at least one feature column")
    seen: dict[str, str] = {}
    for setting, col in ([(f"data.numeric.{s.name}", s.name) for s in nums]
                         + [(f"data.categorical.{c}", c) for c, _ in cats]):
        if col in seen:
            raise ConfigError(f"{setting} is not allowed: column {col!r} is also declared as {seen[col]}")
        if col == target:
            raise ConfigError(f"{setting} is not allowed: column {col!r} is the target (data.target); "
                              "a label cannot be a feature")
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
    classes, bounds = _target_declaration(cfg, positive)
    key = _get(cfg, "split_key")
    if key is not None:
        if isinstance(key, (str, bytes)) or not hasattr(key, "__iter__") or not list(key) or not all(
                isinstance(c, str) and c.strip() for c in key):
            raise ConfigError(f"data.split_key={key!r} is not allowed: must be a non-empty list of column names "
                              "(e.g. [person_id]) or null (every column of the file)")
        if split is not None:
            raise ConfigError(f"data.split_key={list(key)!r} is not allowed with data.split_column={split!r}: the "
                              "split column decides the split; allowed: one of them")
        key = tuple(dict.fromkeys(str(c).strip() for c in key))
    return Schema(target, positive, tuple(nums), tuple(cats), split, nonfinite, float(frac), classes, bounds, key)


def _label_list(setting: str, lst: Any, *, what: str = "category", null_hint: str = "missing values go to the "
                "other slot") -> tuple[str, ...]:
    """A declared list of labels (a categorical column's categories, a target's classes) as
    stripped strings: non-empty, no null, no duplicates. Raises ConfigError naming ``setting``."""
    if lst is None or isinstance(lst, (str, bytes, Mapping)) or not hasattr(lst, "__iter__"):
        raise ConfigError(f"{setting}={lst!r} is not allowed: must be a list of {what} labels")
    if any(c is not None and not isinstance(c, (str, int, float)) for c in lst):
        raise ConfigError(f"{setting}={list(lst)!r} is not allowed: every label must be a string or a number")
    items = tuple(_label(c) for c in lst)
    if len(items) == 0:
        raise ConfigError(f"{setting}=[] is not allowed: a {what} list must not be empty")
    if any(c is None for c in items):
        raise ConfigError(f"{setting} is not allowed: a {what} label is null ({null_hint})")
    if len(set(items)) != len(items):
        raise ConfigError(f"{setting} is not allowed: the list has {len(items) - len(set(items))} "
                          "duplicate label(s) (compared as stripped strings)")
    return items


def _target_declaration(cfg: Any, positive: str | None) -> tuple[tuple[str, ...] | None, tuple[float, float] | None]:
    """(classes, target bounds) of a multiclass / continuous target, or (None, None) for a binary
    one. At most one of data.positive, data.classes, data.target_bounds. Raises ConfigError."""
    classes, bounds = _get(cfg, "classes"), _get(cfg, "target_bounds")
    if bounds is not None and _get(bounds, "lower") is None and _get(bounds, "upper") is None:
        bounds = None  # {lower: null, upper: null}, the settings' default: no continuous target
    given = [n for n, v in (("data.positive", positive), ("data.classes", classes),
                            ("data.target_bounds", bounds)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} are not allowed together: declare ONE kind of target: "
                          "data.positive (binary), data.classes (multiclass) or data.target_bounds (continuous)")
    if classes is not None:
        classes = _label_list("data.classes", classes, what="class",
                              null_hint="missing target values are refused, not a class")
        if len(classes) < 2:
            raise ConfigError(f"data.classes={list(classes)!r} is not allowed: a multiclass target needs at least "
                              "2 declared classes")
    if bounds is not None:
        spec = numeric_spec("target_bounds", bounds, setting="data.target_bounds")
        if spec.transform != "none":
            raise ConfigError(f"data.target_bounds.transform={spec.transform!r} is not allowed: the target takes "
                              "lower and upper only")
        bounds = (spec.lower, spec.upper)
    return classes, bounds


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


def _read_csv(p: Path, delimiter: str, wanted: set[str] | None) -> tuple[pd.DataFrame, list[str]]:
    """(the CSV's rows in the ``wanted`` columns, every column name of its header)."""
    header = _csv_header(p, delimiter, wanted)
    _check_duplicates(p, header)
    usecols = None if wanted is None else (lambda c: str(c).strip() in wanted)
    try:
        df = pd.read_csv(p, encoding="utf-8", usecols=usecols, low_memory=False, sep=delimiter)
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
               delimiter: str = ",") -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``/``.bz2``/``.xz``), Parquet (``.parquet``, ``.pq``) or
    Stata (``.dta``) file. ``fmt``: ``auto`` (by suffix), ``csv``, ``parquet`` or ``dta``.

    Column names are stripped of surrounding spaces; duplicate names are refused. ``columns``
    (optional) reads only those columns (faster for wide files); names not in the file are
    skipped silently, the caller checks; ``df.attrs["file_columns"]`` keeps every column name of
    the file (for the caller's messages). ``delimiter``: the CSV field separator
    (``data.delimiter``). Raises :class:`DataError` (missing file, empty file, unreadable,
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
        df, file_columns = _read_csv(p, delimiter_char(delimiter), wanted)
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
    try:
        codes, uniques = _factorize(col)
    except TypeError:  # unhashable cells: Parquet lists / structs / maps (no value is quoted)
        where = setting or f"column {col.name!r}"
        what = "nested entries (lists/structs/maps)" if _has_nested(col) else "values that cannot be compared as labels"
        raise DataError(
            f"{where}: column {col.name!r} has {what}; allowed: one scalar label "
            "(text or number) per row"
        ) from None
    if len(uniques) == 0:
        return codes, np.array([-1], dtype=np.int64)
    as_str = [_label(u) for u in uniques]
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
    return codes, np.append(lookup, -1).astype(np.int64)  # code -1 (missing) -> last entry -> -1


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


def _target(col: pd.Series, schema: Schema, rows: np.ndarray, numeric: Mapping[str, np.ndarray]) -> np.ndarray:
    setting = f"data.target={schema.target!r}"
    if schema.classes is not None:
        return _class_target(col, schema, rows)
    if schema.target_bounds is not None:  # finite on ``rows`` (_numeric_columns), clipped and scaled
        lo, hi = schema.target_bounds
        values = np.asarray(numeric[schema.target][rows], dtype=np.float64)  # exact from any real dtype
        return _scale(values, NumericSpec(schema.target, lo, hi)).astype(np.float32)
    if schema.positive is not None:  # whether ANY row has the label: check_rows (over every row)
        return (label_codes(col, [schema.positive], setting=setting) == 0)[rows].astype(np.float32)
    v = _native(col if _all_rows(rows, len(col)) else col.iloc[rows], f"{setting} (data.positive=null)",
                       "0/1 for a binary target; for a target of text labels name the positive class with "
                       "data.positive=LABEL (rows with that label get 1, every other row 0)")
    if v.dtype.kind == "f" and bool(np.isnan(v).any()):
        raise DataError(
            f"{setting}: column {schema.target!r} has missing entries; allowed "
            "with data.positive=null: 0 or 1 in every row (or set data.positive to the positive label)"
        )
    if bool(((v != 0) & (v != 1)).any()):
        raise DataError(
            f"{setting}: column {schema.target!r} has entries that are not 0 or 1; "
            "allowed with data.positive=null: numeric 0/1 (or set data.positive to the positive label)"
        )
    return v.astype(np.float32)


def _class_target(col: pd.Series, schema: Schema, rows: np.ndarray) -> np.ndarray:
    """A multiclass target: each row's index in the declared ``data.classes`` (int64). A row
    whose label is not declared (a missing label included) is refused: which labels, and how
    many rows, are private, so the error names the setting and what is allowed only."""
    codes = label_codes(col, list(schema.classes), setting=f"data.target={schema.target!r}")[rows]
    if bool((codes < 0).any()):
        raise DataError(
            f"data.classes: column {schema.target!r} (data.target) has labels that are not among the declared "
            "classes (or missing labels); allowed: every row's label one of data.classes (compared as stripped "
            "strings, case-sensitive; numbers as numbers). Add the missing PUBLIC class to data.classes, or map / "
            "drop those rows in your file"
        )
    return codes.astype(np.int64)


def _check_two_classes(seen: Collection[Any], schema: Schema) -> None:
    """Refuse a classification target whose training rows are all in one class (``seen``: the
    distinct labels among the training rows): no classifier can be fitted (the non-private
    baseline would crash) and test AUC is meaningless. No count of rows per class (private), not
    even which class it is. A continuous target passes."""
    if schema.target_kind == "continuous" or len(seen) >= 2:
        return
    if schema.target_kind == "multiclass":
        raise DataError(f"data.target={schema.target!r}: the training rows are all in one of data.classes; allowed: "
                        "a multiclass target with at least two classes among the training rows (check data.target, "
                        "data.classes and data.split_column)")
    rule = (f"label 1 where it equals data.positive={schema.positive!r}" if schema.positive is not None
            else "data.positive=null: numeric 0/1")
    raise DataError(
        f"data.target={schema.target!r}: the training rows are all in one class ({rule}); allowed: "
        "a binary target with both classes among the training rows (check data.target, "
        "data.positive and data.split_column)"
    )


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


def _check_sides(any_train: bool, any_test: bool, schema: Schema) -> None:
    """Refuse a split (over every row) with no train or no test row."""
    for part, found in (("train", any_train), ("test", any_test)):
        if found:
            continue
        if schema.split_column is not None:
            raise DataError(f"data.split_column={schema.split_column!r}: no '{part}' rows; "
                            "allowed: at least one train and one test row")
        raise DataError(
            f"data.test_fraction={schema.test_fraction!r}: the per-row hash split (data.split_column=null) "
            f"put no row in the {part} part; allowed: a table with more distinct rows, a test_fraction "
            "further from 0 and 1, or data.split_column naming a column of train/test values"
        )


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


def _category_codes(df: pd.DataFrame, schema: Schema) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per declared categorical column, (its codes, the lookup from a code to its slot): the
    index of the row's label in the declared list, or len(list) (the ``<other>`` slot) for any
    other label or a missing one (:func:`label_lookup`; the blocks gather the slots)."""
    out = []
    for col, cats in schema.categorical:
        if len(cats) == 0:
            raise ConfigError(f"data.categorical.{col}=[] is not allowed: a category list must not be empty")
        codes, lookup = label_lookup(df[col], cats, setting=f"data.categorical.{col}")
        out.append((codes, np.where(lookup < 0, len(cats), lookup).astype(np.int64)))
    return out


#: rows per block of the encoding pass: a block of 16 float32 features is 1 MiB, and every
#: temporary of a block stays below glibc's mmap threshold (a larger block's fresh pages cost more
#: than its work)
ENCODE_BLOCK_ROWS = 1 << 14


def _encode_blocks(schema: Schema, nums: Mapping[str, np.ndarray], codes: Sequence[tuple[np.ndarray, np.ndarray]],
                   rows: np.ndarray | None, is_test: np.ndarray | None, n: int) -> tuple[list[np.ndarray], dict]:
    """The encoded matrices and the PRIVATE facts of the feature columns (clipped counts, whether
    each categorical column matched a declared label), in one pass over blocks of the kept rows
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

    def block(start: int, stop: int) -> tuple[list[tuple[int, int]], list[bool]]:
        x = np.zeros((stop - start, d), dtype=np.float32)
        clipped = []
        for j, spec in enumerate(schema.numeric):
            v = take(nums[spec.name], rows, start, stop).astype(np.float64)
            clipped.append((int(np.count_nonzero(v < spec.lower)), int(np.count_nonzero(v > spec.upper))))
            x[:, j] = _scale_in_place(v, spec)
        j, base, flat, matched = len(schema.numeric), np.arange(stop - start) * d, x.reshape(-1), []
        for (_, cats), (column_codes, lookup) in zip(schema.categorical, codes):
            slot = lookup[take(column_codes, rows, start, stop)]
            matched.append(bool(np.any(slot < len(cats))))
            flat[base + (j + slot)] = 1.0
            j += len(cats) + 1
        if tests_before is None:
            outs[0][start:stop] = x
        else:  # np.take into fresh pages: several times faster than np.compress or a boolean mask here
            test, t0, t1 = is_test[start:stop], int(tests_before[start]), int(tests_before[stop])
            np.take(x, np.flatnonzero(~test), axis=0, out=outs[0][start - t0:stop - t1])
            np.take(x, np.flatnonzero(test), axis=0, out=outs[1][t0:t1])
        return clipped, matched

    results = map_blocks(n, block, torch.get_num_threads(), size=ENCODE_BLOCK_ROWS)
    clipped = {s.name: {"below_lower": sum(r[0][i][0] for r in results),
                        "above_upper": sum(r[0][i][1] for r in results)} for i, s in enumerate(schema.numeric)}
    matched = {col: any(r[1][i] for r in results) for i, (col, _) in enumerate(schema.categorical)}
    return outs, {"clipped": clipped, "categories_matched": matched}


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


def _numeric_columns(df: pd.DataFrame, schema: Schema) -> tuple[dict[str, np.ndarray], np.ndarray, list[str]]:
    """(numeric columns as numpy arrays (:func:`_native`: views where possible), indices of the rows
    kept, the columns where rows were dropped): NaN/inf refused, or their rows dropped with
    ``data.nonfinite=drop`` (each row on its own; :func:`check_rows` logs the columns, never how
    many rows: a private count)."""
    nums: dict[str, np.ndarray] = {}
    bad_rows = np.zeros(len(df), dtype=bool)
    dropped_in = []
    for setting, spec in _numeric_settings(schema):
        v = _native(df[spec.name], setting, LABELS_HINT if setting.startswith("data.numeric") else
                    "(a continuous target with data.target_bounds holds numbers)")
        nonfin = ~np.isfinite(v)
        if nonfin.any():
            if schema.nonfinite == "error":
                has_nan = bool(np.isnan(v).any())
                kinds = "missing/NaN and infinite" if has_nan and bool(np.isinf(v).any()) else (
                    "missing/NaN" if has_nan else "infinite")
                raise DataError(
                    f"{setting}: column {spec.name!r} has non-finite entries ({kinds}); "
                    "allowed with data.nonfinite=error: finite numbers (set data.nonfinite=drop to drop "
                    "those rows)"
                )
            bad_rows |= nonfin
            dropped_in.append(spec.name)
        nums[spec.name] = v
    return nums, (np.flatnonzero(~bad_rows) if dropped_in else np.arange(len(df))), dropped_in


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
    # PRIVATE facts about the rows, for the checks and the diagnostics only (never logged, never in
    # an error): kept (any row kept), dropped_in (columns with dropped rows), positive_seen,
    # any_train, any_test, classes_seen (distinct labels among the training rows), clipped counts
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
    ``df``). Raises DataError for what one row can be refused for (non-numeric / non-finite
    entries, a label outside data.classes, a bad split entry, nested labels); the checks over
    every row are :func:`check_rows`'. The numeric columns are read in place and the encoded
    rows written straight into their train or test matrix (:func:`_encode_blocks`). ``groups``: a
    sharded read's Parquet piece of each row (identical rows are numbered within their piece)."""
    seed = _seed(seed)
    nums, idx, dropped_in = _numeric_columns(df, schema)
    kept = None if _all_rows(idx, len(df)) else idx
    y = _target(df[schema.target], schema, idx, nums)
    codes = _category_codes(df, schema)
    is_test = _split(df, schema, idx, seed, groups)
    (x_train, x_test), seen = _encode_blocks(schema, nums, codes, kept, is_test, len(idx))
    clipped = seen["clipped"]
    if schema.target_bounds is not None:
        clipped.update(clipped_counts(schema, nums, idx, only=schema.target))
    y_train, y_test = y[~is_test], y[is_test]
    facts = {"kept": len(idx) > 0, "dropped_in": dropped_in,
             "positive_seen": bool(y.any()) if schema.positive is not None else None,
             "any_train": len(y_train) > 0, "any_test": len(y_test) > 0,
             "classes_seen": set() if schema.target_kind == "continuous" else set(np.unique(y_train).tolist()),
             "clipped": clipped, "categories_matched": seen["categories_matched"]}
    return EncodedRows(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, facts=facts)


def _check_categories_matched(matched: Mapping[str, bool], schema: Schema) -> None:
    """Refuse a declared categorical column none of whose labels appears in the rows: every row
    would fall into its <other> slot and the column would be a constant that the coefficient table
    prints as effects (labels declared North/South against a file of north/south). The message
    names the column and its DECLARED labels only (never a value or count of the file); like every
    refusal of bad data it depends on the rows and is seen by the data holder (privacy.txt)."""
    for col, cats in schema.categorical:
        if matched.get(col, True):
            continue
        shown = ", ".join(repr(c) for c in cats[:6]) + (", ..." if len(cats) > 6 else "")
        raise DataError(f"data.categorical.{col}: none of the declared labels ({shown}) matches a row of column "
                        f"{col!r} (labels are compared as stripped strings, case-sensitive), so every row would fall "
                        f"into {col}={OTHER} and the column would carry nothing; allowed: the labels as the file "
                        "writes them (check their spelling and case)")


def check_rows(facts: Mapping[str, Any], schema: Schema, origin: str) -> None:
    """The checks that need every row (``facts`` of the whole data set: :func:`encode_rows`'s,
    or combined over a sharded read's ranks), in the order a whole-table read makes them, and
    the log lines about the rows (columns named, never a count)."""
    if facts["dropped_in"]:
        log.warning("data.nonfinite=drop: dropped the rows with NaN/inf in numeric column(s) %s",
                    ", ".join(repr(c) for c in facts["dropped_in"]))
    if not facts["kept"]:
        raise DataError(f"{origin}: every row has NaN/inf in a numeric column and was dropped (data.nonfinite=drop); "
                        "0 rows left; allowed: at least one row with finite numeric values")
    if facts["positive_seen"] is False:
        raise DataError(
            f"data.positive={schema.positive!r}: no row of column {schema.target!r} has "
            "this label; allowed: the exact label of the positive class (compared as stripped "
            "strings, case-sensitive)"
        )
    _check_sides(facts["any_train"], facts["any_test"], schema)
    _check_two_classes(facts["classes_seen"], schema)
    _check_categories_matched(facts.get("categories_matched", {}), schema)
    hit = [c for c, n in facts["clipped"].items() if n["below_lower"] or n["above_upper"]]
    if hit:
        log.warning("values outside the declared bounds were clipped into them in numeric column(s) %s "
                    "(data.numeric.<column>.lower/upper, data.target_bounds for the target; how many: "
                    "private/data_diagnostics.json, PRIVATE)", ", ".join(repr(c) for c in hit))


def build_dataset(df: pd.DataFrame, schema: Schema, *, seed: int, source: str, origin: str) -> Dataset:
    """Check ``df`` against the schema, encode, split. ``origin`` names the data in messages
    (e.g. ``data.path='x.csv'``). Errors and the log name settings and columns, never a count
    of rows (module docstring)."""
    rows = encode_checked(df, schema, seed=seed, origin=origin)
    return dataset_from_rows(rows, schema, source=source, diagnostics={"clipped": rows.facts["clipped"]})


def encode_checked(df: pd.DataFrame, schema: Schema, *, seed: int, origin: str) -> EncodedRows:
    """:func:`encode_rows` after the checks of the frame (declared columns present, at least one
    row) and before the checks over every row (:func:`check_rows`)."""
    seed = _seed(seed)
    missing = missing_columns(schema, df.columns)
    if missing:
        raise missing_column_error(missing, df.attrs.get("file_columns", list(df.columns)), origin)
    if len(df) == 0:
        raise DataError(f"{origin} has 0 rows (header only); allowed: at least one row")
    rows = encode_rows(df, schema, seed=seed)
    check_rows(rows.facts, schema, origin)
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
