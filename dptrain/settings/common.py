"""Settings every task's config has (seed, plugins, overwrite, the data group's help) and the
noise seed file's check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dptrain.core.validation import (
    bad,
    flag,
    integer,
    real,
)
from dptrain.settings.data import as_source, check_source
from dptrain.settings.schemas.common import (  # the schemas: no torch, no pandas
    RunBase,  # noqa: F401
)


def check_noise_seed_file(path: Any) -> None:
    if path is not None and not (isinstance(path, str) and path.strip()):
        raise bad("privacy.noise_seed_file", path, "must be null or the path of a secret seed file")


def check_common(cfg: Any) -> None:
    """The settings every task has: ``seed``, ``plugins``, ``overwrite``; a data section given as a
    mapping becomes its source's dataclass (``data.name``)."""
    integer("seed", cfg.seed, 0)
    if not isinstance(cfg.plugins, (list, tuple)) or not all(isinstance(m, str) for m in cfg.plugins):
        raise bad("plugins", cfg.plugins, "must be a list of module names, e.g. [mypackage.my_objective]")
    flag("overwrite", cfg.overwrite)
    if cfg.task != "predict" and isinstance(vars(cfg).get("data"), Mapping):  # topdown and lodes have no data
        cfg.data = as_source(cfg.data)


def check_budget(privacy: Any, *, delta: bool = True) -> None:
    """A one-shot release's ``privacy.epsilon`` (in (0, 100]: above, it protects nothing) and, when
    the release has one, ``privacy.delta`` (in (0, 1e-3]). Raises ConfigError."""
    real("privacy.epsilon", privacy.epsilon, "must be a number in (0, 100]", lo=0, hi=100, lo_open=True)
    if delta:
        real("privacy.delta", privacy.delta, "must be a number in (0, 1e-3]", lo=0, hi=1e-3, lo_open=True)


def check_table_source(data: Any, what: str) -> None:
    """The data of a one-shot release read from rows (``what``, e.g. "a tabulation"): adult, table or
    synthetic, and data=table with a path."""
    check_source(data, ("adult", "table", "synthetic"), what)
    if data.name == "table" and not data.path:
        raise bad("data.path", data.path, "data=table needs the path of a CSV, Parquet or .dta file")
