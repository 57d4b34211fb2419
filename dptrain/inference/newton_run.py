"""The coefficient table of ``estimator=dpsgd``: the plan, the private Newton release after DP-SGD,
the exact fit without privacy, and the table every output reads.

* :func:`plan_release` (before training, public numbers only): whether the interval release is
  made. It predicts, on the public reference design of the declared schema at its most
  informative (:func:`dptrain.inference.newton.predicted_claims`), which terms the release could
  claim at its noise; when no term but the intercept could, nothing is spent on it and DP-SGD
  gets the whole target. After training, :func:`refine_plan` repeats the prediction with the
  outcome read off the released dp/ training loss, and skips the release (its share unspent) when
  it could claim nothing.
* :func:`newton_refit`: the release (:func:`dptrain.privacy.newton.private_newton`) and the model
  it gives; :func:`exact_refit`: privacy off, the maximum-likelihood fit (:mod:`dptrain.inference.exact`).
* :func:`term_table`: ONE table per run (estimate, standard error, interval, claimed, reason per
  term) that coefficients.csv, privacy.json, the console and ``load_model`` all read.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from dptrain.inference.coefficients import encoder_for, linear_layer, model_coefficients, table_terms
from dptrain.inference.exact import exact_fit
from dptrain.inference.intervals import Interval, coefficient_frame
from dptrain.inference.newton import (
    design_statistics,
    layer_weights,
    model_parameters,
    outcome_from_loss,
    predicted_claims,
    quantile,
    radius2,
    reduced_to_terms,
    term_intervals,
)
from dptrain.privacy.budget import INTERVALS
from dptrain.privacy.events import gaussian_event
from dptrain.privacy.newton import (
    noise_sds,
    planned_noise_multiplier,
    private_newton,
    release_noise_multiplier,
)
from dptrain.privacy.randomness import Randomness
from dptrain.training.fit import bound_to_rows, mechanism_for
from dptrain.training.plan import TrainingPlan

__all__ = ["EXACT_METHOD", "IntervalPlan", "NEWTON_METHOD", "exact_refit", "newton_refit",
           "plan_release", "refine_plan", "term_table"]

log = logging.getLogger("dptrain.inference.run")

NEWTON_METHOD = ("dpsgd + two private Newton steps at its model: estimate and sandwich standard error "
                 "H^-1 (S + noise) H^-1 (the second gradient's noise, and the second Hessian's on the first "
                 "step's miss), Student's t interval with the noisy meat's degrees of freedom (privacy noise "
                 "included)")
EXACT_METHOD = {
    "binary": "NON-PRIVATE maximum-likelihood logistic regression (Newton-Raphson to convergence), standard errors "
              "from the inverse information, normal interval (statsmodels' GLM Binomial / Logit): no privacy",
    "multinomial": "NON-PRIVATE maximum-likelihood multinomial logit (Newton-Raphson to convergence), standard "
                   "errors from the inverse information, normal interval (statsmodels' MNLogit): no privacy",
    "linear": "NON-PRIVATE ordinary least squares, s^2 (Z'Z)^-1 standard errors, Student's t(n - p) interval "
              "(statsmodels' OLS): no privacy",
}
ALIASED = "aliased with earlier terms, or without rows (as R's NA): not estimated, fixed at 0"
SEPARATED = ("not identified: its rows' fitted probabilities go to 0 or 1 (the maximum-likelihood estimate does "
             "not exist); shown where the iterations stopped, no interval")


@dataclass(frozen=True)
class IntervalPlan:
    """Whether the run makes the interval release (``release``) and why; the release's planned
    noise multiplier; how many of the table's terms besides the intercept it could claim
    (``claimable`` of ``terms``, on the public reference design)."""

    release: bool
    reason: str
    noise_multiplier: float | None = None
    claimable: int = 0
    terms: int = 0


def _claimable(plan: TrainingPlan, n: int, sigma: float, outcome: tuple[float, float] | None = None) -> tuple[int, int]:
    """(non-intercept terms the release could claim, non-intercept terms) on the reference design."""
    enc = encoder_for(plan)
    kind = enc.kind
    classes = len(enc.classes) if enc.classes is not None else 2
    claims = predicted_claims(enc, n, kind, noise_sds(sigma, kind, radius2(enc)), classes=classes, outcome=outcome)
    terms = table_terms(enc, classes)
    slopes = np.array(["(Intercept)" not in t for t in terms])
    return int(np.sum(claims.claimed & slopes)), int(slopes.sum())


def plan_release(plan: TrainingPlan, n: int, delta: float,
                 reason: str | None) -> tuple[IntervalPlan, TrainingPlan, Any]:
    """(the release's plan, the training plan, DP-SGD's mechanism) before training: ``reason`` (not
    None) is why no release is possible at all (:func:`dptrain.inference.run.newton_reason`); else
    the release is planned when the reference design predicts a claim for at least one term besides
    the intercept. Without a release the training plan's budget gives the release's share back to
    DP-SGD (:meth:`Budget.without`)."""
    whole = replace(plan, budget=plan.budget.without(INTERVALS))
    if reason is not None:
        return IntervalPlan(False, reason), whole, mechanism_for(whole, dataset_size=n, delta=delta, quiet=True)
    mechanism = mechanism_for(plan, dataset_size=n, delta=delta, quiet=True)
    if not mechanism.private:
        return IntervalPlan(False, "the run adds no noise (no finite epsilon to share)"), whole, mechanism
    b = plan.budget
    sigma = planned_noise_multiplier(mechanism.history_between(0, mechanism.planned_steps), delta=delta,
                                     accountant_name=b.accountant, rtol=b.rtol, share=b.share(INTERVALS),
                                     target=b.target)
    claimable, terms = _claimable(plan, n, sigma)
    if claimable == 0:
        why = (f"no interval could be claimed at this epsilon, even on the most informative table of this size "
               f"and design: N = {n}, {terms} terms besides the intercept")
        return IntervalPlan(False, why, sigma, 0, terms), whole, mechanism_for(whole, dataset_size=n, delta=delta,
                                                                               quiet=True)
    return IntervalPlan(True, f"planned: up to {claimable} of {terms} terms besides the intercept", sigma,
                        claimable, terms), plan, mechanism


def refine_plan(plan: TrainingPlan, release: IntervalPlan, result: Any) -> IntervalPlan:
    """After training: the release's plan again with the outcome read off the released dp/ training
    loss (the mean of the last tenth of its values, plus two of its noise sds: an optimistic
    reading), and the release skipped when it could claim nothing; a resume of a finished run
    repeats no release."""
    if not release.release:
        return release
    done = result.privacy.get("resumed_from_step", 0) >= max(result.privacy.get("steps", 0), 1)
    if done:
        return replace(release, release=False, reason="trainer.resume of a run that had finished its steps: the "
                       "interval release is not repeated; allowed: a new run folder for intervals")
    if not result.curve or result.mechanism is None:
        return release
    values = np.asarray(result.curve, dtype=np.float64)
    tail = values[-max(1, len(values) // 10):]
    loss = float(tail.mean()) + 2.0 * result.mechanism.curve_noise_std / math.sqrt(len(tail))
    outcome = outcome_from_loss(encoder_for(plan).kind, loss)
    if outcome is None:
        return release
    claimable, terms = _claimable(plan, result.mechanism.dataset_size, release.noise_multiplier, outcome)
    if claimable:
        return replace(release, claimable=claimable)
    return replace(release, release=False, claimable=0, reason=(
        f"the released training loss ({loss:.3g}, dp/train_loss) leaves too little curvature for a claimable "
        f"interval on any of the {terms} terms besides the intercept; the release's share is not spent"))


def newton_noise(plan: TrainingPlan, result: Any) -> float:
    """The Newton release's noise multiplier: the smallest whose Gaussian event, composed with the
    run's DP-SGD history, keeps the run's epsilon within the budget's target (DP-SGD was calibrated
    to its part) or, with a given noise multiplier, within DP-SGD's epsilon / (1 - share)."""
    b = plan.budget
    return release_noise_multiplier(result.accountant, delta=result.mechanism.delta, accountant_name=b.accountant,
                                    rtol=b.rtol, share=b.share(INTERVALS), target=b.target)


