"""The encoded data of a run (:class:`Dataset`), and the one check over every row
(:func:`check_rows`): at least one training row, the only refusal that depends on the rows.

Counts of rows or entries (left out, lumped, clipped, per split side) change when one row is added
or removed, so they are private: they are in private/data_diagnostics.json and in ONE console line
marked PRIVATE for the data holder (a user's table), never in an error or a publishable file. The
size N of the training set is public (the accountant's q = B/N uses it), and so is the number of
columns in the header.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from dptrain.core.dataspec import DataSpec
from dptrain.data.encoding import EncodedRows, encode_rows
from dptrain.data.files import DataError, check_header
from dptrain.data.rules import CHECK_HINT, counts_line
from dptrain.data.schema import Schema
from dptrain.data.split import check_seed

log = logging.getLogger("dptrain.data")


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
    #: with data.privacy_unit: each training row's unit (int64 codes 0..n_units-1; PRIVATE), else None
    unit_train: torch.Tensor | None = None
    #: with data.privacy_unit: each test row's unit (int64 codes of the test side's units; PRIVATE), else None
    unit_test: torch.Tensor | None = None

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
        if self.unit_train is not None and (self.unit_train.dtype != torch.int64
                                            or self.unit_train.shape != self.y_train.shape):
            raise ValueError("Dataset.unit_train must be an int64 tensor with one unit code per training row")
        d = len(self.feature_names)
        if self.x_train.shape[1] != d or self.x_test.shape[1] != d:
            raise ValueError("Dataset: feature_names does not match the feature width")

    @property
    def n_train(self) -> int:
        """N, the job's number of training rows (the mechanism's q = B/N): on a sharded read the
        sum over every rank's shard, not this rank's ``x_train`` rows."""
        return int(self.x_train.shape[0]) if self.global_n_train is None else int(self.global_n_train)

    @property
    def n_units(self) -> int | None:
        """With data.privacy_unit: the number of units among the training rows (the accountant's N,
        treated as public as the row count N is); else None."""
        return None if self.unit_train is None else int(self.unit_train.max()) + 1 if len(self.unit_train) else 0

    @property
    def n_accounted(self) -> int:
        """The accountant's N: the number of units with data.privacy_unit, else of training rows."""
        return self.n_train if self.unit_train is None else int(self.n_units)

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
    seed = check_seed(seed)
    check_header(schema.declared_columns, set(df.columns), origin, file_columns=df.attrs.get("file_columns"))
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
        unit_train=None if rows.unit_train is None else torch.from_numpy(np.ascontiguousarray(rows.unit_train)),
        unit_test=None if rows.unit_test is None else torch.from_numpy(np.ascontiguousarray(rows.unit_test)),
        **shard,
    )
