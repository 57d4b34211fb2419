"""A user's table on disk: where it is (:func:`locate`: the ONE check that a data path exists), its
format, and the refusals of reading it, which quote nothing from the file.

Every entry point that reads a user's table (training, a release, predictions, ``dptrain check``)
locates it here, through the one reader (:func:`dptrain.data.reading.read_table`) or, for a
sharded read, through :func:`dptrain.data.parquet.open_parquet_set`. A refusal names the setting
and says what was found in words: never a value, a count of rows or a line number (each may change
with one row, so each is private); a headerless file's "column names" are row values, so those are
not quoted either.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError, bad, closest

FORMATS = ("csv", "parquet", "dta")
CSV_COMPRESSED = (".gz", ".bz2", ".xz")
PARQUET_SUFFIXES = (".parquet", ".pq")
#: what a data path may be, in words (the refusals say it)
ALLOWED = "an existing CSV, Parquet or .dta file, or a folder of Parquet files"


class DataError(DPTrainError):
    """The data does not fit the declared schema, or cannot be read.

    The message names the setting / column, says what was found in words (never a value from
    the file, never a count of rows or entries: those are private) and what is allowed."""


@dataclass(frozen=True)
class TableFile:
    """A located table: ``path`` exists; ``kind`` is ``csv``, ``parquet`` or ``dta`` for a file,
    ``folder`` for a folder of Parquet files (a partitioned data set)."""

    path: Path
    kind: str
    given: str  # the path as the setting wrote it (messages name it so)

    @property
    def origin(self) -> str:
        """How messages name the table: ``data.path='people.csv'``."""
        return f"data.path={self.given!r}"


def detect_format(path: str | Path, fmt: str = "auto") -> str:
    """``csv`` / ``parquet`` / ``dta`` from ``fmt`` or, for ``auto``, from the file suffix."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ConfigError(f"data.format={fmt!r} is not allowed: must be one of auto, {', '.join(FORMATS)}")
        return fmt
    name = Path(path).name.lower()
    if name.endswith(".csv") or any(name.endswith(".csv" + s) for s in CSV_COMPRESSED):
        return "csv"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(".dta"):
        return "dta"
    raise DataError(
        f"data.path={str(path)!r}: cannot tell the format from the file name; allowed suffixes: "
        ".csv, .csv.gz, .csv.bz2, .csv.xz, .parquet, .pq, .dta (or set data.format=csv|parquet|dta)"
    )


def locate(path: str | Path, fmt: str = "auto") -> TableFile:
    """The table at ``path`` (``data.path``), checked before anything is read: it exists; a file's
    format (``fmt``: ``auto`` by its suffix, or ``csv`` / ``parquet`` / ``dta``) and that it is not
    empty; a folder is a Parquet data set (``fmt`` ``auto`` or ``parquet``). Raises DataError (no
    such path, a format not told by the name, an empty file) or ConfigError (``data.format``)."""
    p, given = Path(path), str(path)
    if not p.exists():
        raise DataError(f"data.path={given!r}: no such file; allowed: {ALLOWED}")
    if p.is_dir():
        if fmt not in ("auto", "parquet"):
            raise bad("data.format", fmt, f"a folder (data.path={given!r}) is read as a Parquet data set; "
                      "allowed: auto or parquet")
        return TableFile(p, "folder", given)
    kind = detect_format(p, fmt)
    if p.stat().st_size == 0:
        raise DataError(f"data.path={given!r}: the file is empty (0 bytes, 0 rows); "
                        "allowed: a header and at least one row")
    return TableFile(p, kind, given)


def non_utf8(p: Path) -> DataError:
    # no count of bad lines and no line number: both change with one row (private)
    return DataError(
        f"data.path={str(p)!r}: it contains bytes that are not valid UTF-8; allowed: UTF-8 text. "
        "Re-save the file as UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8, or pandas to_csv(..., encoding='utf-8'))"
    )


def unreadable(p: Path, fmt: str, exc: BaseException, origin: str | None = None) -> DataError:
    """The refusal of a file a parser could not read. The exception text is not quoted: parsers
    may echo a piece of a row, and its line number is a private fact too."""
    return DataError(
        f"{origin or f'data.path={str(p)!r}'}: could not be read as {fmt} ({type(exc).__name__}); "
        f"allowed: a valid CSV, Parquet or Stata .dta file (data.format={fmt} was used)"
    )


def empty_file(p: Path) -> DataError:
    return DataError(f"data.path={str(p)!r}: the file is empty (no header line, 0 rows); "
                     "allowed: a header line and at least one row")


def check_duplicates(p: Path, names: Sequence[str]) -> None:
    """Refuse a header with duplicate column names (after stripping spaces)."""
    stripped = [n.strip() for n in names if n.strip()]
    if len(stripped) != len(set(stripped)):  # no count: a headerless file's "names" are row values
        raise DataError(
            f"data.path={str(p)!r}: the header has duplicate column names (after "
            "stripping spaces); allowed: unique column names"
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


def check_header(required: Sequence[tuple[str, str]], names: Collection[str], origin: str, *,
                 file_columns: Sequence[Any] | None = None) -> None:
    """Refuse ``names`` (a header, or a frame's columns) when it lacks a ``required`` (setting,
    column), e.g. :attr:`Schema.declared_columns`: the one missing-column error
    (:func:`missing_column_error`; the closest names among ``file_columns``, default ``names``)."""
    missing = [(setting, col) for setting, col in required if col not in names]
    if missing:
        raise missing_column_error(missing, list(names if file_columns is None else file_columns), origin)
