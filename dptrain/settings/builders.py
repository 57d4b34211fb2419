"""Did-you-mean for the free-form builder settings (``model``, ``optim``: a ``_target_`` and its
arguments, built by Hydra): a ``_target_`` that names nothing gets the closest name its module
has, an argument the target does not take gets the closest argument it does take. Only modules
already imported are looked into (building the probe imported them): nothing is imported here."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from typing import Any

from dptrain.core.validation import closest

#: what the shipped config groups offer for each builder setting
GROUP_OPTIONS = {"model": "model=logit | model=mlp", "optim": "optim=sgd | optim=adam"}


def _module_of(target: str) -> tuple[Any, str] | None:
    """The longest imported module that ``target`` starts with, and the rest of the name."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            return module, ".".join(parts[cut:])
    return None


def _public_callables(module: Any) -> list[str]:
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    return [n for n in names if callable(getattr(module, n, None))]


def target_suggestion(setting: str, target: Any) -> str | None:
    """``setting._target_=X is not allowed`` with the closest callable of X's module, when X names
    no attribute of an imported module; None otherwise."""
    if not isinstance(target, str) or "." not in target:
        return None
    found = _module_of(target)
    if found is None:
        return None
    module, rest = found
    if "." not in rest and callable(getattr(module, rest, None)):
        return None
    best = closest(rest, _public_callables(module), n=1)
    hint = f" (did you mean {module.__name__}.{best[0]}?)" if best else ""
    options = GROUP_OPTIONS.get(setting, f"{setting}=NAME")
    return (f"{setting}._target_={target!r} is not allowed: {module.__name__} has no {rest!r}{hint}; allowed: "
            f"{options}, or the dotted name of a class or function that builds it")


def closest_argument(target: Any, argument: str) -> str | None:
    """The argument of the callable ``target`` (a dotted name) closest to ``argument``, or None."""
    found = _module_of(target) if isinstance(target, str) else None
    if found is None:
        return None
    built = getattr(found[0], found[1], None)
    try:
        names = [p for p in inspect.signature(built).parameters if p not in ("self", "params", "in_features")]
    except (TypeError, ValueError):
        return None
    best = closest(argument, names, n=1)
    return best[0] if best else None


def argument_suggestion(target: Any, argument: str) -> str:
    """" (did you mean X?)" for the closest argument the callable ``target`` (a dotted name) takes."""
    best = closest_argument(target, argument)
    return f" (did you mean {best}?)" if best else ""


def builder_suggestion(setting: str, value: Mapping, cause: BaseException) -> str | None:
    """The message for a builder that failed because its ``_target_`` names nothing (None: another
    failure)."""
    if not isinstance(cause, ImportError) and "Error locating target" not in str(cause):
        return None
    return target_suggestion(setting, value.get("_target_"))
