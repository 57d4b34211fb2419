"""The ONE reader of a user's table (:func:`read_table`): training, a release, predictions and
``dptrain check`` read a table through it, with the same location check (:func:`dptrain.data.files.locate`),
format detection, CSV delimiter, byte order mark, numbers kept as text for the declared
``data.thousands`` / ``data.decimal`` and header checks.

A CSV (``.csv``, ``.csv.gz``/``.bz2``/``.xz``), a Parquet file (``.parquet``, ``.pq``), a Stata
file (``.dta``) or a folder of Parquet files (a partitioned data set, :mod:`dptrain.data.parquet`).
Refused (DataError) before any row is used: a missing, empty or header-only file, non-UTF-8 CSV,
CSV rows whose field count differs from the header's (pandas would pad, truncate or shift them
silently), a header that reads as one column holding another separator, duplicate column names, a
declared column the header lacks. The messages quote nothing from the file (:mod:`dptrain.data.files`).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dptrain.core.validation import ConfigError
from dptrain.data.files import (
    DataError,
    TableFile,
    check_duplicates,
    check_header,
    empty_file,
    locate,
    non_utf8,
    unreadable,
)
from dptrain.data.parquet import open_parquet_set, read_rows

_CSV_COMPRESSION = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def _open_binary(p: Path):
    for suffix, opener in _CSV_COMPRESSION.items():
        if p.name.lower().endswith(suffix):
            return opener(p, "rb")
    return open(p, "rb")


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


def _csv_scan(p: Path, delimiter: str = ",", *, whole: bool = True) -> tuple[list[str], bool]:
    """The header and whether any data row is ragged, in one streaming pass with the csv
    module (``whole=False``: the header alone). A ragged row has more or fewer fields than the
    header; pandas would silently pad it with NaN, drop its extra fields (with ``usecols``) or, when
    every row has one extra field, shift all columns by turning the first one into the index. Blank
    lines are skipped, as pandas does; a byte order mark before the header is skipped."""
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
                raise empty_file(p)
            width = len(header)
            if not whole or all(len(row) in (0, width) for row in reader):
                return header, False
        # second pass only for a suspect file: whitespace-only lines are blank, not ragged
        with _BigFields(), _open_binary(p) as fb:
            reader = csv.reader(io.TextIOWrapper(fb, encoding="utf-8-sig", newline=""), delimiter=delimiter)
            rows = (row for row in reader if not _is_blank(row))
            next(rows, None)  # the header
            return header, any(len(row) != width for row in rows)
    except UnicodeDecodeError:
        raise non_utf8(p) from None
    except (OSError, EOFError, csv.Error) as exc:
        raise unreadable(p, "csv", exc) from None


def _csv_header(p: Path, delimiter: str = ",", wanted: set[str] | None = None, *, whole: bool = True) -> list[str]:
    """The header of a CSV file; refuses an empty file and (``whole``: the rows scanned) rows whose
    field count differs from the header's (no value, no count of rows, no line number: those are
    private). A header that reads as one column holding another usual separator (and not the
    columns asked for) is a file written with that separator: the message says to set
    ``data.delimiter``."""
    header, ragged = _csv_scan(p, delimiter, whole=whole)
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
    check_duplicates(p, header)
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


def _read_csv(p: Path, delimiter: str, wanted: set[str] | None, text: set[str] | None,
              required: Sequence[tuple[str, str]], origin: str) -> tuple[pd.DataFrame, list[str]]:
    """(the CSV's rows in the ``wanted`` columns, every column name of its header); the ``text``
    columns are read as text (numbers written with declared separators: the encoding parses them)."""
    header = _csv_header(p, delimiter, wanted)
    check_header(required, {n.strip() for n in header}, origin, file_columns=[n.strip() for n in header])
    usecols = None if wanted is None else (lambda c: str(c).strip() in wanted)
    dtype = {name: str for name in header if name.strip() in text} if text else None
    try:
        df = pd.read_csv(p, encoding="utf-8-sig", usecols=usecols, low_memory=False, sep=delimiter, dtype=dtype)
    except UnicodeDecodeError:
        raise non_utf8(p) from None
    except pd.errors.EmptyDataError:
        raise empty_file(p) from None
    except Exception as exc:  # noqa: BLE001
        raise unreadable(p, "csv", exc) from None
    return df, header


def _read_parquet(p: Path, wanted: set[str] | None, required: Sequence[tuple[str, str]],
                  origin: str) -> tuple[pd.DataFrame, list[str]]:
    """(a Parquet file's rows in the ``wanted`` columns, every column name of the file)."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(p).names
    except Exception as exc:  # noqa: BLE001
        raise unreadable(p, "parquet", exc) from None
    check_duplicates(p, names)
    check_header(required, {n.strip() for n in names}, origin, file_columns=[n.strip() for n in names])
    cols = None if wanted is None else [n for n in names if n.strip() in wanted]
    try:
        # pyarrow's own conversion, freeing each Arrow column as it is converted (peak memory:
        # about one copy of the columns read, not two); the same frame as pd.read_parquet
        df = pq.read_table(p, columns=cols).to_pandas(split_blocks=True, self_destruct=True)
        release_arrow_memory()  # the file's compressed pages and the decoding's scratch
    except Exception as exc:  # noqa: BLE001
        raise unreadable(p, "parquet", exc) from None
    return df, list(names)


def _read_stata(p: Path, required: Sequence[tuple[str, str]], origin: str) -> tuple[pd.DataFrame, list[str]]:
    """(a Stata file's rows, every column name); a ``required`` column is looked for in the header
    before the rows are read."""
    if required:
        check_header(required, set(_stata_names(p)), origin)
    try:
        df = pd.read_stata(p)
    except Exception as exc:  # noqa: BLE001
        raise unreadable(p, "dta", exc) from None
    return df, [str(c) for c in df.columns]


def _stata_names(p: Path) -> list[str]:
    try:
        with pd.read_stata(p, iterator=True) as reader:
            names = [str(n) for n in reader.variable_labels()]
    except Exception as exc:  # noqa: BLE001
        raise unreadable(p, "dta", exc) from None
    check_duplicates(p, names)
    return [n.strip() for n in names]


def read_header(path: str | Path | TableFile, *, fmt: str = "auto", delimiter: str = ",") -> list[str]:
    """The column names of a table (stripped) from its header or metadata alone: no row is read
    (a folder: its first Parquet file's). The same checks as :func:`read_table`'s of a header: an
    empty file, a one-column header holding another separator, duplicate names, a file that
    cannot be read."""
    table = path if isinstance(path, TableFile) else locate(path, fmt)
    if table.kind == "csv":
        return [n.strip() for n in _csv_header(table.path, delimiter_char(delimiter), whole=False)]
    if table.kind == "dta":
        return _stata_names(table.path)
    pset = open_parquet_set(table)
    return [n.strip() for n in pset.names[0]]


def read_table(path: str | Path | TableFile, *, fmt: str = "auto", columns: Sequence[str] | None = None,
               delimiter: str = ",", text_columns: Collection[str] | None = None,
               required: Sequence[tuple[str, str]] = ()) -> pd.DataFrame:
    """Read a table (module docstring): ``path`` located by :func:`dptrain.data.files.locate` (or
    a :class:`TableFile` it returned); ``fmt``: ``auto`` (by suffix), ``csv``, ``parquet`` or ``dta``.

    Column names are stripped of surrounding spaces; duplicate names are refused. ``columns``
    (optional) reads only those columns (faster for wide files); names not in the file are
    skipped silently; ``required`` ((setting, column) pairs, e.g. :attr:`Schema.declared_columns`)
    are checked against the header before any row is read (a folder: every file's);
    ``df.attrs["file_columns"]`` keeps every column name of the file (for the caller's messages).
    ``delimiter``: the CSV field separator (``data.delimiter``); ``text_columns``: CSV columns read
    as text, not as numbers (numbers written with data.thousands / data.decimal:
    :attr:`Schema.text_columns`). Raises :class:`DataError` or ConfigError (bad ``fmt`` or
    ``delimiter``)."""
    table = path if isinstance(path, TableFile) else locate(path, fmt)
    wanted = None if columns is None else {str(c).strip() for c in columns}
    if table.kind == "folder":
        return _read_folder(table, wanted, required)
    p = table.path
    if table.kind == "csv":
        text = None if text_columns is None else {str(c).strip() for c in text_columns}
        df, file_columns = _read_csv(p, delimiter_char(delimiter), wanted, text, required, table.origin)
    elif table.kind == "parquet":
        df, file_columns = _read_parquet(p, wanted, required, table.origin)
    else:
        df, file_columns = _read_stata(p, required, table.origin)
    df.columns = [str(c).strip() for c in df.columns]
    check_duplicates(p, list(df.columns))
    if wanted is not None:
        df = df[[c for c in df.columns if c in wanted]]
    df.attrs["file_columns"] = [str(c).strip() for c in file_columns]
    return df


def _read_folder(table: TableFile, wanted: set[str] | None, required: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """A folder of Parquet files as one table (the ``wanted`` columns, files in path order), every
    file's header checked first, naming the file that lacks a ``required`` column."""
    pset = open_parquet_set(table)
    for i, names in enumerate(pset.names):
        stripped = [n.strip() for n in names]
        check_header(required, set(stripped), pset.origin(i), file_columns=stripped)
    frames = [read_rows(pset, i, None, wanted) for i in range(len(pset.files))]
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df.attrs["file_columns"] = frames[0].attrs["file_columns"]
    return df


def release_arrow_memory() -> None:
    """Hand the memory Arrow's allocator kept after a Parquet read back to the operating system
    (the frame's columns lived in Arrow buffers; freed, they stay in the pool for a while): call it
    once the frame is gone. Nothing happens where pyarrow was never imported."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()
