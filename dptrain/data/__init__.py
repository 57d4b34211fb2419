"""Data loading: the shipped UCI Adult file, the user's table, or a seeded synthetic set.

Every source goes through the same PUBLIC-schema encoding (:mod:`dptrain.data.encoding`): numeric
columns clipped to declared bounds and scaled to [0, 1], categorical columns one-hot over the
declared list plus an ``<other>`` slot, a binary target (or a multiclass one over the declared
``data.classes``, or a continuous one scaled by the declared ``data.target_bounds``); nothing is
fitted on the rows. Without
a ``split_column`` the train/test split is a per-row keyed hash that adding or removing one row
cannot change for any other row. Errors and logs never quote a value or a count of rows.

Each source has its own settings (``dptrain.settings.data.DATA_SOURCES``); :func:`declaration` turns
any of them into the one explicit schema declaration (target, positive, numeric, categorical,
split): Adult's comes from the shipped file ``adult/schema.yaml`` (``data.schema: adult``).

Public API::

    DataSource, data_source(settings), Dataset, DataError, load_dataset(source, *, seed),
    read_table(path, *, fmt="auto"), declaration(settings), schema_from_config(settings),
    write_data_diagnostics(run_dir, data)

:func:`data_source` is the one reading of a run's data settings; every loader takes its value.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from dptrain.core.validation import ConfigError, field_of
from dptrain.data import synthetic
from dptrain.data.cache import cache_key, check_writable
from dptrain.data.cache import load as load_cached
from dptrain.data.cache import store as store_cached
from dptrain.data.dataset import Dataset, build_dataset, check_rows, dataset_from_rows, diagnostics, encode_checked
from dptrain.data.encoding import encode_features
from dptrain.data.files import DataError, locate
from dptrain.data.reading import read_table, release_arrow_memory
from dptrain.data.schema import OTHER, Schema, numeric_spec
from dptrain.data.schema import schema_from_config as _schema_from_declaration
from dptrain.data.source import DataSource
from dptrain.data.split import check_seed
from dptrain.runfolder.tracking import private_dir, write_json

__all__ = [
    "DataSource",
    "data_source",
    "public_schema",
    "ADULT_FILE",
    "ADULT_SOURCE",
    "DIAGNOSTICS_FILE",
    "OTHER",
    "SCHEMAS",
    "DataError",
    "Dataset",
    "Schema",
    "declaration",
    "encode_features",
    "load_adult_frame",
    "load_dataset",
    "numeric_spec",
    "read_table",
    "schema_from_config",
    "verify_sha256",
    "write_data_diagnostics",
]

log = logging.getLogger("dptrain.data")

ADULT_DIR = Path(__file__).resolve().parent / "adult"
ADULT_FILE = ADULT_DIR / "adult.csv.gz"
ADULT_SUMS = ADULT_DIR / "SHA256SUMS"
#: shipped public schemas, by the short key of ``data.schema``
SCHEMAS = {"adult": ADULT_DIR / "schema.yaml"}
DIAGNOSTICS_FILE = "data_diagnostics.json"  # under private/: PRIVATE counts about the rows
ADULT_SOURCE = (
    "UCI Adult (Becker & Kohavi 1996, UCI Machine Learning Repository, "
    "https://doi.org/10.24432/C5XW20, CC BY 4.0), shipped as dptrain/data/adult/adult.csv.gz"
)


def _expected_sha256(name: str = "adult.csv.gz") -> str:
    try:
        text = ADULT_SUMS.read_text()
    except OSError:
        raise DataError(f"the shipped checksum file {ADULT_SUMS} is missing; "
                        "reinstall dptrain or run scripts/build_adult.py") from None
    for line in text.splitlines():
        m = re.fullmatch(r"([0-9a-fA-F]{64})\s+\*?(\S+)", line.strip())
        if m and m.group(2) == name:
            return m.group(1).lower()
    raise DataError(f"{ADULT_SUMS} has no SHA-256 line for {name}; run scripts/build_adult.py")


def verify_sha256(path: str | Path, expected: str) -> None:
    """Raise DataError unless the file's SHA-256 equals ``expected`` (hex)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"the data file {str(p)!r} does not exist; reinstall dptrain or run scripts/build_adult.py")
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    got = h.hexdigest()
    if got != expected.lower():
        raise DataError(
            f"the data file {str(p)!r} fails its integrity check: SHA-256 {got} != expected {expected.lower()} "
            "(from dptrain/data/adult/SHA256SUMS); the file is corrupt or modified. Rebuild it with "
            "scripts/build_adult.py or reinstall dptrain"
        )


