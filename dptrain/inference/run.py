"""The estimators in a training run, one class each in the ``ESTIMATORS`` registry
(``estimator=NAME``). Each checks its settings before any row is read (``check``, ``check_size``
against the PUBLIC N), trains (``run``), builds its coefficient table (``table``) and states its
guarantee and when its intervals are valid (``report``):

* ``dpsgd``: :func:`dptrain.training.fit.fit` on all rows, exactly as without this module;
* ``subsample_aggregate``: :mod:`dptrain.inference.subsample` (K part models; the published
  model is their average, whose coefficients are the table's estimates);
* ``ssp``: :mod:`dptrain.inference.ssp` (one Gaussian release of the sufficient statistics).

:func:`run_estimator`, :func:`coefficient_section`, :func:`estimator_report`,
:func:`check_estimator` and :func:`check_estimator_size` look the run's estimator up.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any

import numpy as np
import torch

from dptrain.core.registry import Registry
from dptrain.core.validation import ConfigError, bad, integer, one_of, real
from dptrain.inference.coefficients import (
    encoder_for,
    linear_layer,
    model_coefficients,
    objective_kind,
    table_terms,
)
from dptrain.inference.intervals import aggregate_parts, coefficient_frame, format_table
from dptrain.inference.newton_run import (
    EXACT_METHOD,
    NEWTON_METHOD,
    exact_refit,
    newton_refit,
    plan_release,
    refine_plan,
)
from dptrain.inference.ssp import ssp_config_check
from dptrain.inference.ssp_run import run_ssp
from dptrain.inference.subsample import fit_parts, part_mechanism
from dptrain.privacy.accounting import RDP, history_epsilon
from dptrain.privacy.budget import INTERVALS
from dptrain.privacy.newton import BOUNDS
from dptrain.privacy.report import delta_total_clause
from dptrain.settings.inference import MAX_PARTS
from dptrain.settings.train import MAX_TARGET_EPSILON
from dptrain.training.fit import TrainResult, build_model, fit, mechanism_for
from dptrain.training.plan import TrainingPlan

__all__ = ["ESTIMATORS", "check_estimator", "check_estimator_size", "coefficient_section", "model_is_linear",
           "run_estimator"]

log = logging.getLogger(__name__)

NO_INTERVAL = ("dpsgd: estimate only, no interval computed (estimator=subsample_aggregate gives intervals that "
               "include the privacy noise; estimator=ssp for linear regression)")
SA_METHOD = "subsample_aggregate: mean of {k} part estimates, SE = sd/sqrt({k}), t({dof}) interval"
SSP_METHOD = ("ssp: noisy sufficient statistics (AdaSSP-style spectral floor), parametric-bootstrap basic interval "
              "({b} draws)")


def model_is_linear(plan: TrainingPlan) -> bool:
    """True when the configured model is one Linear layer (built from the public schema)."""
    model = build_model(plan)
    return linear_layer(model) is not None


def run_estimator(plan: TrainingPlan, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
    """Train (or release) with ``plan.estimator``; returns a :class:`dptrain.training.fit.TrainResult`
    (``inference`` holds what the coefficient table needs beyond the model)."""
    return ESTIMATORS.get(plan.estimator.name).run(plan, data, delta=delta, tracker=tracker, launch=launch)


def _subsample_aggregate(plan: TrainingPlan, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
    k = plan.estimator.parts
    mech = part_mechanism(plan, dataset_size=data.n_train, delta=delta)
    log.info("subsample_aggregate: %d parts, each N_part = %d (public: floor(N/K)), B_part = %d, q = %.6g, "
             "steps = %d, sigma = %g", k, mech.dataset_size, mech.expected_batch_size, mech.sample_rate,
             mech.planned_steps, mech.noise_multiplier)
    parts = fit_parts(plan, data, mechanism=mech, randomness=launch.randomness)
    enc = encoder_for(plan)
    coefs = [model_coefficients(r.model, enc) for r in parts]
    model = copy.deepcopy(parts[0].model)
    with torch.no_grad():  # the published model: the average of the part models (a function of them)
        for p, *qs in zip(model.parameters(), *(r.model.parameters() for r in parts), strict=True):
            p.copy_(torch.stack(qs).mean(0))
    metrics = _aggregate_metrics(plan, data, parts, model)
    tracker.scalars({k2: v for k2, v in metrics.items() if k2.startswith("test/")}, step=parts[0].privacy["steps"])
    record = {**parts[0].privacy, "engine": f"{parts[0].privacy['engine']} (x{k} parts)"}
    return TrainResult(model=model, metrics=metrics, privacy=record, accountant=parts[0].accountant,
                       mechanism=mech, inference={"part_coefficients": coefs, "parts": k})


def _aggregate_metrics(plan: TrainingPlan, data: Any, parts: list[Any], model: Any) -> dict[str, float]:
    """Test metrics of the averaged model, the baselines once on all rows, and the parts' steps/times."""
    objective = plan.objective
    with torch.no_grad():
        test = objective.metrics(model(data.x_test), data.y_test)
    metrics = {f"test/{k}": v for k, v in test.items()}
    metrics.update({f"baseline/{k}": v for k, v in objective.baseline(data, seed=plan.seed,
                                                                         fit=plan.loop.baseline).items()})
    first = parts[0].metrics
    metrics.update({k: first[k] for k in ("train/steps", "train/planned_steps", "train/resumed_from_step",
                                          "train/epochs") if k in first})
    for k in ("time/train_seconds", "time/loop_seconds"):
        metrics[k] = float(sum(r.metrics[k] for r in parts))
    metrics["time/steps_per_second"] = len(parts) * first["train/steps"] / max(metrics["time/train_seconds"], 1e-9)
    return metrics