def _set_model(plan: TrainingPlan, data: Any, result: Any, theta: np.ndarray) -> None:
    """The model becomes the reduced parameters ``theta`` (a function of the releases, or the
    exact fit); its test metrics are recomputed."""
    enc = encoder_for(plan)
    layer = linear_layer(result.model)
    bias, weight = layer_weights(theta, enc, layer.out_features)
    objective = plan.objective
    objective.check_data(data.spec)  # the target's public scale, for the metrics in original units
    with torch.no_grad():
        layer.bias.copy_(torch.as_tensor(bias, dtype=layer.bias.dtype).reshape(layer.bias.shape))
        layer.weight.copy_(torch.as_tensor(weight, dtype=layer.weight.dtype).reshape(layer.weight.shape))
        test = objective.metrics(result.model(data.x_test), data.y_test)
    result.metrics.update({f"test/{k}": v for k, v in test.items()})


def newton_refit(plan: TrainingPlan, data: Any, result: Any, *, launch: Any) -> Any:
    """Two private Newton steps from DP-SGD's model (:mod:`dptrain.inference.newton`): the noise
    multiplier that makes the whole run's epsilon the target (or DP-SGD's epsilon / (1 - share)),
    the release, the run's table (:func:`term_table`) and, when the second Hessian is determined
    (every claim needs it), the two-step estimate as the model."""
    enc = encoder_for(plan)
    kind = enc.kind
    layer = linear_layer(result.model)
    x, y = data.x_train.numpy(), data.y_train.numpy()
    start = model_parameters(layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy(), enc)
    sigma = newton_noise(plan, result)
    randomness = bound_to_rows(launch.randomness if launch.randomness is not None else Randomness.fresh(), data)
    fit_ = private_newton(start, lambda th: design_statistics(x, y, th, enc, kind), kind=kind,
                          radius_sq=radius2(enc), noise_multiplier=sigma, rng=randomness.numpy("newton-interval"))
    result.accountant.record(gaussian_event(sigma))
    if plan.budget.target is not None:
        result.privacy["target_epsilon"] = plan.budget.target
    dpsgd_terms = model_coefficients(result.model, enc)
    run_ok = fit_.hessian_noise <= 0.6 and bool(np.any(fit_.informative))
    if run_ok:  # the model becomes the two-step estimate (a function of the releases)
        _set_model(plan, data, result, fit_.estimate)
    result.inference = {"newton": fit_, "noise_multiplier": sigma, "kind": kind, "radius_sq": radius2(enc),
                        "table": term_table(plan, fit_, dpsgd_terms, estimate_is_newton=run_ok)}
    return result


