"""Partitioned Parquet data sets from their metadata: the files of a folder, their columns and
row groups (:class:`ParquetSet`), and reading the declared columns of a file's chosen row groups.
A run in one process reads a folder whole (the one reader, :func:`dptrain.data.reading.read_table`);
a distributed run reads only its own row groups (:mod:`dptrain.data.shards`). Row counts from the
metadata are the data's size: used to balance shards, never logged or written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dptrain.data.files import PARQUET_SUFFIXES, DataError, TableFile, check_duplicates, check_header, locate
from dptrain.data.schema import Schema


@dataclass(frozen=True)
class Piece:
    """One row group of one file. ``rows`` comes from the metadata: the data's size, so PRIVATE
    in the sense of docs/privacy.md: used to balance the shards, never logged or written."""

    file: int  # index into ParquetSet.files
    row_group: int
    rows: int


@dataclass(frozen=True)
class ParquetSet:
    """A Parquet file or folder of files, from the metadata only (no row read)."""

    path: Path  # data.path
    files: tuple[Path, ...]  # sorted by path (relative to a folder)
    names: tuple[tuple[str, ...], ...]  # per file: its column names as stored
    pieces: tuple[Piece, ...]  # the row groups that hold rows, in file and row-group order

    @property
    def is_folder(self) -> bool:
        return self.path.is_dir()

    def digest(self) -> str:
        """A digest of what the processes must agree on (file list, columns, row groups); compared
        across processes, never shown."""
        root = self.path if self.is_folder else self.path.parent
        seen = ([f.relative_to(root).as_posix() for f in self.files], self.names,
                [(p.file, p.row_group, p.rows) for p in self.pieces])
        return hashlib.sha256(repr(seen).encode()).hexdigest()

    def origin(self, file: int | None = None) -> str:
        """How messages name the data set (or one of a folder's files): never a value or count."""
        base = f"data.path={str(self.path)!r}"
        if file is None or not self.is_folder:
            return base
        return f"{base} (the folder's file {self.files[file].relative_to(self.path).as_posix()!r})"


# ------------------------------------------------------------------------------ metadata


def parquet_files(folder: Path) -> list[Path]:
    """The Parquet files of a folder (any depth), sorted by their path relative to it; files and
    folders whose names start with '.' or '_' (_SUCCESS, _metadata, .crc, _temporary) are skipped."""
    found = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if any(part.startswith((".", "_")) for part in rel.parts):
            continue
        if p.is_file() and p.name.lower().endswith(PARQUET_SUFFIXES):
            found.append(rel.as_posix())
    return [folder / rel for rel in sorted(found)]


def open_parquet_set(path: str | Path | TableFile, fmt: str = "auto") -> ParquetSet:
    """The files, column names and row groups of a Parquet file or folder (located by
    :func:`dptrain.data.files.locate`), from the metadata only. Raises DataError (no such path, a
    folder without Parquet files, an unreadable footer, duplicate column names) or ConfigError
    (``data.format`` not parquet for a folder)."""
    import pyarrow.parquet as pq

    table = path if isinstance(path, TableFile) else locate(path, fmt)
    p = table.path
    if table.kind == "folder":
        files = parquet_files(p)
        if not files:
            raise DataError(f"{table.origin}: is a folder without .parquet or .pq files; allowed: a CSV, "
                            "Parquet or .dta file, or a folder of Parquet files (a partitioned data set)")
    else:
        files = [p]
    names, pieces = [], []
    for i, f in enumerate(files):
        origin = ParquetSet(p, tuple(files), (), ()).origin(i)
        try:
            meta = pq.ParquetFile(f).metadata
            file_names = tuple(meta.schema.to_arrow_schema().names)
            rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        except Exception as exc:  # noqa: BLE001 - the text may quote the file's bytes: not shown
            raise DataError(f"{origin}: could not be read as parquet ({type(exc).__name__}); allowed: a valid "
                            "Parquet file (data.format=parquet was used)") from None
        check_duplicates(f, list(file_names))
        names.append(file_names)
        pieces += [Piece(i, g, n) for g, n in enumerate(rows) if n > 0]
    return ParquetSet(p, tuple(files), tuple(names), tuple(pieces))


def read_rows(pset: ParquetSet, file: int, row_groups: list[int] | None,
              wanted: Collection[str] | None) -> pd.DataFrame:
    """The ``wanted`` columns (None: all of them, e.g. when the hash split is keyed on the whole
    row: :attr:`Schema.read_columns`) of ``row_groups`` (None: all) of one file, names stripped."""
    import pyarrow.parquet as pq

    cols = [n for n in pset.names[file] if wanted is None or n.strip() in wanted]
    try:
        pf = pq.ParquetFile(pset.files[file])
        table = pf.read(columns=cols) if row_groups is None else pf.read_row_groups(row_groups, columns=cols)
        df = table.to_pandas()
    except Exception as exc:  # noqa: BLE001 - the text may quote the file's bytes: not shown
        raise DataError(f"{pset.origin(file)}: could not be read as parquet ({type(exc).__name__}); allowed: a "
                        "valid Parquet file (data.format=parquet was used)") from None
    df.columns = [str(c).strip() for c in df.columns]
    df.attrs["file_columns"] = [n.strip() for n in pset.names[file]]
    return df


def check_columns(pset: ParquetSet, schema: Schema) -> None:
    """Every file holds every declared column (from the metadata): else the whole-table read's
    missing-column error, naming the first file that lacks one."""
    for i, names in enumerate(pset.names):
        stripped = [n.strip() for n in names]
        check_header(schema.declared_columns, set(stripped), pset.origin(i), file_columns=stripped)