def coefficient_section(plan: TrainingPlan, result: Any, report: dict | None = None) -> dict[str, Any] | None:
    """The coefficient table of a run with a linear model (None otherwise): ``frame`` (the rows
    of coefficients.csv), ``text`` (the summary for privacy.txt and the log) and ``estimator``
    (the guarantee text for the report)."""
    if linear_layer(result.model) is None or objective_kind(plan.objective_name) is None:
        return None
    est = plan.estimator
    frame = ESTIMATORS.get(est.name).table(plan, result, encoder_for(plan), report or {})
    title = f"coefficients on the original scale (estimator={est.name}, objective={plan.objective_name})"
    return {"frame": frame, "text": format_table(frame, title=title, level=est.level)}


SA_VALIDITY = ("the t interval covers the expectation of ONE part's estimate (DP-SGD on about N/K rows); it covers "
               "the true coefficient when each part estimate is near-normal and near-unbiased: enough rows per part "
               "for every term (rare categories need many), training converged on each part, and little clipping "
               "bias (few per-example gradients clipped at C near the optimum). dptrain claims coverage when "
               "floor(N/K) x epsilon >= 8,000 (the coverage study, docs/inference.md: 93-97% there for a 6-term "
               "logit; under-coverage at 2,000 rows per part with epsilon 1, where the noisy part fits are "
               "biased)")
SSP_VALIDITY = ("linear regression with errors of constant variance and a target rarely clipped by "
                "data.target_bounds; the bootstrap holds the design fixed at its noisy estimate. dptrain claims "
                "coverage when N x epsilon >= 2,000 (the coverage study, docs/inference.md); below it the inverse "
                "of the noisy Gram matrix is biased, the basic bootstrap corrects that only to first order, and "
                "the intervals can under-cover")


