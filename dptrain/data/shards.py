"""A sharded read: each process of a distributed run reads ONLY its own part of a partitioned
Parquet data set (``trainer.distributed=true``, ``data=table``, docs/distributed.md).

A partitioned data set is a folder of Parquet files (``.parquet`` / ``.pq``, read in the order
of their paths) or one Parquet file with several row groups. Its pieces are the row groups that
hold rows. Which process reads which pieces is decided from the files' metadata alone (the file
list, sorted by path, and each row group's row count), the same way on every process: the pieces,
largest first (ties: file order), each go to the process with the fewest rows so far (ties: the
lowest rank). The shards are disjoint whole row groups, cover every row exactly once and are
balanced by rows; every process gets at least one piece (there are at least as many pieces as
processes, or the run is refused before any row is read).

Each process encodes its rows with the PUBLIC schema (:func:`dptrain.data.encoding.encode_rows`):
bounds, category lists, the declared rules and the per-row keyed hash split depend on the row
alone, so a shard's encoding and split are exactly the whole table's for those rows. The check
that needs every row (at least one training row) runs on facts combined over the processes
(``all_gather_object``), and so does an error: a process whose
shard is refused shares the message and every process raises the same error before training. The
job's N (training rows) and test count are the sums of the processes' counts; no process holds
every row. The row counts (the pieces' sizes included) are never logged or written anywhere
public; the private diagnostics (values clipped, rows left out, lumped, relabelled) are summed over
the processes, and rank 0 logs their one console line for the data holder.

``data.sharding``: ``auto`` (default: shard when the data set is partitioned, i.e. has at least
2 pieces), ``row_groups`` (always shard; refuse what cannot be) or ``off`` (every process reads
the whole table and keeps rows r, r + W, ...). A folder is also read whole by a run in one
process (:func:`read_folder`). What a sharded run cannot do is refused by name
(:func:`sharding_plan`): the non-private baseline (``trainer.baseline=true``, it needs every
training row in one process), fewer pieces than processes, a file that is not Parquet with
``row_groups``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError, bad
from dptrain.data import load_dataset
from dptrain.data.dataset import Dataset, check_rows, dataset_from_rows, diagnostics
from dptrain.data.encoding import EncodedRows, encode_rows
from dptrain.data.files import DataError, locate
from dptrain.data.parquet import ParquetSet, Piece, check_columns, open_parquet_set, read_rows
from dptrain.data.rules import add_counts
from dptrain.data.schema import Schema
from dptrain.data.source import DataSource

log = logging.getLogger("dptrain.data")

SHARDING = ("auto", "row_groups", "off")
#: how a sharded run's privacy report describes its shards (no count: the pieces' sizes are private)
SHARDED_NOTE = ("disjoint shards of whole Parquet row groups, assigned from the files' metadata (each process reads "
                "only its own), each Poisson-sampled at the job's q with a rank-specific stream")


def assign_pieces(rows: Sequence[int], world: int) -> list[int]:
    """The rank that reads each piece (``rows``: the pieces' row counts, in piece order):
    largest first (ties: piece order), each to the rank with the fewest rows so far (ties: the
    lowest rank). Deterministic; with at least ``world`` non-empty pieces every rank gets one."""
    if world < 1:
        raise ValueError("world must be >= 1")
    owner = [0] * len(rows)
    load = [(0, r) for r in range(world)]  # a heap of (rows so far, rank)
    for i in sorted(range(len(rows)), key=lambda i: (-rows[i], i)):
        total, rank = heapq.heappop(load)
        owner[i] = rank
        heapq.heappush(load, (total + rows[i], rank))
    return owner


def shard_pieces(pset: ParquetSet, rank: int, world: int) -> list[Piece]:
    """The pieces ``rank`` of ``world`` reads, in file and row-group order."""
    owner = assign_pieces([p.rows for p in pset.pieces], world)
    return [p for p, r in zip(pset.pieces, owner, strict=True) if r == rank]


# ------------------------------------------------------------------------------ the plan


def sharding_plan(source: DataSource, *, world: int | None, baseline: bool = False,
                  estimator: str = "dpsgd") -> ParquetSet | None:
    """The Parquet set this distributed run of ``world`` processes reads sharded, or None when
    every process reads the whole table (not distributed: ``world`` None; not data=table; not
    Parquet; not partitioned with ``data.sharding=auto``; ``data.sharding=off``). ``baseline``
    (trainer.baseline) and ``estimator`` (estimator.name) are refused on a sharded read. Reads
    metadata only. Raises ConfigError for what a sharded read cannot do, before any row is read."""
    mode = source.sharding
    if mode not in SHARDING:
        raise bad("data.sharding", mode, f"must be one of {', '.join(SHARDING)}")
    if source.name != "table" or mode == "off":
        return None
    if world is None:
        if mode == "row_groups":
            raise bad("data.sharding", mode, "needs trainer.distributed=true (a sharded read splits the data set "
                      "across torchrun processes); allowed without it: auto or off")
        return None
    path = source.path
    table = locate(path, source.format)
    if table.kind not in ("folder", "parquet"):
        if mode == "row_groups":
            raise bad("data.sharding", mode, f"reads Parquet row groups, and data.path={str(path)!r} is not Parquet; "
                      "allowed: a .parquet file or a folder of Parquet files, or data.sharding=auto|off (every "
                      "process reads the whole table)")
        return None
    pset = open_parquet_set(table)
    k = len(pset.pieces)
    if mode == "auto" and k < 2:
        return None  # not partitioned: every process reads the whole table, as before
    if k < world:
        raise ConfigError(
            f"trainer.distributed=true with {world} processes is not allowed with data.sharding={mode} on "
            f"data.path={str(path)!r}: each process reads whole Parquet row groups, and the data set has {k} row "
            f"group(s) holding rows; allowed: a data set with at least {world} row groups (write it with a smaller "
            "row_group_size, e.g. pyarrow.parquet.write_table(..., row_group_size=...), or as a folder of Parquet "
            f"files), at most {k} processes (torchrun --nproc_per_node), or data.sharding=off (every process "
            "reads the whole table)")
    if baseline:
        raise bad("trainer.baseline", True, "on a sharded read (trainer.distributed=true on a partitioned Parquet "
                  "data set): the non-private sklearn baseline needs every training row in one process; allowed: "
                  "trainer.baseline=false, or data.sharding=off (every process reads the whole table)")
    if source.cache:
        raise bad("data.cache", source.cache, "on a sharded read (trainer.distributed=true on a partitioned Parquet "
                  "data set) each process encodes only its own row groups, so there is no whole table to cache; "
                  "allowed: data.cache=null, or data.sharding=off (every process reads the whole table, or its cache)")
    if estimator != "dpsgd":
        raise bad("estimator", estimator, "on a sharded read: only estimator=dpsgd trains across processes")
    return pset


# ------------------------------------------------------------------------------ reading


def _encode_shard(pset: ParquetSet, pieces: list[Piece], schema: Schema, seed: int) -> EncodedRows:
    """This process' pieces, read (declared columns only) and encoded one file at a time."""
    parts = []
    for file in sorted({p.file for p in pieces}):
        mine = [p for p in pieces if p.file == file]
        df = read_rows(pset, file, [p.row_group for p in mine], schema.read_columns)
        # each row's piece (file, row group): identical rows are numbered within their piece, so the
        # split never depends on which process reads which piece (assign_pieces uses row counts)
        groups = np.repeat([(p.file << 32) | p.row_group for p in mine], [p.rows for p in mine])
        if len(groups) != len(df):
            raise DataError(f"{pset.origin(file)}: the row groups hold other row counts than the file's metadata "
                            "says; allowed: a Parquet file whose metadata matches its rows")
        parts.append(encode_rows(df, schema, seed=seed, groups=groups))
    if not parts:  # not reached through sharding_plan (at least one piece per process)
        raise DataError(f"{pset.origin()}: a process was given no row group; allowed: at least as many row groups "
                        "holding rows as processes")
    if len(parts) == 1:
        return parts[0]
    return EncodedRows(**{k: np.concatenate([getattr(r, k) for r in parts])
                          for k in ("x_train", "y_train", "x_test", "y_test")},
                       facts=combine_facts([r.facts for r in parts], schema))


def combine_facts(parts: Sequence[dict[str, Any]], schema: Schema) -> dict[str, Any]:
    """The facts of the union of disjoint parts' rows (:func:`dptrain.data.encoding.encode_rows`):
    the counts summed, the sides' flags or-ed."""
    rows = parts[0]["rows"]
    for f in parts[1:]:
        rows = add_counts(rows, f["rows"])
    clipped = {c: {k: sum(f["clipped"][c][k] for f in parts) for k in ("below_lower", "above_upper")}
               for c in parts[0]["clipped"]}
    return {"any_train": any(f["any_train"] for f in parts), "any_test": any(f["any_test"] for f in parts),
            "clipped": clipped, "rows": rows}


_ERRORS = {"DataError": DataError, "ConfigError": ConfigError}


def _outcome(exc: DPTrainError) -> dict[str, Any]:
    kind = type(exc).__name__
    return {"error": (kind if kind in _ERRORS else "DataError", str(exc))}


def _raise_first_error(everyone: Sequence[dict[str, Any]]) -> None:
    """Every process raises the lowest rank's error, if any process had one."""
    for other in everyone:
        if "error" in other:
            kind, message = other["error"]
            raise _ERRORS[kind](message)


def load_shard(source: DataSource, pset: ParquetSet, *, seed: int, dist: Any) -> Dataset:
    """This process' shard of ``pset`` (:func:`shard_pieces`) as a :class:`Dataset` whose
    ``shard`` is (rank, world) and whose ``global_n_train`` / ``global_n_test`` are the job's
    counts. ``dist``: a :class:`dptrain.training.distributed.DistContext` (rank, world_size,
    all_gather_objects). Every process raises the same error when any shard is refused."""
    schema = source.schema
    check_columns(pset, schema)  # metadata only: the same on every process
    rank, world = dist.rank, dist.world_size
    pieces = shard_pieces(pset, rank, world)
    try:
        rows = _encode_shard(pset, pieces, schema, seed)
        mine: dict[str, Any] = {"facts": rows.facts, "train": len(rows.y_train), "test": len(rows.y_test)}
    except DPTrainError as exc:
        mine = _outcome(exc)
    except Exception as exc:  # not left waiting: the others raise too
        dist.all_gather_objects({"error": ("DataError", f"{pset.origin()}: the process with rank {rank} failed "
                                           f"reading its shard ({type(exc).__name__}); see that process' output")})
        raise
    everyone = dist.all_gather_objects(mine)
    _raise_first_error(everyone)
    facts = combine_facts([o["facts"] for o in everyone], schema)
    check_rows(facts, schema, pset.origin(), holder=rank == 0)  # the whole data set's check, on every process
    if rank == 0:
        log.info("data: sharded read of %s: %d processes, each reads only its own Parquet row groups", pset.origin(),
                 world)
    source = f"user table {str(pset.path)!r} (parquet); attribution/licence: as given by the data owner"
    return dataset_from_rows(rows, schema, source=source,
                             diagnostics=diagnostics(facts), shard=(rank, world),
                             global_n_train=sum(o["train"] for o in everyone),
                             global_n_test=sum(o["test"] for o in everyone))


def load_training_data(source: DataSource, *, seed: int, dist: Any = None, baseline: bool = False,
                       estimator: str = "dpsgd") -> Dataset:
    """task=train's data: with ``dist`` (trainer.distributed=true) and a partitioned Parquet data
    set, this process' shard (:func:`sharding_plan` refuses first what cannot be sharded, with
    ``baseline`` and ``estimator``); else :func:`dptrain.data.load_dataset`, every row."""
    if dist is None:
        sharding_plan(source, world=None)  # refuses data.sharding=row_groups
        return load_dataset(source, seed=seed)
    try:  # the processes agree on the plan (a path that differs between machines must not mix reads)
        pset = sharding_plan(source, world=dist.world_size, baseline=baseline, estimator=estimator)
        mine = {"plan": None if pset is None else pset.digest()}
    except DPTrainError as exc:
        pset, mine = None, _outcome(exc)
    everyone = dist.all_gather_objects(mine)
    _raise_first_error(everyone)
    if len({o["plan"] for o in everyone}) > 1:
        raise DataError(f"data.path={str(source.path)!r}: the processes see different Parquet files, columns or row "
                        "groups there (a path that is not the same data set on every machine?); allowed: the same "
                        "data set at data.path for every process")
    if pset is None:
        return load_dataset(source, seed=seed)
    return load_shard(source, pset, seed=seed, dist=dist)


# ------------------------------------------------------------------------------ after training


def baseline_data(data: Dataset, dist: Any) -> Any:
    """What :meth:`objective.baseline` reads without fitting (``fit=False``: the sklearn baseline
    is refused on a sharded read) over EVERY process' rows: ``y_test``, all test labels
    (gathered: small against the features), and ``y_train``, a one-row stand-in holding the mean
    of all training labels (the linear objective's predict-the-mean baseline; a mean is all any
    objective reads of them)."""
    (y_test,) = dist.gather_rows(data.y_test)
    sums = dist.all_gather_objects(float(data.y_train.double().sum()))
    mean = sum(sums) / max(data.n_train, 1)
    return SimpleNamespace(y_test=y_test, y_train=torch.tensor([mean], dtype=torch.float64),
                           n_train=data.n_train, n_test=data.n_test)
