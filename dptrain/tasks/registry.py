"""The tasks: ``task=NAME`` picks one :class:`Task`, the triple of its config schema, the check of
its settings and its run. The command line (:mod:`dptrain.tasks.cli`) looks the task up here;
nothing else imports this module. A new task is a plugin module that calls
``TASKS.register("name", Task(schema, check, run))``, named with ``plugins=[...]`` ON THE COMMAND
LINE (imported before Hydra composes the config, then :func:`register_configs` stores its schema
as ``schema/name``), and a ``conf/task/name.yaml`` in the user's ``--config-dir`` that extends
``/schema/name@_here_`` (docs/extending.md; tests/test_plugins_end_to_end.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dptrain.core.registry import Registry
from dptrain.core.validation import one_of
from dptrain.settings import command_line
from dptrain.settings.audit import AuditRunConfig, validate_audit
from dptrain.settings.launch import register_schemas
from dptrain.settings.lodes import LodesRunConfig, validate_lodes
from dptrain.settings.predict import PredictRunConfig, validate_predict_run
from dptrain.settings.release import ReleaseRunConfig, validate_release_run
from dptrain.settings.synthesize import SynthesizeRunConfig, validate_synthesize
from dptrain.settings.tabulate import TabulateRunConfig, validate_tabulate
from dptrain.settings.topdown import TopDownRunConfig, validate_topdown
from dptrain.settings.train import TrainRunConfig, validate_train
from dptrain.settings.tune import TuneRunConfig, validate_tune
from dptrain.tasks import audit, lodes, predict, release, synthesize, tabulate, topdown, train, tune


@dataclass
class Task:
    """One ``task=`` value: ``schema``, the root dataclass of its config (``conf/task/NAME.yaml``
    extends ``schema/NAME``; every key of the composed config must be in it, ``task`` and
    ``plugins`` included); ``check(conf)``, every value check, before any row is read (raises
    ConfigError; :func:`validate` calls it, and each task's ``run`` calls it first on
    ``OmegaConf.to_object(cfg)``); ``run(cfg, run_dir=...)``, the work, returning what a sweeper
    optimises (the command line calls it with the composed config)."""

    schema: type
    check: Callable[[Any], None]
    run: Callable[..., float]

    def __call__(self, cfg: Any, *, run_dir: Path) -> float:
        return self.run(cfg, run_dir=run_dir)


TASKS: Registry[Task] = Registry("task", setting="task")
TASKS.register("train", Task(TrainRunConfig, validate_train, train.run_task))
TASKS.register("audit", Task(AuditRunConfig, validate_audit, audit.run_task))
TASKS.register("release", Task(ReleaseRunConfig, validate_release_run, release.run_task))
TASKS.register("predict", Task(PredictRunConfig, validate_predict_run, predict.run_task))
TASKS.register("tune", Task(TuneRunConfig, validate_tune, tune.run_task))
TASKS.register("tabulate", Task(TabulateRunConfig, validate_tabulate, tabulate.run_task))
TASKS.register("synthesize", Task(SynthesizeRunConfig, validate_synthesize, synthesize.run_task))
TASKS.register("topdown", Task(TopDownRunConfig, validate_topdown, topdown.run_task))
TASKS.register("lodes", Task(LodesRunConfig, validate_lodes, lodes.run_task))


def task_schemas() -> dict[str, type]:
    """``{task name: its config's root dataclass}`` for every registered task, plugins' included."""
    return {name: TASKS.get(name).schema for name in TASKS}


def validate(cfg: Any) -> None:
    """Check every setting of the run's task once, before any row is read. Raises ConfigError."""
    one_of("task", cfg.task, tuple(TASKS))
    TASKS.get(cfg.task).check(cfg)


def check_known_keys(cfg: Any) -> None:
    """Refuse any key of the composed config that its task's schema does not have
    (:func:`dptrain.settings.command_line.check_known_keys`)."""
    command_line.check_known_keys(cfg, task_schemas())


def register_configs() -> None:
    """Register every task's schema (``schema/NAME``), plugins' included, each data source's schema
    and the presets' resolvers (:func:`dptrain.settings.launch.register_schemas`)."""
    register_schemas(task_schemas())
