"""Hydra entry point: ``python -m dptrain experiment=NAME [key=value ...]``.

It only dispatches: the composed config's ``task`` names a module in ``TASKS`` whose
``run_task(cfg, run_dir=...)`` does the work (``dptrain.train``, ``dptrain.audit``,
``dptrain.release.run``). The ``plugins`` setting's modules are imported first, so that the
extensions they register (objectives, accountants, engines, release methods) are known when the
config is checked. Every error a user can cause is a :class:`dptrain.errors.DPTrainError`: it is
printed with the setting, the value and what is allowed, and the run exits with status 2 before
anything is written.
"""

from __future__ import annotations

import importlib
import logging
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dptrain.config import register_configs
from dptrain.errors import DPTrainError
from dptrain.registry import Registry, load_plugins

log = logging.getLogger("dptrain")

register_configs()

#: task name -> "module:function" of its entry point (a new task: one module and one line)
TASKS: Registry = Registry("task", setting="task")
TASKS.register("train", "dptrain.train:run_task")
TASKS.register("audit", "dptrain.audit:run_task")
TASKS.register("release", "dptrain.release.run:run_task")


def _fail(err: Exception) -> None:
    log.error("%s", err)
    print(f"dptrain: error: {err}", file=sys.stderr)
    raise SystemExit(2)


def run(cfg: DictConfig, *, run_dir: Path) -> float:
    """Run one job of the config's task; returns its objective (what a sweeper optimises)."""
    try:
        load_plugins(list(cfg.get("plugins") or []))
        module, _, function = TASKS.get(cfg.task).partition(":")
        run_task = getattr(importlib.import_module(module), function)
        return run_task(cfg, run_dir=run_dir)
    except DPTrainError as err:
        _fail(err)


@hydra.main(version_base="1.3", config_path="pkg://dptrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float:
    return run(cfg, run_dir=Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    from dptrain.distributed import env_rank

    if env_rank() > 0:
        # torchrun starts one process per rank; only rank 0 writes a run folder. The others get
        # no Hydra output folder and no log file (and so cannot race rank 0 for its files).
        sys.argv = [a for a in sys.argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir=",
                                                              "hydra/job_logging="))]
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout",
                     f"hydra.run.dir={Path(tempfile.gettempdir()) / 'dptrain-rank-unused'}"]
    _hydra_main()


if __name__ == "__main__":
    main()
