"""Row blocks for the encoding pass of large tables (:mod:`dptrain.data.encoding`): the rows are
visited in blocks of :data:`BLOCK_ROWS`, so that each value is touched a small, fixed number of
times and every float64 or uint64 temporary is one block long (it stays in the CPU cache), and the
split's keyed SplitMix64 hash is computed in place, block by block.

Nothing here knows about schemas or privacy: numpy arrays in, numpy arrays out. The hash is the
same function as before this module existed, bit for bit (``tests/test_data_blocks.py`` checks it
against the plain whole-array version).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

#: rows per block: 65,536 rows of 8-byte words are 512 KiB, a few such arrays fit in L2/L3
BLOCK_ROWS = 1 << 16

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def row_blocks(n: int, size: int = BLOCK_ROWS) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive blocks covering range(n)."""
    for start in range(0, n, size):
        yield start, min(n, start + size)


T = TypeVar("T")


def map_blocks(n: int, fn: Callable[[int, int], T], workers: int = 1, size: int = BLOCK_ROWS) -> list[T]:
    """``fn(start, stop)`` for every block of range(n), in block order; with ``workers`` > 1 the
    blocks run on that many threads (numpy releases the GIL in the work of a block). ``fn`` must
    write only its own block's part of any shared output, so the result does not depend on the
    threads' order: the same bits with 1 or 8 workers."""
    spans = list(row_blocks(n, size))
    if workers <= 1 or len(spans) <= 1:
        return [fn(a, b) for a, b in spans]
    with ThreadPoolExecutor(max_workers=min(workers, len(spans)), thread_name_prefix="dptrain-blocks") as pool:
        return list(pool.map(lambda span: fn(*span), spans))


def take(a: np.ndarray, rows: np.ndarray | None, start: int, stop: int) -> np.ndarray:
    """``a``'s entries for block [start, stop) of the kept rows: a slice (a view) when every row is
    kept (``rows`` None), else a gather of ``rows[start:stop]``."""
    return a[start:stop] if rows is None else a[rows[start:stop]]


def mix_(h: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser applied in place to a uint64 array (``tmp``: scratch of its shape)."""
    np.right_shift(h, 30, out=tmp)
    h ^= tmp
    h *= _M1
    np.right_shift(h, 27, out=tmp)
    h ^= tmp
    h *= _M2
    np.right_shift(h, 31, out=tmp)
    h ^= tmp
    return h


def keyed_(x: np.ndarray, keys: tuple[int, int], tmp: np.ndarray) -> np.ndarray:
    """x <- mix(mix(x ^ k1) ^ k2), in place: two keyed SplitMix64 rounds."""
    x ^= np.uint64(keys[0])
    mix_(x, tmp)
    x ^= np.uint64(keys[1])
    return mix_(x, tmp)


def keyed_word(key: bytes, data: bytes) -> int:
    """A 64-bit word: BLAKE2b of ``data`` keyed by ``key`` (the hash's per-column keys, a label's word)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=key).digest(), "little")


def round_keys(key: bytes, name: bytes) -> tuple[int, int]:
    """The two keys of :func:`keyed_` for the hash step called ``name``."""
    return keyed_word(key, name + b"/1"), keyed_word(key, name + b"/2")


def occurrences(words: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Per entry of ``words`` (uint64), how many earlier entries (in array order) hold the same
    word (and, with ``groups``, the same group): 0 for the first copy of a value, 1 for the second,
    and so on. Adding or removing one entry changes the numbers of that value's later copies only,
    so the multiset of (word, occurrence) pairs changes by exactly one pair. Linear time (a hash
    table, pandas' factorize); the sort runs over the repeated values only."""
    n = len(words)
    out = np.zeros(n, dtype=np.int64)
    if n < 2:
        return out
    keys = words if groups is None else pd.MultiIndex.from_arrays([words, groups])
    codes, uniques = pd.factorize(keys)
    if len(uniques) == n:
        return out  # every value once: the common case of a table with a continuous column
    counts = np.bincount(codes, minlength=len(uniques))
    repeated = np.flatnonzero(counts[codes] > 1)  # ascending: array order within each value
    sub = codes[repeated]
    order = np.argsort(sub, kind="stable")
    ordered = sub[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    rank = np.arange(len(sub)) - np.repeat(starts, np.diff(np.r_[starts, len(sub)]))
    out[repeated[order]] = rank
    return out


@dataclass(frozen=True)
class HashKeys:
    """The keys of :func:`hash_scores`: one pair per column, the start word, the end pair and
    (telling identical rows apart) the occurrence pair."""

    columns: Sequence[tuple[int, int]]
    start: int
    end: tuple[int, int]
    occurrence: tuple[int, int] | None = None

    @classmethod
    def derive(cls, key: bytes, columns: int, *, occurrence: bool = True) -> HashKeys:
        """Every key derived from one secret-or-public ``key`` (:func:`round_keys`, :func:`keyed_word`)."""
        return cls([round_keys(key, b"column %d" % j) for j in range(columns)], keyed_word(key, b"start"),
                   round_keys(key, b"end"), round_keys(key, b"occurrence") if occurrence else None)


def hash_scores(n: int, words: Sequence[Callable[[int, int], np.ndarray]], keys: HashKeys, *, workers: int = 1,
                groups: np.ndarray | None = None) -> np.ndarray:
    """u in [0, 1) per row: h = keys.start; for each column j, h = mix(h ^ keyed_j(word_j));
    then keyed_end(h), whose top 53 bits scaled by 2^-53 are u. ``words[j](start, stop)`` returns
    column j's uint64 words for the block, as a fresh array (it is overwritten). Used by the hash
    split (:func:`dptrain.data.split.split_scores`) and task=tune's validation rows
    (:func:`dptrain.inference.subsample.row_uniform`).

    With ``keys.occurrence``, identical rows are told apart by their occurrence number among the
    rows of the same content (:func:`occurrences`; within each of ``groups`` when given): the k-th
    copy (k >= 1) hashes ``h ^ keyed_occ(k)`` (with ``groups``: ``keyed_occ(k ^ keyed_occ(group))``),
    so every copy's u is an independent draw, while the first copy's u (and every row of a table
    without repeats) is the plain content hash."""
    column_keys, start_word, end_keys, occurrence_keys = keys.columns, keys.start, keys.end, keys.occurrence
    out = np.empty(n, dtype=np.float64)
    h_all = out.view(np.uint64)  # the content words live in the output's memory until they become u

    def content(start: int, stop: int) -> None:
        h = np.full(stop - start, start_word, dtype=np.uint64)
        tmp = np.empty_like(h)
        for word, keys in zip(words, column_keys):
            h ^= keyed_(word(start, stop), keys, tmp)
            mix_(h, tmp)
        h_all[start:stop] = h

    def finish(start: int, stop: int) -> None:
        h = h_all[start:stop].copy()
        keyed_(h, end_keys, np.empty_like(h))
        h >>= np.uint64(11)
        out[start:stop] = h
        out[start:stop] *= 2.0**-53

    map_blocks(n, content, workers)
    if occurrence_keys is not None:
        occ = occurrences(h_all, groups)
        copies = np.flatnonzero(occ)
        if copies.size:
            k = occ[copies].astype(np.uint64)
            if groups is not None:
                g = np.asarray(groups)[copies].astype(np.uint64)
                k ^= keyed_(g, occurrence_keys, np.empty_like(g))
            h_all[copies] ^= keyed_(k, occurrence_keys, np.empty_like(k))
    map_blocks(n, finish, workers)
    return out
