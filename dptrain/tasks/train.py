"""task=train: settings checked, randomness and model checked, THEN the data read, trained (the
fit library, :mod:`dptrain.training.fit`, through the estimator, :mod:`dptrain.inference.run`), and the
run folder written (:mod:`dptrain.tasks.outputs`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dptrain.data.shards import load_training_data
from dptrain.inference.run import check_estimator, check_estimator_size, run_estimator
from dptrain.privacy.report import summary_lines
from dptrain.runfolder.tracking import Tracker
from dptrain.settings.train import Config, validate_against_size, validate_train
from dptrain.tasks.outputs import randomness_for, write_training_outputs
from dptrain.tasks.plan import training_plan
from dptrain.training.distributed import init_from_env, shutdown
from dptrain.training.fit import LaunchConfig, bound_to_rows, build_model, run_device
from dptrain.training.plan import TrainingPlan

log = logging.getLogger("dptrain.training.fit")


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=train: settings checked, randomness and model checked, THEN the data read, trained,
    and the run folder written (dptrain.tasks.outputs). Returns the primary test metric (a sweeper's
    objective). Bad input raises a DPTrainError before anything is written."""
    conf: Config = OmegaConf.to_object(cfg)
    validate_train(conf)
    plan = training_plan(conf)  # the settings become typed values, once
    check_estimator(plan)
    randomness = randomness_for(conf, cfg, run_dir=run_dir)
    build_model(plan)
    dist_ctx, run_dir = _join_processes(plan, run_dir)  # before the data: a sharded read sums N over the ranks
    data = load_training_data(plan.data, seed=plan.seed, dist=dist_ctx, baseline=plan.loop.baseline,
                              estimator=plan.estimator.name)  # this rank's shard of a partitioned Parquet set, or all
    randomness = bound_to_rows(randomness, data, dist=dist_ctx)
    delta = validate_against_size(conf, data.n_accounted)
    check_estimator_size(plan, data.n_accounted)
    main = dist_ctx is None or dist_ctx.is_main
    tracker = Tracker(run_dir / "private" if main else run_dir, tensorboard=conf.logger.tensorboard and main)
    try:
        result = run_estimator(plan, data, delta=delta, tracker=tracker,  # estimator=dpsgd: fit() as before
                               launch=LaunchConfig(run_dir=run_dir, randomness=randomness, dist=dist_ctx))
    except BaseException:
        tracker.close()
        raise
    if main:
        report = write_training_outputs(plan, cfg, result, data=data, tracker=tracker, run_dir=run_dir)
        lines = summary_lines(result, report, dist_ctx=dist_ctx, run_dir=run_dir)
        line_of = getattr(plan.objective, "summary_line", None)  # optional for plugins
        extra = line_of(result.metrics) if line_of is not None else None  # e.g. linear's RMSE baselines
        table = report.get("estimator", {}).get("table")
        if table:  # the whole table: the private log only (the console has its summary line)
            log.info("%s", table, extra={"console": False})
        for line in lines[:1] + ([extra] if extra else []) + lines[1:]:
            log.info(line)
    if dist_ctx is not None:
        shutdown()
    return float(result.metrics[f"test/{plan.objective.primary_metric}"])


def _join_processes(plan: TrainingPlan, run_dir: Path) -> tuple[Any, Path]:
    """(DistContext or None, the run folder every rank uses: rank 0's)."""
    if not plan.loop.distributed:
        return None, run_dir
    ctx = init_from_env(device=run_device(plan.loop))
    log.info("distributed: rank %d of %d (backend %s)", ctx.rank, ctx.world_size, ctx.backend)
    return ctx, Path(ctx.all_gather_objects(str(run_dir))[0])