#: per estimator, the smallest (rows per fit) x epsilon at which it CLAIMS its intervals' coverage:
#: the smallest value at which the coverage study (experiments/inference) found 93-97%; below it
#: the study shows under-coverage (ssp: N = 2,000 at epsilon 0.5; subsample_aggregate: 2,000 rows
#: per part at epsilon 1, whose noisy part fits are biased), so the run says so
VALIDITY_THRESHOLDS = {"ssp": 2000.0, "subsample_aggregate": 8000.0}


def validity_check(name: str, *, epsilon: float | None, dataset_size: int, parts: int = 1) -> dict[str, Any]:
    """Whether this run is inside the region where ``name``'s intervals claim 95% coverage: the
    rows each fit sees (N for ssp, floor(N / K) for subsample_aggregate; N is public in dptrain)
    times the run's epsilon at least the estimator's :data:`VALIDITY_THRESHOLDS`. Public numbers only."""
    threshold = VALIDITY_THRESHOLDS[name]
    rows = dataset_size // parts if name == "subsample_aggregate" else dataset_size
    what = "floor(N / K)" if name == "subsample_aggregate" else "N"
    if epsilon is None or not np.isfinite(epsilon):
        return {"claimed": False, "rule": f"{what} x epsilon >= {threshold:g}",
                "value": None, "why": "no finite epsilon (privacy disabled): no private interval is claimed"}
    value = rows * float(epsilon)
    claimed = value >= threshold
    why = (f"{what} x epsilon = {rows} x {epsilon:.4g} = {value:.4g} "
           + (f">= {threshold:g}: inside the region where the coverage study finds 93-97% coverage "
               "(for its designs of 6 terms; many terms, rare categories or training that has not converged "
               "need more)"
              if claimed else f"< {threshold:g}: the intervals are NOT claimed valid here (the coverage "
              "study finds under-coverage in this region); more rows, a larger epsilon"
              + (" or fewer parts" if name == "subsample_aggregate" else "") + " would enter it"))
    return {"claimed": bool(claimed), "rule": f"{what} x epsilon >= {threshold:g}", "value": value,
            "why": why}


def estimator_report(plan: TrainingPlan, result: Any, report: dict[str, Any], section: dict[str, Any] | None) -> dict:
    """The estimator's part of privacy.json: its name, its guarantee (which (epsilon, delta),
    which accountant, that the intervals are inside that budget), when its intervals are valid."""
    est, acc = plan.estimator, plan.budget.accountant
    eps, delta = report.get("epsilon"), report.get("delta")
    out: dict[str, Any] = {"name": est.name, "coefficients": "coefficients.csv" if section else None}
    out.update(ESTIMATORS.get(est.name).report(plan, result, eps=eps, delta=delta, accountant=acc,
                                               guarantee=report["guarantee"]))
    if out.get("guarantee") != report["guarantee"]:  # the estimator's own sentence: the sampler's delta_total too
        out["guarantee"] += delta_total_clause(eps, delta, report.get("delta_total"))
    if not out.get("validity_check", {"claimed": True})["claimed"]:
        log.info("coefficient intervals NOT CLAIMED (estimator=%s): %s", est.name, out["validity_check"]["why"],
                 extra={"console": False})  # the console's coefficients line says it once
    if section is not None:
        out["table"] = section["text"]
    return out


