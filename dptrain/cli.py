"""Hydra entry point: ``python -m dptrain experiment=NAME [key=value ...]``.

Order of work in a run, so that bad input never reaches private data or leaves a misleading
artifact: compose (schema: unknown keys, types) -> :func:`dptrain.config.validate` (values)
-> read data -> size checks (delta < 1/N, B <= N) -> train -> write metrics.json,
privacy.json, privacy.txt (each atomically) in the run folder.
"""

from __future__ import annotations

import logging
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


def build_randomness(conf: Config, cfg: DictConfig, *, run_dir: Path):
    """The run's secret randomness: fresh from the OS CSPRNG, or (opt-in) derived from the
    secret in ``privacy.noise_seed_file`` and a digest of this run's settings."""
    from dptrain.privacy.randomness import Randomness, settings_digest

    if conf.privacy.noise_seed_file is None:
        return Randomness.fresh()
    label = settings_digest(OmegaConf.to_container(cfg, resolve=True))
    return Randomness.from_seed_file(conf.privacy.noise_seed_file, run_label=label, run_dir=run_dir)


def check_model_before_data(conf: Config) -> None:
    """Build the model at its public input width and refuse models that mix examples or keep
    buffers (private runs), before any private row is read."""
    from dptrain.train import build_model, public_feature_count

    extra = conf.audit.canaries if conf.task == "audit" else 0
    build_model(conf, in_features=public_feature_count(conf.data) + extra)


def run(cfg: DictConfig, *, run_dir: Path) -> float:
    """Run one training job; returns the test accuracy (the objective a sweeper maximises)."""
    from dptrain.checkpoint import CheckpointError
    from dptrain.data import DataError, load_dataset
    from dptrain.privacy.accounting import AccountingError
    from dptrain.privacy.model_check import ModelCheckError
    from dptrain.privacy.randomness import RandomnessError
    from dptrain.tracking import Tracker, private_dir
    from dptrain.train import fit

    conf: Config = OmegaConf.to_object(cfg)
    if conf.task == "release":
        return run_release_task(conf, cfg, run_dir=run_dir)
    if conf.task == "audit":
        return run_audit_task(conf, cfg, run_dir=run_dir)
    try:
        validate(conf)
        randomness = build_randomness(conf, cfg, run_dir=run_dir)
        check_model_before_data(conf)
        data = load_dataset(conf.data, seed=conf.seed)
        delta = validate_against_size(conf, data.n_train)
    except (ConfigError, DataError, RandomnessError, ModelCheckError) as err:
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
    tracker = Tracker(private_dir(run_dir) if main_rank else run_dir, tensorboard=conf.logger.tensorboard and main_rank)
    try:
        result = fit(conf, data, delta=delta, tracker=tracker, run_dir=run_dir, dist_ctx=dist_ctx,
                     randomness=randomness)
    except (ConfigError, AccountingError, CheckpointError, ModelCheckError) as err:
        tracker.close()
        _fail(err)
    if not main_rank:  # only rank 0 writes artifacts
        from dptrain.distributed import shutdown

        shutdown()
        return float(result.metrics["test/acc"])
    report = write_training_outputs(conf, cfg, result, data=data, delta=delta, tracker=tracker, run_dir=run_dir)
    for line in summary_lines(result, report, delta=delta, dist_ctx=dist_ctx, run_dir=run_dir):
        log.info(line)
    if dist_ctx is not None:
        from dptrain.distributed import shutdown

        shutdown()
    return float(result.metrics["test/acc"])


#: metrics that never depend on private rows beyond what the guarantee covers
PUBLIC_METRICS = ("train/steps", "train/planned_steps", "train/epochs")


