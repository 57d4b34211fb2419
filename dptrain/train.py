"""Fit and evaluate one model with DP-SGD (or without privacy, same pipeline)."""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn
from tqdm import tqdm

from dptrain.config import Config, ConfigError
from dptrain.data import Dataset
from dptrain.privacy.accounting import PrivacyAccountant, calibrate_noise_multiplier
from dptrain.privacy.engine import GradientEngine, PoissonSampler, make_engine, per_example_loss
from dptrain.privacy.randomness import Randomness
from dptrain.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    model: nn.Module
    metrics: dict[str, float]
    privacy: dict[str, Any]  # the mechanism's parameters (input to the privacy report)
    accountant: PrivacyAccountant = field(default_factory=PrivacyAccountant)


def public_feature_count(data_cfg: Any) -> int:
    """The model's input width from the PUBLIC schema alone (no row is read): numeric columns
    plus, per categorical column, its declared labels and the other slot."""
    from dptrain.data import _synthetic_schema, schema_from_config

    if (data_cfg.get("name") if isinstance(data_cfg, dict) else getattr(data_cfg, "name", None)) == "synthetic":
        _, _, numeric = _synthetic_schema(data_cfg)
        return len(schema_from_config(data_cfg, numeric=numeric).feature_names)
    return len(schema_from_config(data_cfg).feature_names)


