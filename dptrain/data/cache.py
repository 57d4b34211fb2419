"""The encoded-rows cache (``data.cache``): a sweep over one large table reads and encodes it
once; every later run memory-maps the encoded matrices.

An entry is a folder ``<data.cache>/<key>/`` holding ``x_train.npy``, ``y_train.npy``,
``x_test.npy``, ``y_test.npy``, ``facts.json`` (the private facts the checks over every row
need: whether each split side has rows, the clipped counts, the declared rules' counts) and
``sha256.json`` (the SHA-256 of each of those five files, written with them). The
key is a SHA-256 over the data file's bytes (every file of a Parquet folder, with their names),
the data declaration that shapes the encoding (target and its labels, schema, label maps, rules,
number format, split, format, delimiter), the seed (it keys the split) and the cache's format
version: a different file, schema
or seed is a different entry, never a stale one. An entry is written to a temporary folder and
renamed into place (concurrent runs of a sweep may both write: the first rename wins, the other
is dropped). A run that reads an entry runs the same checks over its facts as a run that encodes,
so it accepts, refuses and warns exactly alike.

PRIVATE: an entry holds the encoded private rows, and its folder name is a digest of the private
file (it can confirm a guess of the whole file): keep ``data.cache`` beside the data, never in a
folder that is published. Runs never write the key into their run folder. Whatever the umask, an
entry's files are written 0600 in folders 0700 (the cache folder too when the run creates it), so
other users of the machine can neither read the rows nor list the keys. Before an entry is used,
each of its files is checked against its digest: a changed file (flipped labels in
``y_train.npy``) is refused by name, never trained on (hashing reads the entry once, about 0.6 s
per GB here; the pages then serve the memory map).

Loading maps the arrays copy-on-write (``mmap_mode="c"``): the pages are read from the page cache
as training touches them, nothing is copied up front, and a table larger than memory can train
from it (the operating system pages it in and out).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from dptrain.core.errors import DPTrainError
from dptrain.data.encoding import EncodedRows
from dptrain.data.schema import Schema

#: bump when the encoding or the entry's layout changes (old entries are then never read)
CACHE_VERSION = 3  # 2: sha256.json and private modes; 3: the declared rules' counts in facts.json
ARRAYS = ("x_train", "y_train", "x_test", "y_test")
FILES = (*(f"{name}.npy" for name in ARRAYS), "facts.json")
DIGESTS = "sha256.json"
FILE_MODE, DIR_MODE = 0o600, 0o700
_CHUNK = 1 << 24


class CacheError(DPTrainError):
    """A cache entry that cannot be used (damaged, or a folder that cannot be written)."""


def data_files(path: str | Path) -> list[Path]:
    """The files whose bytes the key covers: the file, or a folder's Parquet files in path order."""
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in (".parquet", ".pq"))
    return [p]


def cache_key(path: str | Path, schema: Schema, *, seed: int, fmt: str, delimiter: str) -> str:
    """SHA-256 (hex) of the data's bytes, the checked schema (its canonical repr: target, labels,
    bounds, split, ``nonfinite``), the format, the delimiter, the seed and :data:`CACHE_VERSION`
    (module docstring). Reads every byte of the data once (about 0.6 s per GB here)."""
    h = hashlib.sha256()
    meta = {"version": CACHE_VERSION, "schema": repr(schema), "seed": int(seed), "format": fmt,
            "delimiter": delimiter}
    h.update(json.dumps(meta, sort_keys=True).encode())
    root = Path(path)
    for f in data_files(root):
        h.update(b"\x00file\x00" + (str(f.relative_to(root)) if root.is_dir() else "").encode())
        with open(f, "rb") as stream:
            while chunk := stream.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def _facts_to_json(facts: dict[str, Any]) -> dict[str, Any]:
    return dict(facts)  # counts and flags only: JSON as they are


