"""The parts every task's schema shares (seed, plugins, overwrite, a release's budget) and their help."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import setting

SEED_HELP = ("seeds the model's initialisation, the train/test split and generated data; NEVER the noise or the "
             "sampler (fresh from the OS CSPRNG, or privacy.noise_seed_file)")


#: every task=... a run can name (the task setting's allowed values, one list for every task)
TASKS_ALLOWED = "train | audit | release | predict | tune | tabulate | synthesize | topdown | lodes"


PLUGINS_HELP = "modules imported before the config is checked: they register extensions (docs/extending.md)"


OVERWRITE_HELP = ("launch into a run folder that already holds files of another run (a finished run, or a "
                  "killed run's leftovers) after emptying it: every file of the old run is removed first; false: "
                  "such a launch is refused, nothing written (use a new folder, or trainer.resume=auto to continue "
                  "a training run of the same settings)")


MAX_ROWS_PER_UNIT_HELP = ("with data.privacy_unit: k, the most rows of one unit that count (a unit with more keeps "
                          "a uniformly random k of them, chosen with the run's SECRET randomness; how many rows were "
                          "dropped goes to private/ only); the sensitivities and the guarantee are per unit of at "
                          "most k rows. Required with data.privacy_unit (no default: k trades bias against noise)")


MAX_ROWS_PER_UNIT_ALLOWED = "an integer >= 1, with data.privacy_unit (required then) | null without it"


def max_rows_per_unit_setting() -> Any:
    """The ``privacy.max_rows_per_unit`` field of a privacy section (training's and the releases'):
    one definition, one help text (:data:`MAX_ROWS_PER_UNIT_HELP`)."""
    return setting(None, help=MAX_ROWS_PER_UNIT_HELP, allowed=MAX_ROWS_PER_UNIT_ALLOWED)


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
