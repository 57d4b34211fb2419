"""The training task: fit one model with DP-SGD (or without privacy, same pipeline).

Reading order: :func:`run_task` (the task as the command line runs it) -> :func:`fit` (set-up,
resume, budget, the loop, summary) -> the pieces, each its own function. The mechanism (sigma,
C, q, B, N, steps, delta, accountant) is one value, :class:`DPSGDMechanism`, built before the
model sees a row; the engine and the accountant both read it. What the model's outputs mean is
the objective's business (:mod:`dptrain.models.objectives`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn
from tqdm import tqdm

from dptrain.core.dataspec import DataSpec
from dptrain.core.device import describe, resolve_device
from dptrain.core.validation import ConfigError
from dptrain.data import Dataset
from dptrain.data.shards import SHARDED_NOTE, baseline_data
from dptrain.models.optimizers import build_optimizer
from dptrain.privacy.accounting import DEFAULT, RDP, REPORTED, PrivacyLedger, accountant_named
from dptrain.privacy.budget import Budget
from dptrain.privacy.curves import TAG as CURVE_TAG
from dptrain.privacy.curves import CurveConfig, resolve_loss_bound
from dptrain.privacy.dpsgd.engine import GradientEngine
from dptrain.privacy.dpsgd.graph import BatchStep
from dptrain.privacy.dpsgd.loop import PrivateStep
from dptrain.privacy.dpsgd.mechanism import DPSGDMechanism
from dptrain.privacy.dpsgd.model_check import check_model
from dptrain.privacy.dpsgd.sampling import DevicePoissonSampler, make_sampler
from dptrain.privacy.dpsgd.units import UnitBatchStep
from dptrain.privacy.randomness import Randomness, data_digest
from dptrain.runfolder.stopping import RunStopped, StopSignals
from dptrain.runfolder.tracking import Tracker
from dptrain.training import checkpoint  # checkpoint.save_checkpoint: looked up per call (crash tests wrap it)
from dptrain.training.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_fingerprint,
    checkpoint_path_in,
    load_checkpoint,
    resolve_resume,
    restore,
)
from dptrain.training.plan import Loop, TrainingPlan
from dptrain.training.units import unit_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchConfig:
    """Where and how a run executes: its folder (checkpoints, resume), the source of its secret
    randomness (default: fresh from the OS CSPRNG) and, for one job across processes, the
    :class:`dptrain.training.distributed.DistContext`. ``quiet``: the fit's set-up lines (engine, CUDA
    graph) go to the log at DEBUG, not INFO: a caller that fits a secret number of times
    (``task=tune``) prints no line per fit."""

    run_dir: Path | None = None
    randomness: Randomness | None = None
    dist: Any = None
    quiet: bool = False
    #: the run's whole epsilon (its target, or its plan with a given sigma), which the progress bar
    #: shows the epsilon spent so far against; None: the bar shows the spend alone
    total_epsilon: float | None = None


@dataclass
class TrainResult:
    model: nn.Module
    metrics: dict[str, float]
    privacy: dict[str, Any]  # the mechanism and how the run went (input to the privacy report)
    accountant: PrivacyLedger = field(default_factory=PrivacyLedger)
    mechanism: DPSGDMechanism | None = None
    inference: dict[str, Any] | None = None  # what an estimator's coefficient table needs (dptrain.inference)
    curve: tuple[float, ...] = ()  # the dp/ curve's values released by this process (DP releases), in step order


# ------------------------------------------------------------------------------ the task


def bound_to_rows(randomness: Randomness, data: Dataset, *, dist: Any = None) -> Randomness:
    """The run's streams bound to its training rows (:meth:`Randomness.for_data`): with an opt-in
    noise key, a table with one row more draws independent noise. Every rank binds to the digest
    of ALL training rows (a sharded read: the ranks' digests in rank order), so the noise drawn on
    rank 0 changes whichever rank holds a changed row. Fresh OS entropy is returned as it is."""
    if not randomness.reproducible:
        return randomness
    digest = data_digest(data.x_train, data.y_train)
    if dist is not None and data.shard is not None:
        digest = data_digest(*dist.all_gather_objects(digest))
    return randomness.for_data(digest)


# ------------------------------------------------------------------------------ set-up pieces


def build_model(plan: TrainingPlan, *, spec: DataSpec | None = None) -> nn.Module:
    """Instantiate the plan's model (Hydra ``_target_``) for the data's description (``spec``,
    default the plan's) and the objective's output width and, for a private run, refuse it unless
    every example's output depends on that example alone
    (:func:`dptrain.privacy.dpsgd.model_check.check_model`)."""
    spec = plan.spec if spec is None else spec
    plan.objective.check_data(spec)
    width = plan.objective.output_width(spec)
    extra = {} if width == 1 else {"out_features": width}
    with torch.device("cpu"):  # built on the CPU from the public seed (the same weights on every device), then moved
        model = instantiate(OmegaConf.create(dict(plan.model)), in_features=spec.n_features, **extra)
    if plan.private:
        check_model(model, in_features=spec.n_features)
    return model


def mechanism_for(plan: TrainingPlan, *, dataset_size: int, delta: float, curves: bool = True,
                  quiet: bool = False) -> DPSGDMechanism:
    """The mechanism of DP-SGD's part of the plan's budget (:attr:`Budget.dpsgd`) and the PUBLIC N
    (sigma given or calibrated), with the dp/ training-loss curve when the run is private and
    ``trainer.dp_curves`` is on (and ``curves``: the audit passes False, dptrain.privacy.curves)."""
    return DPSGDMechanism.from_budget(plan.budget.dpsgd, max_grad_norm=plan.max_grad_norm, epochs=plan.loop.epochs,
                                      expected_batch_size=plan.loop.batch_size, dataset_size=dataset_size,
                                      delta=delta, curves=curve_config(plan) if curves else None,
                                      quiet=quiet).per_unit(plan.unit)


def curve_config(plan: TrainingPlan) -> CurveConfig | None:
    """What the run asks of its dp/ curve (None: no curve): ``trainer.log_every``,
    ``trainer.curve_budget_share`` and the loss bound L (``trainer.curve_loss_bound`` or the
    objective's default for the PUBLIC data description)."""
    t = plan.loop
    if not (plan.private and t.dp_curves):
        return None
    bound, source = resolve_loss_bound(t.curve_loss_bound, plan.objective, plan.spec)
    return CurveConfig(log_every=t.log_every, budget_share=float(t.curve_budget_share), loss_bound=bound,
                       loss_bound_source=source)


@dataclass
class _Run:
    """Everything the loop touches, built by :func:`_set_up`."""

    plan: TrainingPlan
    mechanism: DPSGDMechanism
    objective: Any
    model: nn.Module
    optimizer: torch.optim.Optimizer
    engine: GradientEngine
    accountant: PrivacyLedger
    sampler: Any  # PoissonSampler (CPU), PinnedPoissonSampler or DevicePoissonSampler (GPU)
    x: torch.Tensor
    y: torch.Tensor
    launch: LaunchConfig
    randomness: Randomness
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    x_test: torch.Tensor | None = None  # the held-out rows' features on the run's device
    rank: int = 0
    world: int = 1
    done: int = 0
    train_seconds: float = 0.0
    steps: int = 0
    stop_reason: str = "completed the planned steps"
    resume_path: Path | None = None
    curve: list[float] = field(default_factory=list)  # the dp/ curve's released values, in step order
    average: list[torch.Tensor] | None = None  # trainer.average: the running mean of the tail's iterates
    averaged: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def fingerprint(self) -> dict[str, Any]:
        return self.mechanism.fingerprint(world_size=self.world, randomness=self.randomness.mode)


def run_device(loop: Loop, *, distributed: bool | None = None) -> torch.device:
    """The run's device from ``trainer.device`` (:mod:`dptrain.core.device`); raises before any row
    is read when it does not exist here."""
    distributed = loop.distributed if distributed is None else distributed
    return resolve_device(loop.device, distributed=distributed)


def _set_up(plan: TrainingPlan, data: Dataset, mechanism: DPSGDMechanism, launch: LaunchConfig) -> _Run:
    """Threads, the initial weights (from the public ``seed``), the secret streams, the model,
    optimiser, engine (built BY the mechanism), accountant and this rank's sampler, everything
    on the run's device (``trainer.device``)."""
    if plan.loop.threads > 0:
        torch.set_num_threads(plan.loop.threads)
    torch.manual_seed(plan.seed)  # model initialisation only: public, data-independent
    dist = launch.dist
    rank, world = (dist.rank, dist.world_size) if dist is not None else (0, 1)
    device = run_device(plan.loop, distributed=dist is not None)
    randomness = launch.randomness if launch.randomness is not None else Randomness.fresh()
    if not randomness.bound:  # a noise key handed to fit() directly: bound to the rows it trains on
        randomness = bound_to_rows(randomness, data, dist=dist)
    objective = plan.objective
    model = build_model(plan, spec=data.spec).to(device)
    optimizer = build_optimizer(dict(plan.optim), [p for p in model.parameters() if p.requires_grad])
    engine = mechanism.build_engine(model, engine=plan.loop.engine, objective=objective,
                                    generator=randomness.torch("gaussian-noise", device=device))
    # this rank's shard (all rows when not distributed): rows rank, rank + W, rank + 2W, ...; a
    # sharded read (data.shard) holds only this rank's rows already (dptrain.data.shards)
    x, y = (data.x_train, data.y_train) if world == 1 or data.shard is not None else (
        data.x_train[rank::world].contiguous(), data.y_train[rank::world].contiguous())
    if plan.unit is not None:  # person-level: at most k rows per unit (secret), rows ordered by unit, units sampled
        x, y, sampler = unit_rows(data, plan.unit, sample_rate=mechanism.sample_rate, randomness=randomness,
                                  rank=rank, world=world)
    else:
        sampler = make_sampler(num_rows=x.shape[0], sample_rate=mechanism.sample_rate, randomness=randomness,
                               index=rank, device=device)
    x, y = x.to(device), y.to(device)
    return _Run(plan=plan, mechanism=mechanism, objective=objective, model=model, optimizer=optimizer, engine=engine,
                accountant=PrivacyLedger(), sampler=sampler, x=x, y=y, launch=launch, randomness=randomness,
                rank=rank, world=world, device=device, x_test=data.x_test.to(device))


def _resume(run: _Run) -> None:
    """Continue from a checkpoint (``trainer.resume``): model, optimiser, the accountant's full
    history, and the secret streams where the run opted into reproducible noise."""
    resume = run.plan.loop.resume
    if resume is not None and run.launch.run_dir is None:
        raise CheckpointError("trainer.resume needs a run folder")
    path = resolve_resume(resume, run.launch.run_dir) if run.launch.run_dir is not None else None
    if path is None:
        return
    state = load_checkpoint(path)
    check_fingerprint(state["fingerprint"], run.fingerprint(), path)
    restore(state, model=run.model, optimizer=run.optimizer, sampler=run.sampler,
            noise_gen=run.engine.generator, path=path, rank=run.rank)
    run.accountant.load_state_dict(state["accountant"])
    run.done, run.train_seconds, run.resume_path = int(state["step"]), float(state["train_seconds"]), path
    if state.get("average") is not None:
        run.average = [t.to(run.device) for t in state["average"]]
        run.averaged = int(state.get("averaged", 0))
    if run.accountant.steps != (run.done if run.mechanism.enabled else 0):
        raise CheckpointError(f"checkpoint {path} is inconsistent: step {run.done} but the accountant recorded "
                              f"{run.accountant.steps} steps; refusing to resume")
    log.info("resumed from %s at step %d of %d (accountant history restored: %s; sampler and noise: %s)",
             path, run.done, run.mechanism.planned_steps,
             ", ".join(f"{c} x {e.kind}{e.params}" for e, c in run.accountant.totals),
             "restored" if run.randomness.reproducible else "fresh streams from the OS CSPRNG")


def planned_steps_within_budget(budget: Budget, accountant: PrivacyLedger, *, done: int,
                                mechanism: DPSGDMechanism) -> tuple[int, str]:
    """(steps to run to, stop reason) under ``privacy.max_epsilon``: the last step count whose
    epsilon (headline accountant, over the WHOLE history, resumed part included, and the dp/
    curve's releases: every log_every-th step and the last) stays within the budget. Computed
    before training: epsilon depends on the mechanism only, never on the data. A resumed
    history that already exceeds the budget is refused (its model has that epsilon whatever
    happens next)."""
    p, planned = budget, mechanism.planned_steps
    if not p.enabled or p.max_epsilon is None:
        return planned, "completed the planned steps"
    if done:
        spent = accountant.get_epsilon(delta=mechanism.delta, accountant=p.accountant)
        if spent > p.max_epsilon:
            raise ConfigError(
                f"privacy.max_epsilon={p.max_epsilon:g} is not allowed for this resume: the checkpoint's history "
                f"already spent {p.accountant} epsilon {spent:.6g} in {done} steps, so its model has that epsilon; "
                f"allowed: privacy.max_epsilon >= {spent:.6g}, or a new run folder to train from scratch"
            )
    # the steps done+1 .. done+k, the last of them (k) releasing the dp/ curve when there is one
    allowed = done + accountant.max_steps_within(max_epsilon=p.max_epsilon, delta=mechanism.delta,
                                                 accountant=p.accountant, limit=max(planned - done, 0),
                                                 events_for=lambda k: mechanism.history_between(done, done + k))
    if allowed >= planned:
        return planned, "completed the planned steps"
    reason = (f"privacy.max_epsilon={p.max_epsilon:g} reached: stopped after step {allowed} of {planned} "
              f"({p.accountant} epsilon after {allowed} steps is within the budget, after {allowed + 1} it "
              "would exceed it)")
    log.warning("privacy budget: %s", reason)
    return allowed, reason


# ------------------------------------------------------------------------------ fit


def fit(plan: TrainingPlan, data: Dataset, *, mechanism: DPSGDMechanism, tracker: Tracker | None = None,
        launch: LaunchConfig | None = None, on_engine: Callable[[GradientEngine], None] | None = None) -> TrainResult:
    """Train with Poisson-sampled DP-SGD under ``mechanism``; returns the model, test metrics
    and what the report needs.

    ``launch.randomness`` is the source of the SECRET streams, the Poisson sampler and the noise
    (:mod:`dptrain.privacy.randomness`): by default fresh from the OS CSPRNG for this run, so no
    output can regenerate them. ``plan.seed`` only seeds the model's initialisation. With
    ``launch.run_dir``, checkpoints go to ``run_dir/private/checkpoint.pt`` every
    ``trainer.checkpoint_every`` steps and at the end, and ``trainer.resume`` continues from one.
    ``privacy.max_epsilon`` stops at the last step within the budget. ``launch.dist``: one job
    across processes (:mod:`dptrain.training.distributed`). ``on_engine`` (tests) sees the engine before
    the first step."""
    launch = launch if launch is not None else LaunchConfig()
    tracker = tracker if tracker is not None else Tracker(Path("."), tensorboard=False)
    run = _set_up(plan, data, mechanism, launch)
    _resume(run)
    if launch.dist is not None:
        launch.dist.broadcast_parameters(run.model)
        run.engine.dist = launch.dist
    if on_engine is not None:
        on_engine(run.engine)
    run.steps, run.stop_reason = planned_steps_within_budget(plan.budget, run.accountant, done=run.done,
                                                             mechanism=mechanism)
    tracker.purge_after(run.done)  # a resumed run overwrites TensorBoard points logged after its checkpoint
    with StopSignals(enabled=launch.dist is None) as stop:  # from here a stop signal ends at a step boundary
        log.log(logging.DEBUG if launch.quiet else logging.INFO, "engine=%s, N=%d, B=%d, q=%.6g, steps=%d, sigma=%g",
                run.engine.name, mechanism.dataset_size, mechanism.expected_batch_size, mechanism.sample_rate,
                run.steps, mechanism.noise_multiplier)
        loop_seconds = _loop(run, data, tracker, stop)
    return _summarise(run, data, tracker, loop_seconds)


def _loop(run: _Run, data: Dataset, tracker: Tracker, stop: StopSignals) -> float:
    """The DP-SGD steps: sample, clipped noisy gradient, optimiser step, account. Returns the
    loop's wall time."""
    t = run.plan.loop
    start = time.perf_counter()
    bar = tqdm(total=run.steps, initial=min(run.done, run.steps), disable=not (t.progress and run.main),
               desc="dp-sgd" if run.mechanism.enabled else "sgd", dynamic_ncols=True)
    # draws each step's Poisson batch and runs the engine; on a GPU the unlogged steps replay one
    # CUDA graph (dptrain.privacy.dpsgd.graph)
    batch_step = (UnitBatchStep(run.engine, run.sampler, run.x, run.y) if run.plan.unit is not None
                  else BatchStep(run.engine, run.sampler, run.x, run.y, cuda_graph=t.cuda_graph))
    if run.device.type == "cuda" and batch_step.graph_reason is not None:
        log.log(logging.DEBUG if run.launch.quiet else logging.INFO, "CUDA graph: off, %s", batch_step.graph_reason)
    # THE DP-SGD step (dptrain.privacy.dpsgd.loop): batch_step's draw and engine, then the optimiser and the accountant
    private_step = PrivateStep(run.engine, run.sampler, run.optimizer, run.x, run.y, accountant=run.accountant,
                               batch_step=batch_step)
    _steps(run, data, tracker, bar, private_step, stop)
    bar.close()
    return time.perf_counter() - start


def _steps(run: _Run, data: Dataset, tracker: Tracker, bar: Any, private_step: PrivateStep,
           stop: StopSignals) -> None:
    """Steps ``run.done + 1`` to ``run.steps``, each one call of ``private_step`` (sample, clipped
    noisy gradient, optimiser step, the step's event recorded when the mechanism is enabled); a
    stop signal ends the loop after the current step with a checkpoint of it
    (:mod:`dptrain.runfolder.stopping`)."""
    t = run.plan.loop
    sizes, window = 0, 0  # realised batch sizes since the last log line (a non-private diagnostic)
    average_from = average_start(run.steps, t.average)
    for step in range(run.done + 1, run.steps + 1):
        log_now = step % t.log_every == 0 or step == run.steps
        curve_now = run.mechanism.curve_due(step, last=run.steps)  # the dp/ curve: the same steps
        run.engine.collect_stats = log_now or curve_now  # diagnostics only on logged steps: off the hot path
        event = run.mechanism.event_at(step, last=run.steps) if run.mechanism.enabled else None
        t0 = time.perf_counter()
        stats = private_step(event)
        run.train_seconds += time.perf_counter() - t0
        if step > average_from:
            _accumulate(run)
        sizes, window = sizes + stats.batch_size, window + 1
        if curve_now and run.main:
            run.curve.append(release_curve(run, stats, step))
            tracker.scalars({CURVE_TAG: run.curve[-1]}, step=step)
        if log_now:
            _log_step(run, tracker, bar, step, stats, sizes / window)
            sizes, window = 0, 0
        if step % t.eval_every == 0 and step != run.steps and (run.main or data.shard is not None):
            tracker.scalars({f"test/{k}": v for k, v in evaluate(run, data, rows=t.eval_rows).items()}, step=step)
        if t.checkpoint_every > 0 and step % t.checkpoint_every == 0 and step != run.steps:
            _checkpoint(run, step)
        bar.update(1)
        if stop.requested is not None and step != run.steps:
            bar.close()
            _checkpoint(run, step)
            where = checkpoint_path_in(run.launch.run_dir) if run.launch.run_dir is not None else None
            raise RunStopped(signal_name=stop.requested, step=step, planned=run.steps, checkpoint=where)


def average_start(steps: int, share: float) -> int:
    """The last step whose iterate is NOT averaged (trainer.average): the published model is the
    mean of the iterates of steps ``average_start + 1 .. steps`` (``steps`` itself with share 0)."""
    if share <= 0:
        return steps
    return min(steps - 1, int(math.floor(steps * (1.0 - share))))


@torch.no_grad()
def _accumulate(run: _Run) -> None:
    """Add the current iterate to the running mean of the averaged ones (Polyak-Ruppert)."""
    params = [p.detach() for p in run.model.parameters()]
    run.averaged += 1
    if run.average is None:
        run.average = [p.clone() for p in params]
        return
    for a, p in zip(run.average, params, strict=True):
        a.add_(p - a, alpha=1.0 / run.averaged)


def release_curve(run: _Run, stats: Any, step: int) -> float:
    """The dp/ curve's value at ``step``: the mechanism's noisy, bounded loss mean, its one normal
    draw from the run's SECRET randomness, a stream "curve-noise" of its own keyed by the step.
    So the gradient noise and the sampler are unchanged, a resumed seed-file run redraws the same
    values, and two runs sharing a seed file that stop at different steps (privacy.max_epsilon is
    not in the label) never add one draw to two different sums."""
    return run.mechanism.release_curve(stats.bounded_loss_sum, run.randomness.numpy("curve-noise", step))


def _log_step(run: _Run, tracker: Tracker, bar: Any, step: int, stats: Any, mean_batch: float) -> None:
    """The logged step's non-private diagnostics (computed on training rows) and epsilon so far."""
    seen = max(stats.batch_size, 1)
    diag = {"diagnostics_nonprivate/train_loss": stats.loss_sum / seen}
    postfix = {"loss": f"{diag['diagnostics_nonprivate/train_loss']:.4f}"}
    if "acc" in run.objective.metric_names:  # a classifier (objective=linear has no accuracy)
        diag["diagnostics_nonprivate/train_acc"] = stats.correct / seen
        postfix["acc"] = f"{diag['diagnostics_nonprivate/train_acc']:.3f}"
    diag["diagnostics_nonprivate/batch_size"] = mean_batch if run.world == 1 else stats.batch_size
    if run.mechanism.enabled:
        diag["diagnostics_nonprivate/clip_fraction"] = stats.clipped / seen
        diag["privacy/epsilon"] = run.accountant.get_epsilon(delta=run.mechanism.delta, accountant=RDP)
        total = run.launch.total_epsilon
        spent = f"{diag['privacy/epsilon']:.3f}"
        postfix["eps" if accountant_named(run.mechanism.accountant) is RDP else f"eps({RDP.name})"] = (
            spent if total is None else f"{spent}/{total:.3g}")  # so far, of the run's whole epsilon
    tracker.scalars(diag, step=step)
    bar.set_postfix(postfix, refresh=False)


def _checkpoint(run: _Run, step: int) -> None:
    """Rank 0 writes the checkpoint; the secret streams' states only with reproducible noise."""
    if run.launch.run_dir is None:
        return
    keep, dist = run.randomness.reproducible, run.launch.dist
    samplers = dist.all_gather_objects(run.sampler.get_state()) if dist is not None and keep else None
    if run.main:
        checkpoint.save_checkpoint(checkpoint_path_in(run.launch.run_dir), Checkpoint(
            step=step, model=run.model, optimizer=run.optimizer, accountant_state=run.accountant.state_dict(),
            fingerprint=run.fingerprint(), train_seconds=run.train_seconds,
            sampler_state=run.sampler.get_state() if keep else None, samplers=samplers,
            noise_state=run.engine.noise_generator_state() if keep else None,
            streams_device=run.device.type if keep else None, average=run.average, averaged=run.averaged))


@torch.no_grad()
def evaluate(run: _Run, data: Dataset, *, rows: int = 0) -> dict[str, float]:
    """The objective's metrics on the held-out rows: outputs computed on the run's device, the
    metrics on the CPU; a sharded read's test rows are every rank's, gathered (a collective, so
    every rank calls it). ``rows`` > 0: only the first that many test rows (an evaluation during
    training, ``trainer.eval_rows``; not on a sharded read)."""
    x, y = (run.x_test if run.x_test is not None else data.x_test), data.y_test
    if rows > 0 and data.shard is None and len(y) > rows:
        x, y = x[:rows], y[:rows]
    outputs = run.model(x).cpu()
    if data.shard is not None:
        outputs, y = run.launch.dist.gather_rows(outputs, y)
    return run.objective.metrics(outputs, y)


def _summarise(run: _Run, data: Dataset, tracker: Tracker, loop_seconds: float) -> TrainResult:
    """The final checkpoint, test metrics, baselines and the run's record for the report."""
    final_step = max(run.steps, run.done)
    _checkpoint(run, final_step)
    if run.average is not None and run.averaged > 0:  # the published model: the tail's mean (post-processing)
        with torch.no_grad():
            for p, a in zip(run.model.parameters(), run.average, strict=True):
                p.copy_(a)
    test = evaluate(run, data)  # identical parameters on every rank
    tracker.scalars({f"test/{k}": v for k, v in test.items()}, step=final_step)
    metrics: dict[str, float] = {f"test/{k}": v for k, v in test.items()}
    metrics.update({f"baseline/{k}": v for k, v in run.objective.baseline(
        _baseline_data(run, data), seed=run.plan.seed, fit=run.plan.loop.baseline and run.main).items()})
    q = run.mechanism.sample_rate
    metrics.update({
        "train/steps": final_step, "train/planned_steps": run.mechanism.planned_steps,
        "train/resumed_from_step": run.done, "train/epochs": final_step * q,
        "time/train_seconds": run.train_seconds, "time/loop_seconds": loop_seconds,
        "time/steps_per_second": final_step / run.train_seconds if run.train_seconds > 0 else float("nan"),
    })
    record = _record(run, final_step)
    if data.shard is not None:
        record["distributed"]["sharding"] = SHARDED_NOTE
    # what follows a fit (the model file, coefficient tables, a tuning score, predictions) works on
    # the CPU copy: the released weights do not depend on where they were computed
    return TrainResult(model=run.model.to("cpu"), metrics=metrics, privacy=record,
                       accountant=run.accountant, mechanism=run.mechanism, curve=tuple(run.curve))


def _baseline_data(run: _Run, data: Dataset) -> Any:
    """What the baselines read: the data, or a sharded read's test labels gathered from every
    rank (dptrain.data.shards.baseline_data)."""
    if data.shard is None:
        return data

    return baseline_data(data, run.launch.dist)


def _gpu_streams(run: _Run) -> str:
    """What the privacy report adds to the streams' description on a GPU: which stream is torch's
    Philox generator there (the noise's always; the sampler's only when it draws on the GPU)."""
    if run.device.type != "cuda":
        return ""
    philox = "its 64-bit key and 62-bit counter offset set from that secret"
    if isinstance(run.sampler, DevicePoissonSampler):
        return f" On the GPU both streams are torch's Philox generator, {philox}"
    return (f" On the GPU the noise stream is torch's Philox generator, {philox}; the Poisson sampler's stream is "
            "the numpy one as on the CPU (each batch's indices drawn on the host and copied to the GPU)")


def _record(run: _Run, final_step: int) -> dict[str, Any]:
    """The mechanism and how the run went, for the privacy report."""
    dist, p = run.launch.dist, run.plan.budget
    return {
        **run.mechanism.report_fields(), **run.engine.noise_record(), "engine": run.engine.name, "steps": final_step,
        "dp_curves": run.mechanism.curve_report(releases=run.accountant.count(run.mechanism.curve_event)),
        "epochs": final_step * run.mechanism.sample_rate,
        "averaged_iterates": run.averaged,
        "delta_source": "config" if p.delta is not None else "default: largest power of ten <= 1/(10 N)",
        "max_epsilon": p.max_epsilon if p.enabled else None, "stopped_early": final_step < run.mechanism.planned_steps,
        "stop_reason": run.stop_reason, "resumed_from_step": run.done,
        "resumed_from": str(run.resume_path) if run.resume_path is not None else None,
        "checkpoint": str(run.launch.run_dir / "private" / "checkpoint.pt") if run.launch.run_dir else None,
        "randomness": run.randomness.describe() + _gpu_streams(run), "randomness_mode": run.randomness.mode,
        "device": _describe_device(run.device),
        "distributed": None if dist is None else {
            "world_size": run.world, "backend": dist.backend,
            "sharding": "disjoint shards (row i on rank i mod W), each Poisson-sampled at the job's q "
            "with a rank-specific stream" if run.plan.unit is None else "disjoint shards of units (unit u, all its "
            "rows, on rank u mod W), each rank's units Poisson-sampled at the job's q with a rank-specific stream",
            "reduction": "all_reduce of the clipped sums; noise N(0, sigma^2 C^2) drawn once per step on "
            "rank 0; divided by the global expected batch size",
        },
    }


def _describe_device(device: torch.device) -> str:
    return describe(device)


def final_epsilons(result: TrainResult, *, delta: float, headline: str = DEFAULT.name) -> dict[str, float]:
    """Epsilon of the whole run from every reported accountant and the headline one (the full
    history is composed: PLD composes the recorded events), by name."""
    accountants = list(dict.fromkeys([RDP, *REPORTED, accountant_named(headline)]))
    out: dict[str, float] = {}
    for acc in accountants:
        if acc is not RDP and out.get(RDP.name, 0.0) > SLOW_PLD_EPSILON:  # no silence: say what the wait is
            log.info("privacy: the %s accountant's pass (epsilon about %.3g by RDP: at a large epsilon this takes "
                     "seconds to a minute)", acc.name.upper(), out[RDP.name])
        out[acc.name] = result.accountant.get_epsilon(delta=delta, accountant=acc)
    return {a.name: out[a.name] for a in dict.fromkeys([*REPORTED, accountant_named(headline)])}


#: above this RDP epsilon the PLD pass of the report can take many seconds (final_epsilons says so)
SLOW_PLD_EPSILON = 10.0