def check_estimator(plan: TrainingPlan) -> None:
    """The estimator settings alone and against the run's objective, model and privacy."""
    e = plan.estimator
    one_of("estimator.name", e.name, tuple(ESTIMATORS))
    estimator = ESTIMATORS.get(e.name)
    integer("estimator.parts", e.parts, 2, f"must be an integer in [2, {MAX_PARTS}]")
    if e.parts > MAX_PARTS:
        raise bad("estimator.parts", e.parts, f"must be an integer in [2, {MAX_PARTS}]")
    integer("estimator.min_part_rows", e.min_part_rows, 10)
    real("estimator.level", e.level, "must be a number in (0.5, 1)", lo=0.5, hi=1, lo_open=True, hi_open=True)
    real("estimator.interval_share", e.interval_share, "must be a number in [0, 0.9]", lo=0, hi=0.9)
    integer("estimator.bootstrap", e.bootstrap, 100, "must be an integer in [100, 100000]")
    if e.bootstrap > 100_000:
        raise bad("estimator.bootstrap", e.bootstrap, "must be an integer in [100, 100000]")
    _check_units(plan)
    if not estimator.intervals:
        return
    if not plan.private and not estimator.exact_without_privacy:
        raise bad("estimator", e.name, "needs privacy.enabled=true (its interval accounts for the privacy noise); "
                  "allowed without privacy: estimator=dpsgd or ssp (the exact non-private fit)")
    estimator.check_objective(plan)
    if not model_is_linear(plan):
        raise bad("estimator", e.name, "needs a linear model (model=logit: one Linear layer) whose coefficients "
                  "it estimates; allowed with this model: estimator=dpsgd")
    _check_training_only(plan, e.name)
    estimator.check(plan)


def _check_units(plan: TrainingPlan) -> None:
    """Person-level DP-SGD (data.privacy_unit) with the estimators: only dpsgd, and without the
    interval release, whose sensitivities are per row (a unit of k rows moves its sums up to k
    times as far); refused by name."""
    if plan.unit is None:
        return
    e = plan.estimator
    if e.name != "dpsgd":
        raise bad("estimator", e.name, f"with data.privacy_unit={plan.unit.column!r}: unsupported (its parts "
                  "and sufficient statistics are per row); allowed: estimator=dpsgd")
    if plan.private and e.interval_share > 0 and model_is_linear(plan):
        raise bad("estimator.interval_share", e.interval_share, f"with data.privacy_unit="
                  f"{plan.unit.column!r}: the interval release's private Newton steps bound one ROW's score and "
                  "Hessian, not one unit's; allowed: estimator.interval_share=0 (DP-SGD's estimates, no interval)")


def _check_training_only(plan: TrainingPlan, name: str) -> None:
    """Training settings that subsample_aggregate / ssp do not support, refused by name."""
    if plan.task != "train":
        raise bad("estimator", name, "is for task=train only; allowed for this task: estimator=dpsgd")
    if plan.loop.resume is not None:
        raise bad("trainer.resume", plan.loop.resume, f"must be null with estimator={name} (its runs are not "
                  "resumable); allowed: estimator=dpsgd to resume")
    if plan.loop.distributed:
        raise bad("trainer.distributed", True, f"must be false with estimator={name}")
    if plan.budget.max_epsilon is not None:
        raise bad("privacy.max_epsilon", plan.budget.max_epsilon, f"must be null with estimator={name} (set "
                  "privacy.target_epsilon instead)")


def check_estimator_size(plan: TrainingPlan, n: int) -> None:
    """Against the PUBLIC training-set size N (subsample_aggregate: N / K >= min_part_rows)."""
    ESTIMATORS.get(plan.estimator.name).check_size(plan, n)


# ------------------------------------------------------------------------------ the estimators