def load_adult_frame(path: str | Path | None = None, *, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The shipped Adult table (48,842 rows incl. the ``split`` column), SHA-256 verified.
    ``path`` (for tests) reads another copy, still checked against the shipped SHA256SUMS."""
    p = Path(path) if path is not None else ADULT_FILE
    verify_sha256(p, _expected_sha256())
    return read_table(p, fmt="csv", columns=columns)


def _synthetic_schema(settings: Any) -> tuple[int, int, dict[str, Any]]:
    n_rows, n_features = field_of(settings, "n_rows"), field_of(settings, "n_features")
    for setting, v, lo in (("data.n_rows", n_rows, 2), ("data.n_features", n_features, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{setting}={v!r} is not allowed: must be an integer >= {lo}")
    if field_of(settings, "categorical"):
        raise ConfigError("data.categorical is not allowed for data=synthetic: "
                          "the generator has numeric columns x0..x{n-1} only")
    declared = dict(field_of(settings, "numeric") or {})
    cols = synthetic.feature_columns(n_features)
    for name in declared:
        if not re.fullmatch(r"x\d+", str(name)):
            raise ConfigError(f"data.numeric.{name} is not allowed for data=synthetic: "
                              f"the generated columns are x0..x{n_features - 1}")
    numeric = {c: declared.get(c, {"lower": synthetic.LOWER, "upper": synthetic.UPPER}) for c in cols}
    return n_rows, n_features, numeric


DECLARATION_KEYS = ("target", "positive", "negative", "classes", "target_bounds", "numeric", "categorical",
                    "split_column", "nonfinite", "test_fraction", "split_key", "label_map", "unlisted", "thousands",
                    "decimal", "privacy_unit")


def shipped_schema(key: Any) -> dict[str, Any]:
    """The shipped public schema named by ``data.schema`` (``adult``), as a plain mapping."""
    if key not in SCHEMAS:
        raise ConfigError(f"data.schema={key!r} is not allowed: must be one of {', '.join(SCHEMAS)} (a shipped "
                          "public schema); your own table declares its schema in data=table's keys")
    return yaml.safe_load(SCHEMAS[key].read_text(encoding="utf-8"))


def _shipped_declaration(settings: Any, key: Any) -> dict[str, Any]:
    """A shipped schema, with the run's own choice of target: ``data.target`` another column of
    the file, declared as ``data.classes`` (multiclass), ``data.target_bounds`` (continuous) or
    ``data.positive`` (binary). That column is then removed from the features (a target is
    never a feature); the shipped target column is not read."""
    for own in ("numeric", "categorical"):
        if field_of(settings, own):
            raise ConfigError(f"data.{own} is not allowed with data.schema={key!r} (the shipped schema "
                              "declares the columns); use data=table to declare your own")
    out = {"nonfinite": "drop", "test_fraction": 0.25, "positive": None, "negative": None, "split_column": None,
           "split_key": None, "classes": None, "target_bounds": None, **shipped_schema(key)}
    exclude = [str(c).strip() for c in (field_of(settings, "exclude") or [])]
    columns = [*out["numeric"], *out["categorical"]]
    for c in exclude:
        if c not in columns:
            raise ConfigError(f"data.exclude={exclude!r} is not allowed: {c!r} is not a feature column of the shipped "
                              f"schema {key!r}; allowed: a list of {', '.join(columns)}")
    out["numeric"] = {c: v for c, v in out["numeric"].items() if c not in exclude}
    out["categorical"] = {c: v for c, v in out["categorical"].items() if c not in exclude}
    target, positive, negative = (field_of(settings, k) for k in ("target", "positive", "negative"))
    bounds = field_of(settings, "target_bounds")
    if bounds is not None and field_of(bounds, "lower") is None and field_of(bounds, "upper") is None:
        bounds = None
    kind_given = field_of(settings, "classes") is not None or bounds is not None
    if target not in (None, "") and str(target).strip() != out["target"]:
        target = str(target).strip()
        if positive is None and not kind_given:  # no silent guess of what the column means
            raise ConfigError(f"data.target={target!r} is not allowed alone with data.schema={key!r}: declare the "
                              "target's PUBLIC kind: data.classes=[...] (multiclass), data.target_bounds={lower: L, "
                              "upper: U} (continuous) or data.positive=LABEL (binary)")
        out["numeric"] = {c: v for c, v in out["numeric"].items() if c != target}
        out["categorical"] = {c: v for c, v in out["categorical"].items() if c != target}
        out.update(target=target, positive=positive, negative=negative)
    elif kind_given:  # the shipped target declared another way
        out.update(positive=positive, negative=negative)
    elif positive is not None or negative is not None:  # the shipped negative goes with the shipped positive only
        shipped = out["positive"]
        out["positive"] = positive if positive is not None else shipped
        keep = out["negative"] if out["positive"] == shipped else None
        out["negative"] = negative if negative is not None else keep
    out.update(classes=field_of(settings, "classes"), target_bounds=bounds)
    return out


def declaration(settings: Any) -> dict[str, Any]:
    """The explicit PUBLIC schema declaration of any data config (a source's dataclass, the
    general ``DataConfig``, a DictConfig or a mapping): target, positive, classes,
    target_bounds, numeric, categorical, split_column, nonfinite, test_fraction, split_key. ``data.schema``
    names a shipped schema (Adult's), whose target a run may replace (:func:`_shipped_declaration`);
    synthetic data declares its target ``y`` and each generated column's range."""
    key = field_of(settings, "schema")
    if key is not None:
        return _shipped_declaration(settings, key)
    out = {k: field_of(settings, k) for k in DECLARATION_KEYS}
    out["nonfinite"] = out["nonfinite"] or "drop"
    out["test_fraction"] = 0.25 if out["test_fraction"] is None else out["test_fraction"]
    if field_of(settings, "name") == "synthetic":
        _, _, numeric = _synthetic_schema(settings)
        out.update(target=out["target"] or "y", numeric=numeric, categorical={})
    if field_of(settings, "name") == "panel":
        numeric = {c: {"lower": synthetic.LOWER, "upper": synthetic.UPPER}
                   for c in synthetic.feature_columns(field_of(settings, "n_features"))}
        out.update(target="y", numeric=numeric, categorical={})
    return out


def schema_from_config(settings: Any, *, numeric: Any = None, require_negative: bool = True) -> Schema:
    """The checked public schema of a data config (any source; :func:`declaration`).
    ``numeric`` replaces the declared numeric columns. Raises ConfigError."""
    return _schema_from_declaration(declaration(settings), numeric=numeric, require_negative=require_negative)


def data_source(settings: Any) -> DataSource:
    """THE reading of a run's data section (a source's settings dataclass, the general
    ``DataConfig``, a DictConfig or a mapping) into the typed :class:`DataSource` the loaders take:
    the checked public schema (:func:`declaration`; a synthetic source's generated columns
    declared) and how to read the rows. No row is read. Raises ConfigError."""
    name = field_of(settings, "name")
    if name not in ("adult", "table", "synthetic", "panel"):
        raise ConfigError(f"data.name={name!r} is not allowed: must be one of adult, table, synthetic, panel")
    path = field_of(settings, "path") if name == "table" else None
    if name == "table" and not path:
        raise ConfigError(f"data.path={path!r} is not allowed: "
                          "data=table needs the path of a CSV, Parquet or .dta file")
    n_rows = n_features = None
    panel = {}  # data=panel's generator sizes: persons, the most rows of one
    if name == "panel":
        n_features = int(field_of(settings, "n_features"))
        panel = {"n_units": int(field_of(settings, "n_units")), "max_rows": int(field_of(settings, "max_rows"))}
    if name == "synthetic":
        n_rows, n_features, numeric = _synthetic_schema(settings)
        schema = schema_from_config(settings, numeric=numeric)
    else:
        schema = schema_from_config(settings)
    if name == "panel" and schema.privacy_unit not in (None, synthetic.PANEL_UNIT):
        raise ConfigError(f"data.privacy_unit={schema.privacy_unit!r} is not allowed for data=panel: its unit "
                          f"column is {synthetic.PANEL_UNIT}; allowed: {synthetic.PANEL_UNIT} | null")
    if schema.privacy_unit is not None and field_of(settings, "cache"):
        raise ConfigError(f"data.cache={field_of(settings, 'cache')!r} is not allowed with data.privacy_unit="
                          f"{schema.privacy_unit!r}: the encoded-rows cache does not keep the units; allowed: "
                          "data.cache=null")
    if name == "adult" and field_of(settings, "path"):
        log.warning("data.path is ignored for data.name=adult (the shipped file is used)")
    return DataSource(name=name, schema=schema, path=None if path is None else str(path),
                      format=field_of(settings, "format") or "auto", delimiter=field_of(settings, "delimiter") or ",",
                      cache=field_of(settings, "cache") or None, sharding=field_of(settings, "sharding") or "auto",
                      n_rows=n_rows, n_features=n_features, privacy_unit=schema.privacy_unit,
                      **panel)


def public_schema(settings: Any) -> Schema:
    """The public schema of a data section (:func:`data_source`; no row is read)."""
    return settings.schema if isinstance(settings, DataSource) else data_source(settings).schema


def load_dataset(data: DataSource | Any, *, seed: int) -> Dataset:
    """Load and encode the rows of ``data`` (a :class:`DataSource`; a Python caller may give the
    data settings, read once by :func:`data_source`). ``seed`` keys the per-row hash split (when
    there is no ``split_column``: each row's side depends on its own content and the seed only, so
    no row moves another; :func:`dptrain.data.split.split_scores`) and seeds the synthetic generator.

    * ``adult``: the shipped file (SHA-256 checked), split by ``split_column`` (``split``);
    * ``table``: the path in its format (a folder: its Parquet files, in path order;
      a distributed run's shard of it: :func:`dptrain.data.shards.load_training_data`);
    * ``synthetic``: :func:`dptrain.data.synthetic.make_synthetic` (``n_rows``, ``n_features``).

    Raises ConfigError (bad schema / settings) or DataError (the data does not fit)."""
    source = data if isinstance(data, DataSource) else data_source(data)
    schema = source.schema
    if source.name == "adult":
        df = load_adult_frame(columns=schema.read_columns)
        return build_dataset(df, schema, seed=seed, source=ADULT_SOURCE, origin="the shipped Adult file")
    if source.name == "table":
        return _load_table(source, seed=seed)
    if source.name == "panel":
        df = synthetic.make_panel(source.n_units, source.max_rows, source.n_features, seed=check_seed(seed))
        described = (f"generated panel (dptrain.data.synthetic.make_panel), seed={seed}, n_units={source.n_units}, "
                     f"max_rows={source.max_rows}, n_features={source.n_features}; generated, no licence")
        return build_dataset(df, schema, seed=seed, source=described, origin="the generated panel")
    df = synthetic.make_synthetic(source.n_rows, source.n_features, seed=check_seed(seed), target=schema.target)
    described = (
        f"synthetic logistic-model data (dptrain.data.synthetic), seed={seed}, n_rows={source.n_rows}, "
        f"n_features={source.n_features}; generated, no licence"
    )
    return build_dataset(df, schema, seed=seed, source=described, origin="the synthetic data")


def _load_table(source: DataSource, *, seed: int) -> Dataset:
    """data=table: the file (or Parquet folder) read and encoded, or its encoded rows from
    ``data.cache`` (:mod:`dptrain.data.cache`: keyed by the file's bytes, the declaration and the
    seed; written after the first encoding). The same checks run either way."""
    path, schema = source.path, source.schema
    fmt, delimiter, cache = source.format, source.delimiter, source.cache
    table = locate(path, fmt)  # a file, or a partitioned Parquet data set (a folder), read whole
    key, rows = None, None
    if cache:
        check_writable(cache)
        key = cache_key(path, schema, seed=check_seed(seed), fmt=fmt, delimiter=delimiter)
        rows = load_cached(cache, key)
    if rows is None:
        df = read_table(table, columns=schema.read_columns, delimiter=delimiter, text_columns=schema.text_columns,
                        required=schema.declared_columns)
        rows = encode_checked(df, schema, seed=seed, origin=table.origin, holder=True)
        del df  # the raw columns: only the encoded rows are kept
        release_arrow_memory()
        if cache:
            store_cached(cache, key, rows)
            log.info("data: encoded rows written to data.cache (later runs with this file, schema and seed read "
                     "them from there)")
    else:
        check_rows(rows.facts, schema, table.origin, holder=True)
        log.info("data: encoded rows read from data.cache (the same file, schema and seed)")
    kind = "parquet" if table.kind == "folder" else table.kind
    described = f"user table {str(path)!r} ({kind}); attribution/licence: as given by the data owner"
    return dataset_from_rows(rows, schema, source=described, diagnostics=diagnostics(rows.facts))


def write_data_diagnostics(run_dir: str | Path, data: Dataset) -> dict[str, str]:
    """Write the data's PRIVATE diagnostics (how many values were clipped into the declared
    bounds, per column; how many rows the declared rules read, left out, lumped, relabelled) to
    ``<run_dir>/private/data_diagnostics.json``; returns the FILES.txt
    entry ({path: description}) for the run's private files ({} when there is nothing to write)."""
    if not data.diagnostics:
        return {}
    write_json(private_dir(Path(run_dir)) / DIAGNOSTICS_FILE, data.diagnostics)
    return {f"private/{DIAGNOSTICS_FILE}": DIAGNOSTICS_NOTE}


DIAGNOSTICS_NOTE = ("counts about the private rows: values clipped into the declared bounds, per column; rows read, "
                    "left out, lumped into <other> and relabelled by the declared rules; with data.privacy_unit, the "
                    "units, the rows per unit and the rows the cap per unit dropped")
