"""Settings every task's config has (seed, plugins, overwrite, the data group's help) and the
noise seed file's check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import (
    bad,
    flag,
    integer,
    real,
    setting,
)
from dptrain.settings.data import as_source, check_source

MAX_ROWS_PER_UNIT_HELP = ("with data.privacy_unit: k, the most rows of one unit that count (a unit with more keeps "
                          "a uniformly random k of them, chosen with the run's SECRET randomness; how many rows were "
                          "dropped goes to private/ only); the sensitivities and the guarantee are per unit of at "
                          "most k rows. Required with data.privacy_unit (no default: k trades bias against noise)")


MAX_ROWS_PER_UNIT_ALLOWED = "an integer >= 1, with data.privacy_unit (required then) | null without it"


def max_rows_per_unit_setting() -> Any:
    """The ``privacy.max_rows_per_unit`` field of a privacy section (training's and the releases'):
    one definition, one help text (:data:`MAX_ROWS_PER_UNIT_HELP`)."""
    return setting(None, help=MAX_ROWS_PER_UNIT_HELP, allowed=MAX_ROWS_PER_UNIT_ALLOWED)


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


SEED_HELP = ("seeds the model's initialisation, the train/test split and generated data; NEVER the noise or the "
             "sampler (fresh from the OS CSPRNG, or privacy.noise_seed_file)")


#: every task=... a run can name (the task setting's allowed values, one list for every task)
TASKS_ALLOWED = "train | audit | release | predict | tune | tabulate | synthesize | topdown | lodes"

PLUGINS_HELP = "modules imported before the config is checked: they register extensions (docs/extending.md)"


OVERWRITE_HELP = ("launch into a run folder that already holds files of another run (a finished run, or a "
                  "killed run's leftovers) after emptying it: every file of the old run is removed first; false: "
                  "such a launch is refused, nothing written (use a new folder, or trainer.resume=auto to continue "
                  "a training run of the same settings)")


@dataclass
class RunBase:
    """The top-level settings every run has (all nine tasks' schemas subclass it): each task's schema
    gives ``task`` its name (and ``seed`` its meaning, where it has one) and adds its own sections.
    The defaults live here and in the sections' dataclasses only: conf/task/*.yaml restates none."""

    task: str = setting("train", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="seeds simulated data; NEVER the noise", allowed="an integer >= 0")
    plugins: list[str] = setting(help=PLUGINS_HELP, allowed="a list of importable module names", factory=list)
    overwrite: bool = setting(False, help=OVERWRITE_HELP, allowed="true | false")


@dataclass
class ReleaseBudget:
    """A one-shot release's budget: zCDP, reported as (epsilon, delta) by the RDP accountant (the
    tasks that release once: tabulate, synthesize, topdown, lodes). A task's own budget subclasses
    it where its epsilon or delta means more."""

    epsilon: float = setting(1.0, help="the whole release's epsilon", allowed="a number in (0, 100]")
    delta: float = setting(1e-6, help="the release's delta", allowed="a number in (0, 1e-3]")


@dataclass
class TableReleaseBase(RunBase):
    """A one-shot release of a table's rows (task=tabulate, task=synthesize): its declared columns
    are the domain."""

    data: Any = setting(None, help="the data source, a config group: data=adult | table | synthetic (its declared "
                        "columns are the domain)", allowed="adult | table | synthetic")


DATA_HELP = "the data source, a config group: data=adult | table | synthetic (| atlas for task=release)"


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