class DPSGD:
    """``dpsgd``: DP-SGD on all rows. With a linear model (objective=binary, multinomial or linear)
    and ``estimator.interval_share`` > 0, two private Newton steps at DP-SGD's model give the table's
    estimates and sandwich intervals when the plan says they can be claimed
    (:mod:`dptrain.inference.newton_run`); without privacy, the exact fit; otherwise estimates only."""

    intervals = False
    #: without privacy the table is the exact fit (dpsgd, ssp); subsample_aggregate refuses to run
    exact_without_privacy = True

    def run(self, plan: TrainingPlan, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
        if not plan.private:
            result = fit(plan, data, mechanism=mechanism_for(plan, dataset_size=data.n_accounted, delta=delta),
                         tracker=tracker, launch=launch)
            return exact_refit(plan, data, result) if exact_reason(plan) is None else result
        release, plan, mechanism = plan_release(plan, data.n_accounted, delta, newton_reason(plan))
        _log_plan(plan, release)
        if plan.budget.target is not None:  # the run's target first, the shares as shares of it
            log.info("%s", mechanism.calibration_line(plan.budget))
        total = warn_large_epsilon(plan, mechanism)
        launch = dataclasses.replace(launch, total_epsilon=total)
        result = fit(plan, data, mechanism=mechanism, tracker=tracker, launch=launch)
        refined = refine_plan(plan, release, result)
        if not refined.release:
            if release.release:
                log.info("coefficient intervals: not released: %s", refined.reason)
            result.inference = {"newton": None, "reason": refined.reason}
            return result
        return newton_refit(plan, data, result, launch=launch)

    def check_objective(self, plan: TrainingPlan) -> None:
        """Any objective."""

    def check(self, plan: TrainingPlan) -> None:
        """Nothing beyond the training settings."""

    def check_size(self, plan: TrainingPlan, n: int) -> None:
        """Any N the training settings allow."""

    def table(self, plan: TrainingPlan, result: Any, enc: Any, report: dict) -> Any:
        inference = result.inference or {}
        if "table" in inference:  # the release's or the exact fit's: ONE table for every output
            return inference["table"]
        n_out = linear_layer(result.model).out_features
        reason = inference.get("reason", "estimator.interval_share=0")
        return coefficient_frame(table_terms(enc, n_out), model_coefficients(result.model, enc), None,
                                 method=NO_INTERVAL, reasons=f"no interval ({reason}): DP-SGD's estimate, its "
                                 "convergence not checked")

    def report(self, plan: TrainingPlan, result: Any, *, eps: Any, delta: Any, accountant: str, guarantee: str) -> dict:
        inference = result.inference or {}
        if "exact" in inference:
            return {"intervals": EXACT_METHOD[encoder_for(plan).kind], "guarantee": guarantee,
                    "validity_check": _table_check(inference["table"], "non-private classical intervals")}
        newton = inference.get("newton")
        if newton is None:
            return {"intervals": f"none computed ({inference.get('reason', 'estimates only')})",
                    "guarantee": guarantee}
        sigma, kind = inference["noise_multiplier"], inference["kind"]
        table = inference["table"]
        out = {"intervals": NEWTON_METHOD, "interval_share": plan.estimator.interval_share,
               "interval_noise_multiplier": sigma, "interval_noise_sd": newton.noise_sd,
               "interval_sensitivity": ("||z||^2 <= 1 + numeric columns + categorical columns = "
                                        f"{inference['radius_sq']:g} (public); |r| <= {BOUNDS[kind][0]:g}, "
                                        f"w <= {BOUNDS[kind][1]:g} ({kind})"),
               "validity": NEWTON_VALIDITY,
               "validity_check": {**_table_check(table, "per term"), **newton.checks()}}
        if eps is None or not math.isfinite(eps):
            out["guarantee"] = guarantee
            return out
        out["guarantee"] = (f"({eps:.4g}, {_delta_text(delta)})-DP, example-level, add/remove-one-record neighbours "
                            f"({accountant} accountant), for the final model, every intermediate iterate and the "
                            f"coefficient table: DP-SGD's steps composed with one Gaussian mechanism (noise multiplier "
                            f"{sigma:.6g}) that "
                            "releases the gradient and Hessian at DP-SGD's model and the gradient, Hessian and "
                            "score covariance after one Newton step (adaptive Gaussian releases compose to one "
                            "Gaussian); model.pt and coefficients.csv (estimates, standard errors, intervals) "
                            "are functions of these releases")
        return out


def _delta_text(delta: Any) -> str:
    return f"{delta:.3g}" if isinstance(delta, (int, float)) else str(delta)


def _table_check(table: Any, what: str) -> dict[str, Any]:
    """The run-level summary of a table's per-term claims (privacy.json's validity_check)."""
    claimed = [bool(c) for c in table["claimed"]]
    n, k = sum(claimed), len(claimed)
    if n == k:
        why = f"every term's interval claimed ({what})"
    else:
        others = [r for r, c in zip(table["reason"], claimed) if not c]
        top = sorted(set(others), key=lambda r: (-others.count(r), others.index(r)))[:2]
        why = f"{n} of {k} terms claimed; not claimed: " + " | ".join(top)
    return {"claimed": bool(n), "terms_claimed": n, "terms": k, "why": why}


def _log_plan(plan: TrainingPlan, release: Any) -> None:
    """One plain line on the interval release: planned (with DP-SGD's share of the run's epsilon)
    or not, and why."""
    b = plan.budget
    if release.release:
        share = b.share(INTERVALS)
        what = (f"DP-SGD gets {1 - share:g} of the run's target epsilon {b.target:g}, the release the rest"
                if b.target is not None else f"its epsilon is {share:g} of the run's total")
        log.info("coefficient intervals: released after DP-SGD (estimator.interval_share=%g: %s; %s)",
                 plan.estimator.interval_share, what, release.reason)
    elif plan.estimator.interval_share > 0 and plan.estimator.name == "dpsgd" and model_is_linear(plan):
        # a model that cannot have a coefficient table (an MLP) gets no line about its intervals
        log.info("coefficient intervals: none (%s)%s", release.reason,
                 "; DP-SGD gets the whole epsilon" if release.noise_multiplier is not None else "")


NEWTON_VALIDITY = ("the normal approximation of the two-step estimator: DP-SGD's model close enough to the optimum "
                   "for two Newton steps (checked per term: the first step in standard errors), the Hessian well "
                   "determined under its noise (checked for the run and per term), the privacy noise not "
                   "dominating the sampling variance (checked per term), and a correctly bounded design (public "
                   "bounds). The coverage study (docs/inference.md) finds 93-97% where the checks pass")


#: a fixed noise multiplier whose planned epsilon exceeds this gets a warning before training
LARGE_EPSILON = 2.0


def warn_large_epsilon(plan: TrainingPlan, mechanism: Any) -> float | None:
    """Before training: a noise multiplier fixed by a preset or the command line gives a small
    table a far larger epsilon than the preset's (q = B / N grows as N shrinks): say so, with the
    run's planned epsilon (public: it depends on the settings and N only; with an interval release,
    DP-SGD's and the release's together) and the setting that fixes it. A planned epsilon above
    privacy.target_epsilon's limit (100: it protects nothing) is refused, as that target is: before
    training, before the slow accounting of a huge epsilon. The interval release's share of the
    run's epsilon is the plan budget's. Returns the run's whole planned epsilon (by RDP; the
    target when sigma is calibrated; None without privacy), which the progress bar shows."""
    if not plan.private or not mechanism.private:
        return None
    if mechanism.noise_multiplier_source != "config":
        return plan.budget.target
    history = mechanism.history_between(0, mechanism.planned_steps)
    planned = history_epsilon(history, delta=mechanism.delta, accountant=RDP)  # fast; PLD is at most this
    budget = plan.budget
    if budget.whole_from(planned) > MAX_TARGET_EPSILON and budget.headline is not RDP:
        planned = history_epsilon(history, delta=mechanism.delta, accountant=budget.headline)
    whole = budget.whole_from(planned)  # the interval release (a share of the run's epsilon) comes after training
    parts = f" ({planned:.4g} for DP-SGD, the rest for the coefficient table's intervals)" if budget.shares else ""
    how = (f"noise multiplier {mechanism.noise_multiplier:g} fixed by the preset or the command line, q = B/N = "
           f"{mechanism.sample_rate:.3g} with N = {mechanism.dataset_size} "
           f"{'training rows' if mechanism.unit is None else mechanism.unit.column + 's'}, "
           f"{mechanism.planned_steps} steps")
    if whole > MAX_TARGET_EPSILON:  # as privacy.target_epsilon above the limit: refused before training
        raise bad("privacy.noise_multiplier", mechanism.noise_multiplier,
                  f"this run's epsilon would be about {whole:.4g}{parts} ({how}), above "
                  f"{MAX_TARGET_EPSILON:g}, which protects nothing (the limit of privacy.target_epsilon); allowed: a "
                  "larger noise multiplier, privacy.target_epsilon=E (at most "
                  f"{MAX_TARGET_EPSILON:g}) or privacy.enabled=false (no privacy, said so)")
    if whole > LARGE_EPSILON:
        log.warning("privacy: this run's epsilon will be about %.3g%s (%s); for a chosen budget set "
                    "privacy.target_epsilon=E (e.g. privacy.target_epsilon=1: the noise is calibrated to this table)",
                    whole, parts, how)
    return whole


def newton_reason(plan: TrainingPlan) -> str | None:
    """Why a dpsgd run gets no Newton interval at all (None: it may get one)."""
    e = plan.estimator
    if e.name != "dpsgd" or e.interval_share == 0:
        return "estimator.interval_share=0"
    if plan.private and plan.budget.max_epsilon is not None:
        return "privacy.max_epsilon stops DP-SGD at a budget the interval's release would exceed"
    return exact_reason(plan)


def exact_reason(plan: TrainingPlan) -> str | None:
    """Why a run's table cannot be a fit on its rows after training (None: it can): the objective,
    the model, or a distributed run (each process holds only its shard)."""
    kind = objective_kind(plan.objective_name)
    if kind not in BOUNDS:
        return f"no coefficient table fit for objective={plan.objective_name} (binary, multinomial, linear only)"
    if plan.loop.distributed:
        return "trainer.distributed=true: each process holds only its shard of the rows"
    if not model_is_linear(plan):
        return "the model is not linear"
    return None


class SubsampleAggregate(DPSGD):
    """``subsample_aggregate``: DP-SGD on K disjoint, row-keyed parts; mean and t interval."""

    intervals = True
    exact_without_privacy = False

    def run(self, plan: TrainingPlan, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
        return _subsample_aggregate(plan, data, delta=delta, tracker=tracker, launch=launch)

    def check_size(self, plan: TrainingPlan, n: int) -> None:
        e = plan.estimator
        if n // e.parts < e.min_part_rows:
            most = max(n // e.min_part_rows, 0)
            raise ConfigError(f"estimator.parts={e.parts} is not allowed for N = {n} training rows: each part would "
                              f"have about {n // e.parts} rows, fewer than estimator.min_part_rows={e.min_part_rows}; "
                              f"allowed: estimator.parts <= {most} (or more rows)" + (
                                  "" if most >= 2 else "; this table is too small for subsample_aggregate"))

    def table(self, plan: TrainingPlan, result: Any, enc: Any, report: dict) -> Any:
        est = plan.estimator
        iv = aggregate_parts(np.stack(result.inference["part_coefficients"]), level=est.level)
        claimed = validity_check(est.name, epsilon=report.get("epsilon"),
                                 dataset_size=result.mechanism.dataset_size * est.parts, parts=est.parts)["claimed"]
        return coefficient_frame(table_terms(enc), iv.estimate, iv, method=SA_METHOD.format(
            k=est.parts, dof=est.parts - 1), claimed=claimed)

    def report(self, plan: TrainingPlan, result: Any, *, eps: Any, delta: Any, accountant: str, guarantee: str) -> dict:
        est, m = plan.estimator, result.mechanism
        return dict(parts=est.parts, level=est.level, part_dataset_size=m.dataset_size,
                    part_expected_batch_size=m.expected_batch_size, partition=(
                        "each row's part drawn uniformly and independently of the other rows from the run's "
                        "secret randomness (stream 'subsample-parts'); the partition is not published"),
                    guarantee=(f"({eps:.4g}, {delta:.3g})-DP by parallel composition: each row is in exactly one of "
                               f"the {est.parts} disjoint parts, each trained by DP-SGD under the same mechanism, "
                               f"accounted once ({accountant} accountant, one part's {result.privacy['steps']} "
                               "steps). It covers the K part models and every function of them: model.pt (their "
                               "average) and coefficients.csv (estimates, standard errors, intervals); the "
                               "intervals spend no privacy beyond it"), validity=SA_VALIDITY,
                    validity_check=validity_check(est.name, epsilon=eps, dataset_size=m.dataset_size * est.parts,
                                                  parts=est.parts))


class SSP(DPSGD):
    """``ssp``: noisy sufficient statistics (linear regression), parametric-bootstrap interval."""

    intervals = True

    def run(self, plan: TrainingPlan, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
        if not plan.private:  # the exact OLS fit, as estimator=dpsgd gives without privacy
            return super().run(plan, data, delta=delta, tracker=tracker, launch=launch)
        return run_ssp(plan, data, delta=delta, tracker=tracker, launch=launch)

    def check_objective(self, plan: TrainingPlan) -> None:
        if objective_kind(plan.objective_name) != "linear":
            raise bad("estimator", "ssp", f"estimates linear regression only, not objective={plan.objective_name}; "
                      f"allowed with objective={plan.objective_name}: estimator=dpsgd | subsample_aggregate")

    def check(self, plan: TrainingPlan) -> None:
        if plan.private and plan.budget.target is None:
            raise bad("privacy.target_epsilon", None, "estimator=ssp calibrates its Gaussian noise to a target: set "
                      "privacy.target_epsilon=E (and privacy.noise_multiplier=null)")
        ssp_config_check(encoder_for(plan))

    def table(self, plan: TrainingPlan, result: Any, enc: Any, report: dict) -> Any:
        if "table" in (result.inference or {}):  # without privacy: the exact fit's
            return result.inference["table"]
        iv = result.inference["interval"]
        claimed = validity_check("ssp", epsilon=report.get("epsilon"),
                                 dataset_size=result.mechanism.dataset_size)["claimed"]
        return coefficient_frame(table_terms(enc), iv.estimate, iv, method=SSP_METHOD.format(
            b=plan.estimator.bootstrap), claimed=claimed)

    def report(self, plan: TrainingPlan, result: Any, *, eps: Any, delta: Any, accountant: str, guarantee: str) -> dict:
        if "exact" in (result.inference or {}):
            return super().report(plan, result, eps=eps, delta=delta, accountant=accountant, guarantee=guarantee)
        est = plan.estimator
        return dict(level=est.level, bootstrap=est.bootstrap, **{k: v for k, v in result.privacy["ssp"].items()
                                                                  if k != "guarantee"},
                    guarantee=(f"({eps:.4g}, {delta:.3g})-DP, example-level, add/remove-one-record neighbours: one "
                               f"Gaussian mechanism on the sufficient statistics ({accountant} accountant, "
                               f"GaussianDpEvent({result.mechanism.noise_multiplier:.6g})); it covers the released "
                               "noisy statistics and everything computed from them: model.pt and coefficients.csv "
                               "(estimates, bootstrap standard errors and intervals; the bootstrap spends no "
                               "privacy)"), validity=SSP_VALIDITY,
                    validity_check=validity_check(est.name, epsilon=eps, dataset_size=result.mechanism.dataset_size))


#: the estimators (``estimator.name``); a plugin registers its own class with the same methods
ESTIMATORS: Registry = Registry("estimator", setting="estimator.name")
ESTIMATORS.register("dpsgd", DPSGD())
ESTIMATORS.register("subsample_aggregate", SubsampleAggregate())
ESTIMATORS.register("ssp", SSP())