def build_model(cfg: Config, *, in_features: int) -> nn.Module:
    """Instantiate ``model`` (Hydra ``_target_``) for ``in_features`` inputs and, for a private
    run, refuse it unless every example's output depends on that example alone
    (:func:`dptrain.privacy.model_check.check_model`)."""
    from dptrain.privacy.model_check import check_model

    model = instantiate(OmegaConf.create(cfg.model) if isinstance(cfg.model, dict) else cfg.model,
                        in_features=in_features)
    if cfg.privacy.enabled:
        check_model(model, in_features=in_features)
    return model


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy, mean log-loss and ROC AUC on held-out rows."""
    from sklearn.metrics import roc_auc_score

    logits = model(x)
    loss = float(per_example_loss(logits, y).mean())
    acc = float(((logits > 0).to(y.dtype) == y).float().mean())
    auc = float(roc_auc_score(y.numpy(), logits.numpy())) if 0 < float(y.mean()) < 1 else math.nan
    return {"acc": acc, "loss": loss, "auc": auc}


def nonprivate_baseline(data: Dataset, *, seed: int) -> float:
    """Test accuracy of a non-private sklearn LogisticRegression on the same features/split."""
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=2000, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(data.x_train.numpy(), data.y_train.numpy())
    return float(clf.score(data.x_test.numpy(), data.y_test.numpy()))


def resolve_noise(cfg: Config, *, sample_rate: float, steps: int, delta: float) -> tuple[float, str]:
    """sigma from config, or calibrated to target_epsilon (smallest sigma whose epsilon from
    the configured accountant is <= target, to a relative tolerance)."""
    p = cfg.privacy
    if p.noise_multiplier is not None:
        return float(p.noise_multiplier), "config"
    sigma = calibrate_noise_multiplier(
        target_epsilon=p.target_epsilon, sample_rate=sample_rate, steps=steps, delta=delta,
        accountant=p.accountant, rtol=p.calibration_rtol,
    )
    log.info(
        "calibrated noise_multiplier=%.6g for target_epsilon=%g (accountant=%s, q=%.6g, steps=%d, delta=%g)",
        sigma, p.target_epsilon, p.accountant, sample_rate, steps, delta,
    )
    return sigma, "calibrated"


def fit(cfg: Config, data: Dataset, *, delta: float, tracker: Tracker, run_dir: Path | None = None,
        on_engine: Callable[[GradientEngine], None] | None = None, dist_ctx: Any = None,
        randomness: Randomness | None = None, dataset_size: int | None = None) -> TrainResult:
    """Train with Poisson-sampled DP-SGD; returns the model, test metrics and mechanism.

    ``randomness`` is the source of the SECRET streams, the Poisson sampler and the noise
    (:mod:`dptrain.privacy.randomness`): by default fresh from the OS CSPRNG for this run, so no
    output can regenerate them. ``cfg.seed`` only seeds the model's initialisation (torch's
    global generator).

    ``dataset_size`` is the PUBLIC N from which q = B/N, the planned steps and the budget are
    computed (default: the training rows). The audit passes a count that does not depend on
    which canaries were drawn in.

    With ``run_dir``, checkpoints go to ``run_dir/private/checkpoint.pt`` every
    ``trainer.checkpoint_every`` steps and at the end (atomically), and ``trainer.resume``
    continues from one (:mod:`dptrain.checkpoint`). ``privacy.max_epsilon`` stops training at
    the last step whose epsilon (headline accountant, whole history) stays within the budget; a
    resume whose history already exceeds it is refused.

    ``on_engine`` (tests and the privacy audit only) is called with the engine before the first
    step, e.g. to break it on purpose and check that the audit notices.

    ``dist_ctx`` (a :class:`dptrain.distributed.DistContext`): one job across processes; each
    rank Poisson-samples its own shard, the clipped sums are all-reduced, rank 0 adds the noise
    once, and only rank 0 evaluates and writes (see :mod:`dptrain.distributed`)."""
    from dptrain.checkpoint import (
        CheckpointError,
        check_fingerprint,
        checkpoint_path_in,
        load_checkpoint,
        resolve_resume,
        restore,
        save_checkpoint,
    )

    t, p = cfg.trainer, cfg.privacy
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    torch.manual_seed(cfg.seed)  # model initialisation only: public, data-independent
    rank, world = (dist_ctx.rank, dist_ctx.world_size) if dist_ctx is not None else (0, 1)
    main = rank == 0
    randomness = randomness if randomness is not None else Randomness.fresh()
    sample_gen = randomness.numpy("poisson-sampler", rank)
    noise_gen = randomness.torch("gaussian-noise")
    n, batch = (dataset_size if dataset_size is not None else data.n_train), t.batch_size
    q = batch / n
    planned = max(1, round(t.epochs / q))
    private = p.enabled
    sigma, sigma_source = resolve_noise(cfg, sample_rate=q, steps=planned, delta=delta) if private else (0.0, "off")
    fingerprint = {
        "enabled": private, "noise_multiplier": sigma, "max_grad_norm": float(p.max_grad_norm) if private else None,
        "sample_rate": q, "expected_batch_size": batch, "dataset_size": n,
        "delta": delta if private else None, "planned_steps": planned,
        "accountant": p.accountant if private else None,
        "world_size": world, "randomness": randomness.mode,
    }

    model = build_model(cfg, in_features=data.n_features)
    optim_factory = instantiate(OmegaConf.create(cfg.optim) if isinstance(cfg.optim, dict) else cfg.optim)
    optimizer = optim_factory(params=[p for p in model.parameters() if p.requires_grad])
    accountant = PrivacyAccountant()
    done, train_seconds = 0, 0.0
    resume_path = resolve_resume(t.resume, run_dir) if run_dir is not None else None
    if t.resume is not None and run_dir is None:
        raise CheckpointError("trainer.resume needs a run folder")
    if resume_path is not None:
        state = load_checkpoint(resume_path)
        check_fingerprint(state["fingerprint"], fingerprint, resume_path)
        restore(state, model=model, optimizer=optimizer, sample_rng=sample_gen, noise_gen=noise_gen,
                path=resume_path, rank=rank)
        accountant.load_state_dict(state["accountant"])
        done, train_seconds = int(state["step"]), float(state["train_seconds"])
        if accountant.steps != (done if private else 0):
            raise CheckpointError(
                f"checkpoint {resume_path} is inconsistent: step {done} but the accountant recorded "
                f"{accountant.steps} steps; refusing to resume"
            )
        log.info("resumed from %s at step %d of %d (accountant history restored: %s; sampler and noise: %s)",
                 resume_path, done, planned, accountant.history,
                 "restored" if randomness.reproducible else "fresh streams from the OS CSPRNG")

    engine = make_engine(
        model, engine=t.engine, private=private, max_grad_norm=p.max_grad_norm,
        noise_multiplier=sigma, expected_batch_size=batch, generator=noise_gen,
    )
    if dist_ctx is not None:
        dist_ctx.broadcast_parameters(model)
        engine.dist = dist_ctx
    if on_engine is not None:
        on_engine(engine)

    steps, stop_reason = planned_steps_within_budget(cfg, accountant, done=done, planned=planned, sigma=sigma,
                                                     sample_rate=q, delta=delta)
    tracker.purge_after(done)  # a resumed run overwrites TensorBoard points logged after its checkpoint
    log.info("engine=%s, N=%d, B=%d, q=%.6g, steps=%d, sigma=%g", engine.name, n, batch, q, steps, sigma)
    # this rank's shard (all rows when not distributed): rows rank, rank + W, rank + 2W, ...
    x_train, y_train = (data.x_train, data.y_train) if world == 1 else (
        data.x_train[rank::world].contiguous(), data.y_train[rank::world].contiguous())
    sampler = PoissonSampler(num_rows=x_train.shape[0], sample_rate=q, rng=sample_gen)
    checkpoint_path = checkpoint_path_in(run_dir) if run_dir is not None else None

    def checkpoint(step: int) -> None:
        # the secret streams' states are stored only when the user opted into reproducible noise
        keep = randomness.reproducible
        samplers = (dist_ctx.all_gather_objects(sample_gen.bit_generator.state)
                    if dist_ctx is not None and checkpoint_path is not None and keep else None)
        if checkpoint_path is not None and main:
            save_checkpoint(
                checkpoint_path, step=step, model=model, optimizer=optimizer,
                accountant_state=accountant.state_dict(), sample_rng=sample_gen if keep else None,
                noise_state=engine.noise_generator_state() if keep else None,
                fingerprint=fingerprint, train_seconds=train_seconds, samplers=samplers,
            )

    sizes, window = 0, 0  # realised batch sizes since the last log line (a non-private diagnostic)
    loop_start = time.perf_counter()
    bar = tqdm(total=steps, initial=min(done, steps), disable=not (t.progress and main),
               desc="dp-sgd" if private else "sgd", dynamic_ncols=True)
    for step in range(done + 1, steps + 1):
        log_now = step % t.log_every == 0 or step == steps
        engine.collect_stats = log_now  # diagnostics only on logged steps: off the hot path
        t0 = time.perf_counter()
        idx = sampler.sample()
        stats = engine(x_train.index_select(0, idx), y_train.index_select(0, idx))
        optimizer.step()
        train_seconds += time.perf_counter() - t0
        if private:
            accountant.step(noise_multiplier=sigma, sample_rate=q)
        sizes, window = sizes + stats.batch_size, window + 1
        if log_now:
            seen = max(stats.batch_size, 1)
            diag = {  # the logged step's own batch (non-private: computed on training rows)
                "diagnostics_nonprivate/train_loss": stats.loss_sum / seen,
                "diagnostics_nonprivate/train_acc": stats.correct / seen,
                "diagnostics_nonprivate/batch_size": sizes / window if world == 1 else stats.batch_size,
            }
            if private:
                diag["diagnostics_nonprivate/clip_fraction"] = stats.clipped / seen
                diag["privacy/epsilon"] = accountant.get_epsilon(delta=delta, accountant="rdp")
            tracker.scalars(diag, step=step)
            postfix = {"loss": f"{diag['diagnostics_nonprivate/train_loss']:.4f}",
                       "acc": f"{diag['diagnostics_nonprivate/train_acc']:.3f}"}
            if private:
                postfix["eps"] = f"{diag['privacy/epsilon']:.3f}"
            bar.set_postfix(postfix, refresh=False)
            sizes, window = 0, 0
        if step % t.eval_every == 0 and step != steps and main:
            tracker.scalars({f"test/{k}": v for k, v in evaluate(model, data.x_test, data.y_test).items()}, step=step)
        if t.checkpoint_every > 0 and step % t.checkpoint_every == 0 and step != steps:
            checkpoint(step)
        bar.update(1)
    bar.close()
    loop_seconds = time.perf_counter() - loop_start
    final_step = max(steps, done)
    checkpoint(final_step)

    test = evaluate(model, data.x_test, data.y_test)  # identical parameters on every rank
    tracker.scalars({f"test/{k}": v for k, v in test.items()}, step=final_step)
    metrics: dict[str, float] = {f"test/{k}": v for k, v in test.items()}
    metrics["baseline/majority_acc"] = float(max(data.y_test.mean(), 1 - data.y_test.mean()))
    if t.baseline and main:
        metrics["baseline/nonprivate_acc"] = nonprivate_baseline(data, seed=cfg.seed)
    metrics.update({
        "train/steps": final_step,
        "train/planned_steps": planned,
        "train/resumed_from_step": done,
        "train/epochs": final_step * q,
        "time/train_seconds": train_seconds,
        "time/loop_seconds": loop_seconds,
        "time/steps_per_second": final_step / train_seconds if train_seconds > 0 else math.nan,
    })
    mechanism = {
        "enabled": private,
        "engine": engine.name,
        "noise_multiplier": sigma,
        "noise_multiplier_source": sigma_source,
        "target_epsilon": p.target_epsilon,
        "max_grad_norm": p.max_grad_norm,
        "sample_rate": q,
        "expected_batch_size": batch,
        "dataset_size": n,
        "steps": final_step,
        "planned_steps": planned,
        "epochs": final_step * q,
        "delta": delta,
        "delta_source": "config" if p.delta is not None
        else "default: largest power of ten <= 1/(10 N)",
        "max_epsilon": p.max_epsilon if private else None,
        "stopped_early": final_step < planned,
        "stop_reason": stop_reason,
        "resumed_from_step": done,
        "resumed_from": str(resume_path) if resume_path is not None else None,
        "randomness": randomness.describe(),
        "randomness_mode": randomness.mode,
        "checkpoint": str(checkpoint_path) if checkpoint_path is not None else None,
        "distributed": None if dist_ctx is None else {
            "world_size": world, "backend": dist_ctx.backend,
            "sharding": "disjoint shards (row i on rank i mod W), each Poisson-sampled at the job's q "
            "with a rank-specific stream",
            "reduction": "all_reduce of the clipped sums; noise N(0, sigma^2 C^2) drawn once per step on "
            "rank 0; divided by the global expected batch size",
        },
    }
    return TrainResult(model=model, metrics=metrics, privacy=mechanism, accountant=accountant)


def planned_steps_within_budget(cfg: Config, accountant: PrivacyAccountant, *, done: int, planned: int,
                                sigma: float, sample_rate: float, delta: float) -> tuple[int, str]:
    """(steps to run to, stop reason) under ``privacy.max_epsilon``: the last step count whose
    epsilon (headline accountant, over the WHOLE history, resumed part included) stays within
    the budget. Computed before training: epsilon depends on (sigma, q, steps) only, never on
    the data. A resumed history that already exceeds the budget is refused (its model has that
    epsilon whatever happens next)."""
    p = cfg.privacy
    if not p.enabled or p.max_epsilon is None:
        return planned, "completed the planned steps"
    if done:
        spent = accountant.get_epsilon(delta=delta, accountant=p.accountant)
        if spent > p.max_epsilon:
            raise ConfigError(
                f"privacy.max_epsilon={p.max_epsilon:g} is not allowed for this resume: the checkpoint's history "
                f"already spent {p.accountant} epsilon {spent:.6g} in {done} steps, so its model has that epsilon; "
                f"allowed: privacy.max_epsilon >= {spent:.6g}, or a new run folder to train from scratch"
            )
    allowed = done + accountant.max_steps_within(
        max_epsilon=p.max_epsilon, noise_multiplier=sigma, sample_rate=sample_rate, delta=delta,
        accountant=p.accountant, limit=max(planned - done, 0),
    )
    if allowed >= planned:
        return planned, "completed the planned steps"
    reason = (
        f"privacy.max_epsilon={p.max_epsilon:g} reached: stopped after step {allowed} of {planned} "
        f"({p.accountant} epsilon after {allowed} steps is within the budget, after {allowed + 1} it "
        "would exceed it)"
    )
    log.warning("privacy budget: %s", reason)
    return allowed, reason


def final_epsilons(result: TrainResult, *, delta: float) -> dict[str, float]:
    """Epsilon of the whole run from every accountant (PLD composes the recorded history)."""
    return {name: result.accountant.get_epsilon(delta=delta, accountant=name) for name in ("rdp", "pld")}


