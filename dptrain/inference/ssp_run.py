"""``estimator=ssp`` in a training run: one Gaussian release of the sufficient statistics
(:mod:`dptrain.inference.ssp`), the model and the record the run folder's report is built from."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from dptrain.inference.coefficients import encoder_for, linear_layer
from dptrain.inference.ssp import calibrate, describe, gaussian_event, ssp_config_check, ssp_estimate
from dptrain.privacy.accounting import PrivacyLedger
from dptrain.privacy.randomness import Randomness
from dptrain.training.fit import TrainResult, build_model
from dptrain.training.plan import TrainingPlan

__all__ = ["SSPMechanism", "run_ssp"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SSPMechanism:
    """The ssp release's privacy numbers (what outputs read as ``result.mechanism``)."""

    noise_multiplier: float
    sensitivity: float
    dataset_size: int
    delta: float
    enabled: bool = True


def _record(plan: TrainingPlan, fit: Any, *, n: int, delta: float, randomness: Any) -> dict[str, Any]:
    """The report's input, in the DP-SGD record's shape: one 'step' over all rows, no sampling."""
    return {
        "enabled": True, "noise_multiplier": fit.noise_multiplier, "noise_multiplier_source": "calibrated",
        "target_epsilon": plan.budget.target, "max_grad_norm": fit.sensitivity, "sample_rate": 1.0,
        "expected_batch_size": n, "dataset_size": n, "planned_steps": 1, "delta": delta, "neighbours": "add_remove",
        "noise_applied": True, "accountant_advice": None, "engine": "ssp (Gaussian mechanism on Z'Z)", "steps": 1,
        "epochs": 1.0, "delta_source": "config" if plan.budget.delta is not None else
        "default: largest power of ten <= 1/(10 N)", "max_epsilon": None, "stopped_early": False,
        "stop_reason": "one release of the noisy sufficient statistics", "resumed_from_step": 0,
        "resumed_from": None, "checkpoint": None, "randomness": randomness.describe(),
        "randomness_mode": randomness.mode, "distributed": None,
        "ssp": describe(fit, epsilon=float("nan"), delta=delta, accountant=plan.budget.accountant),
    }


def run_ssp(plan: TrainingPlan, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
    """Release, solve, bootstrap; returns a :class:`dptrain.training.fit.TrainResult`."""
    enc = encoder_for(plan)
    ssp_config_check(enc)
    sigma = calibrate(target_epsilon=plan.budget.target, delta=delta, accountant=plan.budget.accountant)
    randomness = launch.randomness if launch.randomness is not None else Randomness.fresh()
    start = time.perf_counter()
    fit = ssp_estimate(data.x_train.double().numpy(), data.y_train.double().numpy(), enc, noise_multiplier=sigma,
                       level=plan.estimator.level, draws=plan.estimator.bootstrap, rng=randomness.numpy("ssp-noise"))
    seconds = time.perf_counter() - start
    log.info("ssp: released Z'Z with noise multiplier %.6g x sensitivity %g (%s accountant, target epsilon %g)",
             sigma, fit.sensitivity, plan.budget.accountant, plan.budget.target)
    objective = plan.objective
    torch.manual_seed(plan.seed)
    model = build_model(plan, spec=data.spec)
    layer = linear_layer(model)
    with torch.no_grad():
        layer.weight.copy_(torch.as_tensor(fit.weight, dtype=layer.weight.dtype)[None, :])
        layer.bias.fill_(fit.bias)
        test = objective.metrics(model(data.x_test), data.y_test)
    accountant = PrivacyLedger()
    accountant.record(gaussian_event(sigma))
    metrics = {f"test/{k}": v for k, v in test.items()}
    metrics.update({f"baseline/{k}": v for k, v in objective.baseline(data, seed=plan.seed,
                                                                         fit=plan.loop.baseline).items()})
    metrics.update({"train/steps": 1, "train/planned_steps": 1, "train/resumed_from_step": 0, "train/epochs": 1.0,
                    "time/train_seconds": seconds, "time/loop_seconds": seconds, "time/steps_per_second": 1 / seconds})
    tracker.scalars({k: v for k, v in metrics.items() if k.startswith("test/")}, step=1)
    mech = SSPMechanism(sigma, fit.sensitivity, data.n_train, delta)
    return TrainResult(model=model, metrics=metrics, privacy=_record(plan, fit, n=data.n_train, delta=delta,
                                                                     randomness=randomness),
                       accountant=accountant, mechanism=mech, inference={"interval": fit.interval})
