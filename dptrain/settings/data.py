"""The ``data`` section: one schema per source (``data=adult | table | synthetic | atlas``) and
its checks, before any row is read."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dptrain.core.validation import (
    bad,
    flag,
    integer,
    one_of,
    real,
)
from dptrain.data import schema_from_config
from dptrain.data.reading import delimiter_char
from dptrain.settings.schemas.data import (  # the schemas: no torch, no pandas
    DATA_SOURCES,
    AdultDataConfig,
    NumericColumn,
    PanelDataConfig,
    TableDataConfig,
    TargetBounds,
)


@dataclass
class DataConfig:
    """Every data setting in one class, for Python callers (``load_dataset(DataConfig(...))``)
    and for reading old run folders; a composed run uses its source's own schema above.

    ``name``: ``adult`` (shipped UCI Adult), ``table`` (the user's CSV / Parquet / .dta file),
    ``synthetic`` (seeded generator for tests) or, for releases, ``atlas`` (simulated cells).
    ``schema``: a shipped public schema by name (``adult``), used instead of the declarations.
    Numeric bounds and category lists are public declarations: nothing is fitted on private rows.
    """

    name: str = "adult"
    schema: str | None = None
    path: str | None = None
    format: str = "auto"  # auto | csv | parquet | dta
    delimiter: str = ","
    target: str = "income"
    positive: str | None = None  # label of the positive class (binary target)
    negative: str | None = None  # label of the negative class (required with positive)
    classes: list[Any] | None = None  # a multiclass target's declared classes
    target_bounds: TargetBounds | None = None  # a continuous target's declared bounds
    numeric: dict[str, NumericColumn] = field(default_factory=dict)
    categorical: dict[str, list[Any]] = field(default_factory=dict)
    label_map: dict[str, dict[str, Any]] = field(default_factory=dict)  # per column: file label -> declared label
    unlisted: str = "other"  # other | drop : a categorical value not in its declared list
    nonfinite: str = "drop"  # drop | error : a missing, NaN, inf or non-numeric entry of a numeric column
    thousands: str | None = None  # digit-group separator of numbers written as text
    decimal: str = "."  # decimal mark of numbers written as text
    split_column: str | None = None  # column holding "train"/"test"; else a per-row hash split
    test_fraction: float = 0.25
    split_key: list[str] | None = None  # the hash split's key columns; None: every column of the file
    privacy_unit: str | None = None  # the column whose value is the unit of privacy; None: one row
    exclude: list[str] = field(default_factory=list)  # adult only: shipped-schema columns left out of the features
    test_public: bool = False
    sharding: str = "auto"  # table only: auto | row_groups | off (dptrain.data.shards)
    cache: str | None = None  # table only: a folder for the encoded rows (dptrain.data.cache)
    n_rows: int = 20000  # synthetic only
    n_features: int = 10  # synthetic only
    generator: str = "atlas"  # atlas only: atlas | figure2
    n_cells: int = 2000  # atlas only


TRAIN_DATA = ("adult", "table", "synthetic", "panel")


def check_source(d: Any, allowed: tuple[str, ...], purpose: str) -> None:
    """``data.name`` is one of ``allowed`` and matches the source's own schema (data=NAME picks
    both: ``data.name=table`` on top of ``data=adult`` would read Adult's keys as a table's)."""
    one_of("data", d.name, allowed)
    for name, schema in DATA_SOURCES.items():
        if isinstance(d, schema) and d.name != name:
            raise bad("data.name", d.name, f"the source is chosen with the config group data={d.name} (this config "
                      f"was composed from data={name}, whose keys differ); allowed for {purpose}: "
                      + ", ".join(f"data={a}" for a in allowed))


def as_source(d: Any) -> Any:
    """A data section given as a plain mapping (a data config of the user's own --config-dir
    without ``defaults: [/schema/data/NAME@_here_]``) as its source's dataclass, so that its keys
    are checked like a shipped source's; anything else unchanged."""
    if not isinstance(d, Mapping):
        return d
    name = d.get("name")
    one_of("data.name", name, tuple(DATA_SOURCES))
    schema = DATA_SOURCES[name]
    names = [f.name for f in dataclasses.fields(schema)]
    extra = [k for k in d if k not in names]
    if extra:
        raise bad(f"data.{extra[0]}", d[extra[0]], f"not a setting of data={name}; allowed: {', '.join(names)}")
    values = dict(d)
    try:
        if isinstance(values.get("numeric"), Mapping):
            values["numeric"] = {k: NumericColumn(**v) if isinstance(v, Mapping) else v
                                 for k, v in values["numeric"].items()}
        if isinstance(values.get("target_bounds"), Mapping):
            values["target_bounds"] = TargetBounds(**values["target_bounds"])
        return schema(**values)
    except TypeError as err:  # an unknown key of a numeric column
        raise bad("data.numeric", values.get("numeric"), f"each column takes lower, upper, transform ({err})") from None


def check_data(d: Any) -> None:
    """The data settings of a training run; the schema itself is checked by the data module's
    own parser (the one place that reads it), before any row is read."""
    if d.name == "atlas":
        raise bad("data", d.name, "simulated Atlas cells are for task=release (experiment=mos_atlas)")
    check_source(d, TRAIN_DATA, "training")
    flag("data.test_public", d.test_public)
    if isinstance(d, (TableDataConfig, DataConfig)):  # a file's settings (DataConfig: a Python caller's, every key)
        check_file_settings(d, table=d.name == "table")
    if not isinstance(d, AdultDataConfig):
        real("data.test_fraction", d.test_fraction, "must be a number in (0, 1)", lo=0, hi=1, lo_open=True,
             hi_open=True)
    if isinstance(d, PanelDataConfig):
        integer("data.n_units", d.n_units, 2)
        integer("data.max_rows", d.max_rows, 1, "must be an integer in [1, 1000]")
        if d.max_rows > 1000:
            raise bad("data.max_rows", d.max_rows, "must be an integer in [1, 1000]")
        integer("data.n_features", d.n_features, 1)
    numeric = {} if isinstance(d, (AdultDataConfig, PanelDataConfig)) else d.numeric
    categorical = d.categorical if isinstance(d, (TableDataConfig, DataConfig)) else {}
    if not isinstance(numeric, Mapping) or not isinstance(categorical, Mapping):
        raise bad("data.numeric/data.categorical", (numeric, categorical),
                  "must map column names to {lower: ..., upper: ...} / to lists of category labels")
    schema_from_config(d)


def check_file_settings(d: TableDataConfig | DataConfig, *, table: bool = True) -> None:
    """How a table file is read (data=table): its path, format, separators, rules, sharding, cache."""
    path = d.path
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise bad("data.path", path, "must be the path of a CSV, Parquet or .dta file (or null)")
    if table and not path:
        raise bad("data.path", path, "data=table needs the path of a CSV, Parquet or .dta file")
    one_of("data.format", d.format, ("auto", "csv", "parquet", "dta"))
    check_delimiter(d.delimiter)
    one_of("data.nonfinite", d.nonfinite, ("drop", "error"))
    one_of("data.sharding", d.sharding, ("auto", "row_groups", "off"))
    cache = d.cache
    if cache is not None and (not isinstance(cache, (str, os.PathLike)) or not str(cache).strip()):
        raise bad("data.cache", cache, "a folder path for the encoded rows, or null")


def check_delimiter(delimiter: Any) -> None:
    """``data.delimiter``: one character that can separate CSV fields (``\\t`` or ``tab``: a tab)."""
    delimiter_char(delimiter)
