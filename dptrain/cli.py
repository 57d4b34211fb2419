"""Hydra entry point: ``python -m dptrain experiment=NAME [key=value ...]``.

Order of work in a run, so that bad input never reaches private data or leaves a misleading
artifact: compose (schema: unknown keys, types) -> :func:`dptrain.config.validate` (values)
-> read data -> size checks (delta < 1/N, B <= N) -> train -> write metrics.json,
privacy.json, privacy.txt (each atomically) in the run folder.
"""

from __future__ import annotations

import logging
import math
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dptrain.config import Config, ConfigError, register_configs, validate, validate_against_size

log = logging.getLogger("dptrain")

register_configs()


def _fail(err: Exception) -> None:
    log.error("%s", err)
    print(f"dptrain: error: {err}", file=sys.stderr)
    raise SystemExit(2)


def run(cfg: DictConfig, *, run_dir: Path) -> float:
    """Run one training job; returns the test accuracy (the objective a sweeper maximises)."""
    from dptrain.checkpoint import CheckpointError
    from dptrain.data import DataError, load_dataset
    from dptrain.privacy.accounting import AccountingError
    from dptrain.privacy.report import build_report, format_report
    from dptrain.tracking import Tracker, atomic_write_text, write_json
    from dptrain.train import final_epsilons, fit

    conf: Config = OmegaConf.to_object(cfg)
    if conf.task == "release":
        return run_release_task(conf, run_dir=run_dir)
    if conf.task == "audit":
        return run_audit_task(conf, cfg, run_dir=run_dir)
    try:
        validate(conf)
        data = load_dataset(conf.data, seed=conf.seed)
        delta = validate_against_size(conf, data.n_train)
    except (ConfigError, DataError) as err:
        _fail(err)

    dist_ctx = None
    if conf.trainer.distributed:
        from dptrain.distributed import DistributedError, init_from_env

        try:
            dist_ctx = init_from_env()
        except DistributedError as err:
            _fail(err)
        log.info("distributed: rank %d of %d (backend %s)", dist_ctx.rank, dist_ctx.world_size, dist_ctx.backend)
        # every rank resumes from (and rank 0 writes to) rank 0's run folder
        run_dir = Path(dist_ctx.all_gather_objects(str(run_dir))[0])
    main_rank = dist_ctx is None or dist_ctx.is_main
    tracker = Tracker(run_dir, tensorboard=conf.logger.tensorboard and main_rank)
    try:
        result = fit(conf, data, delta=delta, tracker=tracker, run_dir=run_dir, dist_ctx=dist_ctx)
    except (ConfigError, AccountingError, CheckpointError) as err:
        tracker.close()
        _fail(err)
    if not main_rank:  # only rank 0 writes artifacts
        from dptrain.distributed import shutdown

        shutdown()
        return float(result.metrics["test/acc"])
    # Hydra saves the composed config with interpolations; keep the resolved values beside it
    # (written only once training has succeeded: a refused resume must not overwrite the record).
    atomic_write_text(run_dir / ".hydra" / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    private = conf.privacy.enabled
    epsilons = final_epsilons(result, delta=delta) if private else None
    report = build_report(
        mechanism=result.privacy, epsilons=epsilons, accountant=conf.privacy.accountant,
        seed=conf.seed, data_source=data.source,
    )
    if private:
        tracker.scalars({"privacy/epsilon_pld": epsilons["pld"]}, step=result.privacy["steps"])
    tracker.text("privacy/report", "```\n" + format_report(report) + "```")
    tracker.hparams(run_hparams(conf, report), {
        "hparams/test_acc": result.metrics["test/acc"], "hparams/test_loss": result.metrics["test/loss"],
        "hparams/test_auc": result.metrics["test/auc"],
        "hparams/epsilon": report.get("epsilon", float("nan")),
    })
    tracker.close()
    write_json(run_dir / "metrics.json", result.metrics)
    write_json(run_dir / "privacy.json", report)
    atomic_write_text(run_dir / "privacy.txt", format_report(report))

    m = result.metrics
    lines = [
        f"test accuracy: {m['test/acc']:.4f}   test loss: {m['test/loss']:.4f}   test AUC: {m['test/auc']:.4f}",
    ]
    if "baseline/nonprivate_acc" in m:
        lines.append(
            f"non-private baseline (sklearn LogisticRegression, same features/split): "
            f"{m['baseline/nonprivate_acc']:.4f}   majority class: {m['baseline/majority_acc']:.4f}"
        )
    if private:
        eps = report["epsilon"]
        lines.append(
            f"privacy: epsilon = {eps:.4g}, delta = {delta:.3g} (accountant: {report['accountant']}; "
            + ", ".join(f"{k} {v:.4g}" for k, v in epsilons.items())
            + f"), sigma = {report['noise_multiplier']:.4g}, C = {report['max_grad_norm']}, "
            f"q = {report['sample_rate']:.4g}, steps = {report['steps']}"
        )
        if result.privacy["stopped_early"]:
            lines.append(f"privacy budget: {result.privacy['stop_reason']}")
        if not math.isfinite(eps):
            lines.append("WARNING: epsilon is infinite: this run has NO privacy guarantee (sigma = 0)")
    else:
        lines.append("privacy: OFF (privacy.enabled=false): no differential privacy guarantee")
    if dist_ctx is not None:
        lines.append(f"distributed: {dist_ctx.world_size} processes ({dist_ctx.backend}); noise added once per "
                     "step on rank 0; only rank 0 wrote these outputs")
    lines.append(f"train loop: {m['time/train_seconds']:.1f} s for {m['train/steps']} steps; outputs in {run_dir}")
    for line in lines:
        log.info(line)
    if dist_ctx is not None:
        from dptrain.distributed import shutdown

        shutdown()
    return float(m["test/acc"])


def run_hparams(conf: Config, report: dict) -> dict:
    """The settings that make runs of a sweep comparable trials in TensorBoard's HParams view."""
    model = conf.model if isinstance(conf.model, dict) else {}
    optim = conf.optim if isinstance(conf.optim, dict) else {}
    return {
        "model": str(model.get("_target_", "")).rsplit(".", 1)[-1],
        "hidden": str(list(model.get("hidden", []))),
        "private": bool(conf.privacy.enabled),
        "noise_multiplier": float(report.get("noise_multiplier", 0.0)),
        "target_epsilon": conf.privacy.target_epsilon,
        "max_grad_norm": float(conf.privacy.max_grad_norm),
        "delta": report.get("delta"),
        "accountant": conf.privacy.accountant,
        "batch_size": int(conf.trainer.batch_size),
        "epochs": float(conf.trainer.epochs),
        "optimizer": str(optim.get("_target_", "")).rsplit(".", 1)[-1],
        "lr": float(optim.get("lr", float("nan"))),
        "seed": int(conf.seed),
    }


def run_release_task(conf: Config, *, run_dir: Path) -> float:
    """task=release: bad settings and bad data are refused by name before anything is written."""
    from dptrain.data import DataError
    from dptrain.release.cells import ReleaseError
    from dptrain.release.run import run_release

    try:
        validate(conf)
        return run_release(conf, run_dir)
    except (ConfigError, DataError, ReleaseError) as err:
        _fail(err)


def run_audit_task(conf: Config, cfg: DictConfig, *, run_dir: Path) -> float:
    """task=audit (experiment=audit_logit / audit_mlp): one training run with canaries, then an
    epsilon lower bound beside the claimed epsilon (:mod:`dptrain.audit`). Returns the bound."""
    from dptrain.audit import format_audit, run_audit
    from dptrain.data import DataError, load_dataset
    from dptrain.privacy.accounting import AccountingError
    from dptrain.tracking import atomic_write_text

    try:
        validate(conf)
        data = load_dataset(conf.data, seed=conf.seed)
        atomic_write_text(run_dir / ".hydra" / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        report = run_audit(conf, data, run_dir=run_dir)
    except (ConfigError, DataError, AccountingError) as err:
        _fail(err)
    for line in format_audit(report):
        (log.warning if report["broken"] or report["claim_refuted"] else log.info)("%s", line)
    log.info("audit outputs in %s (audit.json, audit_canaries.csv, metrics.json)", run_dir)
    return float(report["epsilon_lower_bound"])


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
