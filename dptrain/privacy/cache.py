"""Accounting results cached on disk, keyed by their public inputs.

A run's accounting is a pure function of public values: an event's parameters (q, sigma), the
orders, a history of events with their counts, delta. Importing dp-accounting (with the parts of
scipy it loads) and composing its privacy loss distributions costs a short run about as much as
its training. So the two results every run needs, an event's RDP curve at ``RDP_ORDERS`` and a
history's PLD epsilon at delta, are kept in small files under the user's cache folder and read
back by the next run with the same inputs, which then never imports dp-accounting.

What is stored: the inputs' digest as the file name, and the numbers (the curve, or epsilon).
Nothing about the data: N enters only through q, which the report publishes anyway. The key
includes this cache's format version, dp-accounting's version and the orders, so a new library
or a changed grid computes afresh. Files are written atomically (a temporary file renamed into
place) with owner-only permissions in an owner-only folder; one that cannot be read, or holds
the wrong number of values, is ignored and recomputed.

A value read from the cache is trusted like a computed one: whoever can write your cache folder
could change the epsilon your reports print. It lives in ``$DPTRAIN_CACHE_DIR`` (default
``$XDG_CACHE_HOME/dptrain`` or ``~/.cache/dptrain``), ``accounting/``; set
``DPTRAIN_ACCOUNTING_CACHE=0`` to compute every value (the numbers are the same either way:
``tests/test_accounting_cache.py``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path

CACHE_VERSION = 1
SWITCH = "DPTRAIN_ACCOUNTING_CACHE"


def cache_dir() -> Path | None:
    """The accounting cache's folder, or None when switched off (``DPTRAIN_ACCOUNTING_CACHE=0``)."""
    if os.environ.get(SWITCH, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    base = os.environ.get("DPTRAIN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dptrain")
    return Path(base) / "accounting"


def _library_version() -> str:
    try:
        return importlib.metadata.version("dp-accounting")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _path(kind: str, payload: str) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    digest = hashlib.sha256(f"{CACHE_VERSION}|{kind}|{_library_version()}|{payload}".encode()).hexdigest()
    return folder / f"{kind}-{digest}.json"


def load(kind: str, payload: str, *, length: int) -> list[float] | None:
    """The ``length`` numbers stored for (``kind``, ``payload``), or None (absent, unreadable,
    switched off, or not ``length`` numbers)."""
    path = _path(kind, payload)
    if path is None:
        return None
    try:
        values = json.loads(path.read_text(encoding="ascii"))["values"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not isinstance(values, list) or len(values) != length or not all(isinstance(v, (int, float)) for v in values):
        return None
    return [float(v) for v in values]


def store(kind: str, payload: str, values: list[float]) -> None:
    """Keep ``values`` for (``kind``, ``payload``); any failure to write is ignored (the cache is
    an optimisation: the value was computed)."""
    path = _path(kind, payload)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            json.dump({"values": [float(v) for v in values]}, fh)
        os.replace(tmp, path)
    except OSError:
        pass
