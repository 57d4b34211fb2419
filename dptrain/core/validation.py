"""Building blocks of the settings checks: every check raises :class:`ConfigError`, whose message
names the setting, the value and what is allowed. Each settings section keeps its own checks
next to its dataclass (``validate()``), built from these."""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from dptrain.core.errors import DPTrainError


class ConfigError(DPTrainError):
    """A setting has a value that is not allowed. The message names setting, value and rule."""


def bad(setting: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{setting}={value!r} is not allowed: {allowed}")


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except (OverflowError, TypeError, ValueError):  # 10**400, ...
        return False


def real(setting: str, value: Any, allowed: str, *, lo: float = -math.inf, hi: float = math.inf,
         lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a float if it is a finite real number in the interval, else ConfigError."""
    ok = is_real(value) and is_finite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        raise bad(setting, value, allowed)
    return float(value)


def finite_positive(setting: str, value: Any) -> float:
    return real(setting, value, "must be a finite number > 0", lo=0, lo_open=True)


def integer(setting: str, value: Any, lo: int, allowed: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise bad(setting, value, allowed or f"must be an integer >= {lo}")
    return int(value)


def flag(setting: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise bad(setting, value, "must be true or false")


def one_of(setting: str, value: Any, allowed: tuple | list) -> None:
    if value not in allowed:
        hint = did_you_mean(str(value), allowed) if isinstance(value, str) else ""
        raise bad(setting, value, f"must be one of {', '.join(map(str, allowed))}{hint}")


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, Mapping) else getattr(obj, name, default)


def closest(name: str, candidates: Any, *, n: int = 3) -> list[str]:
    """The candidates closest to ``name`` (difflib, ignoring case: ``MLP`` finds ``mlp``), best
    first; [] when none is close."""
    by_lower: dict[str, str] = {}
    for c in candidates:
        by_lower.setdefault(str(c).lower(), str(c))
    found = difflib.get_close_matches(str(name).lower(), list(by_lower), n=n, cutoff=0.6)
    return [by_lower[f] for f in found]


def did_you_mean(name: str, candidates: Any) -> str:
    """" (did you mean X?)" for the closest candidate, or ""."""
    best = closest(name, candidates, n=1)
    return f" (did you mean {best[0]}?)" if best else ""


def setting(default: Any = None, *, help: str, allowed: str = "", factory: Any = None) -> Any:
    """A dataclass field with its documentation: ``help`` (what it means) and ``allowed`` (the
    values allowed, in words) are kept as field metadata, from which the settings reference
    (docs/settings.md, ``scripts/settings_reference.py``) is generated. ``factory`` gives a
    mutable default (list, dict, dataclass)."""
    meta = {"help": help, "allowed": allowed}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)