def _facts_from_json(facts: dict[str, Any]) -> dict[str, Any]:
    return dict(facts)


def check_writable(folder: str | Path) -> None:
    """Create ``folder`` if needed and make sure this user can write there, before any row is read."""
    root = Path(folder)
    try:
        created = not root.exists()
        root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        if created:
            os.chmod(root, DIR_MODE)  # mkdir's mode is filtered by the umask
    except OSError as exc:
        raise CacheError(f"data.cache={str(folder)!r}: cannot create the folder ({exc.strerror or exc}); allowed: a "
                         "folder this user can create and write") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise CacheError(f"data.cache={str(folder)!r}: this user cannot write there; allowed: a folder this user can "
                         "write")


def load(folder: str | Path, key: str) -> EncodedRows | None:
    """The entry ``key`` of the cache ``folder``, memory-mapped; None when there is none."""
    entry = Path(folder) / key
    if not entry.is_dir():
        return None
    _check_digests(folder, entry)
    try:
        facts = _facts_from_json(json.loads((entry / "facts.json").read_text()))
        arrays = {name: np.load(entry / f"{name}.npy", mmap_mode="c", allow_pickle=False) for name in ARRAYS}
    except (OSError, ValueError, KeyError) as exc:
        raise CacheError(f"data.cache={str(folder)!r}: an entry for this data set is damaged ({type(exc).__name__}); "
                         "allowed: an intact entry: remove the cache folder's entries (they are rebuilt on the next "
                         "run)") from None
    return EncodedRows(**arrays, facts=facts)


def _private_file(path: Path):
    """A new file open for writing with mode 0600 whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "wb")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_digests(folder: str | Path, entry: Path) -> None:
    """Refuse an entry whose files differ from the digests written with them (module docstring)."""
    try:
        expected = json.loads((entry / DIGESTS).read_text())
    except (OSError, ValueError):
        raise CacheError(f"data.cache={str(folder)!r}: an entry for this data set has no readable {DIGESTS}; "
                         "allowed: an intact entry: remove the cache folder's entries (they are rebuilt on the next "
                         "run)") from None
    for name in FILES:
        try:
            same = _sha256(entry / name) == expected.get(name)
        except OSError:
            same = False
        if not same:
            raise CacheError(f"data.cache={str(folder)!r}: {name} of the entry for this data set differs from the "
                             "digest written with it (changed or damaged since); refused, no row of it was used. "
                             "Allowed: an intact entry: remove the cache folder's entries (they are rebuilt on the "
                             "next run)")


def store(folder: str | Path, key: str, rows: EncodedRows) -> bool:
    """Write ``rows`` as the entry ``key`` (temporary folder, then one rename); False when another
    run wrote it first. Raises CacheError when the folder cannot be written."""
    root = Path(folder)
    entry, tmp = root / key, root / f".{key}.{uuid.uuid4().hex}.tmp"
    try:
        tmp.mkdir(mode=DIR_MODE)
        os.chmod(tmp, DIR_MODE)
        for name in ARRAYS:
            with _private_file(tmp / f"{name}.npy") as stream:
                np.save(stream, np.ascontiguousarray(getattr(rows, name)), allow_pickle=False)
        with _private_file(tmp / "facts.json") as stream:
            stream.write(json.dumps(_facts_to_json(rows.facts), sort_keys=True).encode())
        with _private_file(tmp / DIGESTS) as stream:
            stream.write(json.dumps({name: _sha256(tmp / name) for name in FILES}, sort_keys=True).encode())
        try:
            os.rename(tmp, entry)
        except OSError:
            if entry.is_dir():  # a concurrent run's entry: the same bytes
                return False
            raise
        return True
    except OSError as exc:
        raise CacheError(f"data.cache={str(folder)!r}: cannot write the encoded rows there ({exc.strerror or exc}); "
                         "allowed: a folder this user can create and write, with room for the encoded matrices "
                         "(4 bytes per row and feature)") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
