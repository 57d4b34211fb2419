"""Row blocks for the encoding pass of large tables (:mod:`dptrain.data.table`): the rows are
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
from typing import TypeVar

import numpy as np

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


def hash_scores(n: int, words: Sequence[Callable[[int, int], np.ndarray]], column_keys: Sequence[tuple[int, int]],
                start_word: int, end_keys: tuple[int, int], *, workers: int = 1) -> np.ndarray:
    """u in [0, 1) per row: h = start_word; for each column j, h = mix(h ^ keyed_j(word_j));
    then keyed_end(h), whose top 53 bits scaled by 2^-53 are u. ``words[j](start, stop)`` returns
    column j's uint64 words for the block, as a fresh array (it is overwritten). Used by the hash
    split (:func:`dptrain.data.table.split_scores`) and task=tune's validation rows
    (:func:`dptrain.inference.subsample.row_uniform`)."""
    out = np.empty(n, dtype=np.float64)

    def block(start: int, stop: int) -> None:
        h = np.full(stop - start, start_word, dtype=np.uint64)
        tmp = np.empty_like(h)
        for word, keys in zip(words, column_keys):
            h ^= keyed_(word(start, stop), keys, tmp)
            mix_(h, tmp)
        keyed_(h, end_keys, tmp)
        h >>= np.uint64(11)
        out[start:stop] = h
        out[start:stop] *= 2.0**-53

    map_blocks(n, block, workers)
    return out
