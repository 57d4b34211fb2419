"""The train/test split of a table's rows: the ``split_column`` ("train"/"test"), or else a per-row
keyed hash split (:func:`split_scores`) that no single row can move.

Each kept row gets ``u = H_salt(row) in [0, 1)`` and goes to the test part iff ``u <
data.test_fraction``. ``H`` is a keyed 64-bit hash of the row's content in the split's key columns
(``data.split_key``, e.g. an id column, or by default every column of the file: the whole raw row,
so models with different feature sets are compared on the same rows) and of its occurrence number
among identical rows. The salt is derived from the run's ``seed`` (public: the same seed gives the
same split, another seed another split). A row's side depends on that row alone, so adding or
removing a row (anywhere in the file, or through ``data.nonfinite=drop``) moves no other row. The
test part is about ``test_fraction`` of the rows, not exactly (its size is itself a private count
and is never logged). The permutation split used before moved hundreds of rows of a 1,000-row
table when one row was added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch

from dptrain.core.validation import ConfigError
from dptrain.data.blocks import HashKeys, hash_scores, keyed_word, take
from dptrain.data.files import DataError
from dptrain.data.labels import cell_label, factorize, label_codes
from dptrain.data.schema import Schema


def split_salt(seed: int) -> bytes:
    """The 16-byte key of the hash split, derived from the run's (public) ``seed`` with BLAKE2b."""
    return hashlib.blake2b(str(check_seed(seed)).encode(), digest_size=16, person=b"dptrain-split").digest()


def _label_words(col: pd.Series, rows: np.ndarray | None, salt: bytes) -> Callable[[int, int], np.ndarray]:
    """Per block of the kept rows, one keyed 64-bit word per row: BLAKE2b of the cell's
    stripped-string label (one marker, not valid UTF-8, for a missing cell). Only the distinct
    values are hashed (once, for every block)."""
    codes, uniques = factorize(col)
    labels = [cell_label(u) for u in uniques]
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
    # with data.privacy_unit the key is the unit and its rows are NOT told apart: one u per unit,
    # so all of a unit's rows fall on one side
    keys = HashKeys.derive(salt, len(key), occurrence=schema.privacy_unit is None)
    return hash_scores(n, words, keys, workers=torch.get_num_threads(), groups=groups)


def in_test_part(df: pd.DataFrame, schema: Schema, idx: np.ndarray, seed: int,
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


def check_seed(seed: Any) -> int:
    """The run's ``seed`` (it keys the split and the synthetic generator): an integer >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed={seed!r} is not allowed: must be an integer >= 0")
    return int(seed)