def write_training_outputs(conf: Config, cfg: DictConfig, result, *, data, delta: float, tracker,
                           run_dir: Path) -> dict:
    """The run folder: publishable files at the top (privacy report, model, covered metrics,
    FILES.txt), everything computed from private rows without protection under private/."""
    from dptrain.checkpoint import MODEL_FILENAME, save_model
    from dptrain.privacy.report import build_report, files_section, format_report
    from dptrain.tracking import atomic_write_text, private_dir, write_json, write_manifest
    from dptrain.train import final_epsilons

    # Hydra saves the composed config with interpolations; keep the resolved values beside it
    # (written only once training has succeeded: a refused resume must not overwrite the record).
    atomic_write_text(run_dir / ".hydra" / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    private = conf.privacy.enabled
    test_public = bool(conf.data.test_public)
    epsilons = final_epsilons(result, delta=delta) if private else None
    report = build_report(
        mechanism=result.privacy, epsilons=epsilons, accountant=conf.privacy.accountant,
        seed=conf.seed, data_source=data.source, test_public=test_public,
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
    m = result.metrics
    public = {k: m[k] for k in PUBLIC_METRICS if k in m}
    if private:
        public.update({"privacy/epsilon": report["epsilon"], "privacy/delta": delta})
    if test_public:
        public.update({k: v for k, v in m.items() if k.startswith("test/") or k == "baseline/majority_acc"})
    write_json(private_dir(run_dir) / "metrics.json", {**m, **public})
    write_json(run_dir / "metrics.json", public)
    save_model(run_dir / MODEL_FILENAME, model=result.model,
               model_config=OmegaConf.to_container(cfg.model, resolve=True),
               feature_names=list(data.feature_names),
               schema=OmegaConf.to_container(cfg.data, resolve=True), guarantee=report["guarantee"])
    write_json(run_dir / "privacy.json", report)
    atomic_write_text(run_dir / "privacy.txt", format_report(report))
    files = files_section(test_public=test_public)
    write_manifest(run_dir, publishable=files["publishable"], private=files["private"], guarantee=report["guarantee"])
    return report


def summary_lines(result, report: dict, *, delta: float, dist_ctx, run_dir: Path) -> list[str]:
    """What a finished training run prints."""
    m = result.metrics
    lines = [
        f"test accuracy: {m['test/acc']:.4f}   test loss: {m['test/loss']:.4f}   test AUC: {m['test/auc']:.4f}",
    ]
    if "baseline/nonprivate_acc" in m:
        lines.append(
            f"non-private baseline (sklearn LogisticRegression, same features/split): "
            f"{m['baseline/nonprivate_acc']:.4f}   majority class: {m['baseline/majority_acc']:.4f}"
        )
    if "epsilon" in report:
        eps = report["epsilon"]
        lines.append(
            f"privacy: epsilon = {eps:.4g}, delta = {delta:.3g} (accountant: {report['accountant']}; "
            + ", ".join(f"{k} {v:.4g}" for k, v in report["epsilons"].items())
            + f"), sigma = {report['noise_multiplier']:.4g}, C = {report['max_grad_norm']}, "
            f"q = {report['sample_rate']:.4g}, steps = {report['steps']}"
        )
        if result.privacy["stopped_early"]:
            lines.append(f"privacy budget: {result.privacy['stop_reason']}")
        if not report["private"]:
            lines.append("WARNING: epsilon is infinite: this run has NO privacy guarantee (sigma = 0)")
    else:
        lines.append("privacy: OFF (privacy.enabled=false): no differential privacy guarantee")
    if result.privacy.get("randomness_mode") == "seed_file":
        lines.append("WARNING: reproducible noise (privacy.noise_seed_file): whoever holds that file and this "
                     "command line can regenerate and remove the noise; keep it secret")
    if dist_ctx is not None:
        lines.append(f"distributed: {dist_ctx.world_size} processes ({dist_ctx.backend}); noise added once per "
                     "step on rank 0; only rank 0 wrote these outputs")
    lines.append(f"train loop: {m['time/train_seconds']:.1f} s for {m['train/steps']} steps; outputs in {run_dir} "
                 "(FILES.txt says which files may be published)")
    return lines


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


def run_release_task(conf: Config, cfg: DictConfig, *, run_dir: Path) -> float:
    """task=release: bad settings and bad data are refused by name before anything is written.

    The noise comes from a :class:`Randomness`: fresh from the OS CSPRNG, or, opted in with
    ``privacy.noise_seed_file=PATH``, derived from that secret file and a digest of this run's
    settings (no output holds the secret)."""
    from dptrain.data import DataError
    from dptrain.privacy.randomness import Randomness, RandomnessError, settings_digest
    from dptrain.release.cells import ReleaseError
    from dptrain.release.run import run_release

    try:
        validate(conf)
        seed_file = conf.privacy.noise_seed_file
        if seed_file is None:
            randomness = Randomness.fresh()
        else:
            label = settings_digest(OmegaConf.to_container(cfg, resolve=True))
            randomness = Randomness.from_seed_file(seed_file, run_label=label, run_dir=run_dir)
        return run_release(conf, run_dir, randomness=randomness)
    except (ConfigError, DataError, ReleaseError, RandomnessError) as err:
        _fail(err)


def run_audit_task(conf: Config, cfg: DictConfig, *, run_dir: Path) -> float:
    """task=audit (experiment=audit_logit / audit_mlp): one training run with canaries, then an
    epsilon lower bound beside the claimed epsilon (:mod:`dptrain.audit`). Returns the bound."""
    from dptrain.audit import format_audit, run_audit
    from dptrain.data import DataError, load_dataset
    from dptrain.privacy.accounting import AccountingError
    from dptrain.privacy.model_check import ModelCheckError
    from dptrain.privacy.randomness import RandomnessError
    from dptrain.tracking import atomic_write_text

    try:
        validate(conf)
        randomness = build_randomness(conf, cfg, run_dir=run_dir)
        check_model_before_data(conf)
        data = load_dataset(conf.data, seed=conf.seed)
        atomic_write_text(run_dir / ".hydra" / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        report = run_audit(conf, data, run_dir=run_dir, randomness=randomness)
    except (ConfigError, DataError, AccountingError, RandomnessError, ModelCheckError) as err:
        _fail(err)
    for line in format_audit(report):
        (log.warning if report["broken"] or report["claim_refuted"] else log.info)("%s", line)
    log.info("audit outputs in %s (audit.json, audit_canaries.csv; FILES.txt lists them)", run_dir)
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
