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
    MAX_ROWS_PER_UNIT_ALLOWED,  # noqa: F401
    MAX_ROWS_PER_UNIT_HELP,  # noqa: F401
    RunBase,  # noqa: F401
    max_rows_per_unit_setting,  # noqa: F401
)


def check_unit_bound(privacy_unit: Any, max_rows_per_unit: Any) -> int | None:
    """``privacy.max_rows_per_unit`` against ``data.privacy_unit``: required (an integer >= 1)
    when a unit is declared, refused without one. Returns k (None without a unit). Raises
    ConfigError naming the setting."""
    if privacy_unit is None:
        if max_rows_per_unit is not None:
            raise bad("privacy.max_rows_per_unit", max_rows_per_unit, "needs data.privacy_unit (the column whose "
                      "value is the unit of privacy); allowed without it: null (one row is the unit)")
        return None
    if max_rows_per_unit is None:
        raise bad("privacy.max_rows_per_unit", max_rows_per_unit, f"(unset) with data.privacy_unit="
                  f"{privacy_unit!r}: it is required; declare k, the most rows of one unit that count (e.g. "
                  "privacy.max_rows_per_unit=5; dptrain check reports the rows per unit to the data holder)")
    return integer("privacy.max_rows_per_unit", max_rows_per_unit, 1, "must be an integer >= 1 (the most rows of "
                   "one unit that count)")


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