def exact_refit(plan: TrainingPlan, data: Any, result: Any) -> Any:
    """Privacy off: the model and the table become the exact maximum-likelihood (least-squares)
    fit (:mod:`dptrain.inference.exact`)."""
    enc = encoder_for(plan)
    classes = len(enc.classes) if enc.classes is not None else 2
    fit_ = exact_fit(data.x_train.numpy(), data.y_train.numpy(), enc, enc.kind, classes=classes)
    _set_model(plan, data, result, fit_.estimate)
    result.inference = {"exact": fit_, "table": exact_table(plan, fit_)}
    if not fit_.converged:
        log.info("coefficients: the non-private fit stopped after %d iterations without converging", fit_.iterations)
    return result


def _term_matrix(enc: Any, p: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = reduced_to_terms(enc)
    blocks = p // a.shape[1]
    return np.kron(np.eye(blocks), a), np.tile(b, blocks)


def exact_table(plan: TrainingPlan, fit_: Any) -> Any:
    """The exact fit's table: estimates, classical standard errors and intervals; aliased terms NA."""
    enc = encoder_for(plan)
    level = plan.estimator.level
    a, b = _term_matrix(enc, len(fit_.estimate))
    used = np.abs(a) > 0
    est = a @ fit_.estimate + b
    cov = np.where(np.isfinite(fit_.covariance), fit_.covariance, 0.0)
    se = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", a, cov, a), 0.0))
    q = float(quantile(level, fit_.dof))
    aliased = np.any(used & fit_.aliased[None, :], axis=1)
    separated = np.any(used & fit_.separated[None, :], axis=1) & ~aliased
    ok = ~aliased & ~separated
    reasons = [ALIASED if al else SEPARATED if sep else "non-private: the classical interval"
               for al, sep in zip(aliased, separated)]
    est = np.where(aliased, np.nan, est)
    se = np.where(ok, se, np.nan)
    iv = Interval(est, se, est - q * se, est + q * se, level)
    return coefficient_frame(table_terms(enc, len(enc.classes) if enc.classes else 2), est, iv,
                             method=EXACT_METHOD[enc.kind], claimed=ok, reasons=reasons)


def term_table(plan: TrainingPlan, fit_: Any, dpsgd_terms: np.ndarray, *, estimate_is_newton: bool) -> Any:
    """The run's ONE coefficient table after the release: per term its estimate (the two-step
    estimate where the release identified it and the second Hessian is determined, else DP-SGD's;
    NA where aliased), its interval where claimed, and the reason."""
    enc = encoder_for(plan)
    level = plan.estimator.level
    a, _ = _term_matrix(enc, len(fit_.estimate))
    claims = fit_.claims(a)
    est, se, lo, hi, _ = term_intervals(fit_, enc, level=level)
    used = np.abs(a) > 0
    aliased = (np.any(used & fit_.aliased[None, :], axis=1) if fit_.aliased is not None and estimate_is_newton
               else np.zeros(len(a), dtype=bool))  # without the Newton estimate the model keeps DP-SGD's value
    newton = estimate_is_newton & ~aliased
    estimate = np.where(aliased, np.nan, np.where(newton, est, dpsgd_terms))
    ok = claims.claimed & newton
    reasons = []
    for k in range(len(a)):
        if aliased[k]:
            reasons.append(ALIASED)
        elif ok[k]:
            reasons.append(claims.reasons[k])
        else:
            why = claims.reasons[k] if estimate_is_newton else f"{claims.reasons[k]}; DP-SGD's estimate"
            step = claims.first_step_in_se[k]
            if not estimate_is_newton and np.isfinite(step) and step > 2.0:
                why += f", {step:.3g} standard errors from the release's Newton estimate: NOT converged"
            reasons.append(f"NOT CLAIMED: {why}")
    nan = np.full(len(a), np.nan)
    iv = Interval(estimate, np.where(ok, se, nan), np.where(ok, lo, nan), np.where(ok, hi, nan), level)
    return coefficient_frame(table_terms(enc, len(enc.classes) if enc.classes else 2), estimate, iv,
                             method=NEWTON_METHOD, claimed=ok, reasons=reasons)
