"""Encoding a table's rows with the PUBLIC schema declared in the data config. Nothing here is
fitted on the rows (docs/privacy.md):

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
  declared one first. Labels compare as stripped strings in Unicode's composed form (NFC,
  :mod:`dptrain.data.labels`);
* train/test split: :mod:`dptrain.data.split` (the ``split_column``, or a per-row keyed hash).

Rows outside the declared domain are handled by declared rules, each row on its own, and counted
(:mod:`dptrain.data.rules`; private/data_diagnostics.json and one console line for the data
holder): nothing about what one row holds is refused (docs/data.md), except with
``data.nonfinite=error``, the user's choice, and dates in a numeric column or nested (list /
struct) labels. The check over every row, and the :class:`~dptrain.data.dataset.Dataset` built from
the encoded rows, are :mod:`dptrain.data.dataset`'s.

Large tables: the rows are encoded in blocks straight into preallocated train and test matrices,
and the split's hash runs in place by blocks (:mod:`dptrain.data.blocks`); a numeric column is
read where pandas holds it, widened to float64 one block at a time. The results are those of the
whole-array computation, bit for bit (docs/large_tables.md).

Error messages name the setting and the column, say what was found in words and what is allowed;
they quote no value read from the file and no count of rows or entries (counts change when one row
is added or removed, so they are private: they are in private/data_diagnostics.json only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from dptrain.core.validation import ConfigError
from dptrain.data.blocks import map_blocks, row_blocks, take
from dptrain.data.files import DataError
from dptrain.data.labels import declared_lookup, label_codes
from dptrain.data.rules import RowCounts, number_shapes, parse_numbers, shape_setting
from dptrain.data.schema import NumericSpec, Schema
from dptrain.data.split import check_seed, in_test_part
from dptrain.data.units import unit_codes, unit_of_rows

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
    v, text = numbers_of(col, Schema(schema.target, None, (), ()))  # 0 and 1, written as numbers (a view)
    missing = np.isnan(v) if v.dtype.kind == "f" else np.zeros(len(v), dtype=bool)
    if text is not None:
        missing &= ~text
    counts.leave_out("target", schema.target, "missing", missing)
    counts.leave_out("target", schema.target, "not_0_or_1", ~missing & (v != 0) & (v != 1))
    return (v == 1).astype(np.float32)


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


def numeric_settings(schema: Schema) -> list[tuple[str, NumericSpec]]:
    """(setting, spec) of every numeric column read: the numeric features and, for a continuous
    target, the target with its declared bounds (``data.target_bounds``)."""
    out = [(f"data.numeric.{s.name}", s) for s in schema.numeric]
    if schema.target_bounds is not None:
        out.append(("data.target_bounds", NumericSpec(schema.target, *schema.target_bounds)))
    return out


def numbers_of(col: pd.Series, schema: Schema) -> tuple[np.ndarray, np.ndarray | None]:
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
    """Numeric columns as numpy arrays (:func:`numbers_of`: views where possible). A missing, NaN,
    infinite or non-numeric entry is refused with ``data.nonfinite=error``; with ``drop`` its row
    is left out, each row on its own, and counted per column and kind (``counts``; private)."""
    nums: dict[str, np.ndarray] = {}
    for setting, spec in numeric_settings(schema):
        col = df[spec.name]
        try:
            v, text = numbers_of(col, schema)
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


def _unit_rule(df: pd.DataFrame, schema: Schema, counts: RowCounts) -> np.ndarray | None:
    """With data.privacy_unit: each row's unit code; a row without a unit id (a missing or empty
    value) belongs to no unit and is left out and counted, like any row outside the declared
    domain (so whether a table runs never depends on one row)."""
    if schema.privacy_unit is None:
        return None
    codes = unit_codes(df[schema.privacy_unit], missing="drop", column=f"data.privacy_unit={schema.privacy_unit!r}")
    counts.leave_out("privacy_unit", schema.privacy_unit, "no_unit_id", codes < 0)
    return codes


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
    #: with data.privacy_unit: each training row's unit, dense int64 codes (dptrain.data.units); else None
    unit_train: np.ndarray | None = None
    #: with data.privacy_unit: each test row's unit, dense int64 codes of the test side's units; else None
    unit_test: np.ndarray | None = None


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
    seed = check_seed(seed)
    counts = RowCounts(len(df))
    nums = _numeric_columns(df, schema, counts)
    y = _target(df[schema.target], schema, nums, counts)
    codes = _category_codes(df, schema, counts)
    _split_column_rule(df, schema, counts)
    units = _unit_rule(df, schema, counts)
    idx = counts.kept()
    kept = None if _all_rows(idx, len(df)) else idx
    y = y if kept is None else y[idx]
    is_test = in_test_part(df, schema, idx, seed, groups) if len(idx) else np.zeros(0, dtype=bool)
    (x_train, x_test), seen = _encode_blocks(schema, nums, codes, kept, is_test, len(idx))
    clipped = seen["clipped"]
    if schema.target_bounds is not None:
        clipped.update(clipped_counts(schema, nums, idx, only=schema.target))
    counts.lumped = seen["lumped"]
    y_train, y_test = y[~is_test], y[is_test]
    unit_train = unit_test = None
    if units is not None:  # the kept rows' units (a row without a unit id is left out: _unit_rule)
        units = units[idx]
        unit_train, unit_test = unit_of_rows(units[~is_test])[0], unit_of_rows(units[is_test])[0]
    facts = {"any_train": len(y_train) > 0, "any_test": len(y_test) > 0, "clipped": clipped,
             "rows": counts.as_dict(train=len(y_train), test=len(y_test))}
    return EncodedRows(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, facts=facts,
                       unit_train=unit_train, unit_test=unit_test)


def clipped_counts(schema: Schema, nums: Mapping[str, np.ndarray], rows: np.ndarray, *,
                   only: str | None = None) -> dict[str, dict[str, int]]:
    """Per numeric column (and a continuous target, under its column's name; ``only``: that column
    alone), how many values of the kept ``rows`` lay below ``lower`` / above ``upper`` and were
    clipped into the declared bounds, compared in float64 block by block. PRIVATE counts: they go
    to private/data_diagnostics.json only; the log (:func:`check_rows`) names the columns, never a
    count."""
    out: dict[str, dict[str, int]] = {}
    for _, spec in numeric_settings(schema):
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
