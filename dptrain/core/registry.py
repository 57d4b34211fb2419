"""Named extension points: one small name -> object registry per kind of extension.

The kinds (accountants, engines, objectives, release methods, tasks) each own one
:class:`Registry`; the configuration is validated against it, so a new extension is one file
that registers itself plus, where the user picks it, one config file. Third-party extensions are
loaded with the top-level setting ``plugins: [my_package.my_module]``: each module is imported
before the configuration is validated (given on the command line: before Hydra composes it,
:func:`dptrain.tasks.cli.preload_plugins`), and registers what it defines.

    >>> from dptrain.core.registry import Registry
    >>> shapes = Registry("shape", setting="model.shape")
    >>> @shapes.register("square")
    ... class Square: ...
    >>> shapes.get("square") is Square
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import did_you_mean

T = TypeVar("T")


class RegistryError(DPTrainError):
    """An unknown or duplicate name; the message lists what is registered."""


class Registry(Generic[T]):
    """Name -> object. ``setting`` is the config key users set to pick one (for messages)."""

    def __init__(self, kind: str, *, setting: str) -> None:
        self.kind = kind
        self.setting = setting
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None, *, replace: bool = False) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name`` (or use as a decorator). A name is registered once
        unless ``replace``; names are case-sensitive identifiers."""

        def add(item: T) -> T:
            if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
                raise RegistryError(f"{self.kind} name {name!r} is not allowed: use letters, digits, _ and -")
            if name in self._items and not replace and self._items[name] is not item:
                raise RegistryError(f"{self.kind} {name!r} is already registered; pass replace=True to replace it")
            self._items[name] = item
            return item

        return add(obj) if obj is not None else add

    def get(self, name: str) -> T:
        """The object registered under ``name``; a :class:`RegistryError` naming the setting and
        the allowed names otherwise."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise RegistryError(f"{self.setting}={name!r} is not allowed: must be one of "
                                f"{', '.join(self.names())}{did_you_mean(str(name), self.names())}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a toy extension clean up with this)."""
        self._items.pop(name, None)


def load_plugins(modules: list[str] | tuple[str, ...]) -> None:
    """Import each ``package.module`` of the ``plugins`` setting (it registers its extensions). A
    module imported before is not imported again (its registrations stand)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise RegistryError(f"plugins={list(modules)!r} is not allowed: module {name!r} cannot be imported "
                                f"({err}); allowed: modules importable from the working directory or the "
                                "environment (PYTHONPATH)") from None
