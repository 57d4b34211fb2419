"""The estimators in a training run: :func:`run_estimator` (what ``task=train`` trains) and
:func:`coefficient_section` (the table and the guarantee the run folder publishes).

* ``dpsgd``: :func:`dptrain.train.fit` on all rows, exactly as without this module;
* ``subsample_aggregate``: :mod:`dptrain.inference.subsample` (K part models; the published
  model is their average, whose coefficients are the table's estimates);
* ``ssp``: :mod:`dptrain.inference.ssp` (one Gaussian release of the sufficient statistics).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import numpy as np
import torch

from dptrain.inference.coefficients import (
    encoder_for_config,
    linear_layer,
    model_coefficients,
    objective_kind,
    table_terms,
)
from dptrain.inference.intervals import aggregate_parts, coefficient_frame, format_table
from dptrain.inference.settings import ESTIMATORS, MAX_PARTS
from dptrain.inference.ssp import ssp_config_check
from dptrain.inference.ssp_run import run_ssp
from dptrain.inference.subsample import fit_parts, part_mechanism
from dptrain.objectives import build_objective
from dptrain.train import TrainResult, build_model, data_spec_from_config, fit, mechanism_for
from dptrain.validation import ConfigError, bad, integer, one_of, real

__all__ = ["check_estimator", "check_estimator_size", "coefficient_section", "model_is_linear", "run_estimator"]

log = logging.getLogger(__name__)

NO_INTERVAL = ("dpsgd: estimate only, no interval computed (estimator=subsample_aggregate gives intervals that "
               "include the privacy noise; estimator=ssp for linear regression)")
SA_METHOD = "subsample_aggregate: mean of {k} part estimates, SE = sd/sqrt({k}), t({dof}) interval"
SSP_METHOD = ("ssp: noisy sufficient statistics (AdaSSP-style spectral floor), parametric-bootstrap basic interval "
              "({b} draws)")


def model_is_linear(cfg: Any) -> bool:
    """True when the configured model is one Linear layer (built from the public schema)."""
    model = build_model(cfg, spec=data_spec_from_config(cfg.data), objective=build_objective(cfg.objective))
    return linear_layer(model) is not None


def run_estimator(conf: Any, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
    """Train (or release) with ``conf.estimator``; returns a :class:`dptrain.train.TrainResult`
    (``inference`` holds what the coefficient table needs beyond the model)."""
    name = conf.estimator.name
    if name == "dpsgd":
        mechanism = mechanism_for(conf, dataset_size=data.n_train, delta=delta)
        return fit(conf, data, mechanism=mechanism, tracker=tracker, launch=launch)
    if name == "subsample_aggregate":
        return _subsample_aggregate(conf, data, delta=delta, tracker=tracker, launch=launch)

    return run_ssp(conf, data, delta=delta, tracker=tracker, launch=launch)


def _subsample_aggregate(conf: Any, data: Any, *, delta: float, tracker: Any, launch: Any) -> Any:
    k = conf.estimator.parts
    mech = part_mechanism(conf.privacy, epochs=conf.trainer.epochs, batch_size=conf.trainer.batch_size,
                          dataset_size=data.n_train, parts=k, delta=delta)
    log.info("subsample_aggregate: %d parts, each N_part = %d (public: floor(N/K)), B_part = %d, q = %.6g, "
             "steps = %d, sigma = %g", k, mech.dataset_size, mech.expected_batch_size, mech.sample_rate,
             mech.planned_steps, mech.noise_multiplier)
    parts = fit_parts(conf, data, mechanism=mech, randomness=launch.randomness)
    enc = encoder_for_config(conf)
    coefs = [model_coefficients(r.model, enc) for r in parts]
    model = copy.deepcopy(parts[0].model)
    with torch.no_grad():  # the published model: the average of the part models (a function of them)
        for p, *qs in zip(model.parameters(), *(r.model.parameters() for r in parts), strict=True):
            p.copy_(torch.stack(qs).mean(0))
    metrics = _aggregate_metrics(conf, data, parts, model)
    tracker.scalars({k2: v for k2, v in metrics.items() if k2.startswith("test/")}, step=parts[0].privacy["steps"])
    record = {**parts[0].privacy, "engine": f"{parts[0].privacy['engine']} (x{k} parts)"}
    return TrainResult(model=model, metrics=metrics, privacy=record, accountant=parts[0].accountant,
                       mechanism=mech, inference={"part_coefficients": coefs, "parts": k})


def _aggregate_metrics(conf: Any, data: Any, parts: list[Any], model: Any) -> dict[str, float]:
    """Test metrics of the averaged model, the baselines once on all rows, and the parts' steps/times."""
    objective = build_objective(conf.objective)
    with torch.no_grad():
        test = objective.metrics(model(data.x_test), data.y_test)
    metrics = {f"test/{k}": v for k, v in test.items()}
    metrics.update({f"baseline/{k}": v for k, v in objective.baseline(data, seed=conf.seed,
                                                                         fit=conf.trainer.baseline).items()})
    first = parts[0].metrics
    metrics.update({k: first[k] for k in ("train/steps", "train/planned_steps", "train/resumed_from_step",
                                          "train/epochs") if k in first})
    for k in ("time/train_seconds", "time/loop_seconds"):
        metrics[k] = float(sum(r.metrics[k] for r in parts))
    metrics["time/steps_per_second"] = len(parts) * first["train/steps"] / max(metrics["time/train_seconds"], 1e-9)
    return metrics


def coefficient_section(conf: Any, result: Any) -> dict[str, Any] | None:
    """The coefficient table of a run with a linear model (None otherwise): ``frame`` (the rows
    of coefficients.csv), ``text`` (the summary for privacy.txt and the log) and ``estimator``
    (the guarantee text for the report)."""
    if linear_layer(result.model) is None or objective_kind(conf.objective.name) is None:
        return None
    enc = encoder_for_config(conf)
    est = conf.estimator
    inference = getattr(result, "inference", None) or {}
    if est.name == "subsample_aggregate":
        iv = aggregate_parts(np.stack(inference["part_coefficients"]), level=est.level)
        frame = coefficient_frame(table_terms(enc), iv.estimate, iv, method=SA_METHOD.format(
            k=est.parts, dof=est.parts - 1))
    elif est.name == "ssp":
        iv = inference["interval"]
        frame = coefficient_frame(table_terms(enc), iv.estimate, iv, method=SSP_METHOD.format(b=est.bootstrap))
    else:
        n_out = linear_layer(result.model).out_features
        frame = coefficient_frame(table_terms(enc, n_out), model_coefficients(result.model, enc), None,
                                  method=NO_INTERVAL)
    title = f"coefficients on the original scale (estimator={est.name}, objective={conf.objective.name})"
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


def estimator_report(conf: Any, result: Any, report: dict[str, Any], section: dict[str, Any] | None) -> dict:
    """The estimator's part of privacy.json: its name, its guarantee (which (epsilon, delta),
    which accountant, that the intervals are inside that budget), when its intervals are valid."""
    est, acc = conf.estimator, conf.privacy.accountant
    eps, delta = report.get("epsilon"), report.get("delta")
    out: dict[str, Any] = {"name": est.name, "coefficients": "coefficients.csv" if section else None}
    if est.name == "dpsgd":
        out.update(intervals="none computed", guarantee=report["guarantee"])
    elif est.name == "subsample_aggregate":
        m = result.mechanism
        out.update(parts=est.parts, level=est.level, part_dataset_size=m.dataset_size,
                   part_expected_batch_size=m.expected_batch_size, partition=(
                       "keyed hash of each row's own encoded content (features, target); key = BLAKE2b(seed, "
                       "person='dptrain-parts'), public; a row's part depends on that row alone"),
                   guarantee=(f"({eps:.4g}, {delta:.3g})-DP by parallel composition: each row is in exactly one of "
                              f"the {est.parts} disjoint parts, each trained by DP-SGD under the same mechanism, "
                              f"accounted once ({acc} accountant, one part's {result.privacy['steps']} steps). It "
                              "covers the K part models and every function of them: model.pt (their average) and "
                              "coefficients.csv (estimates, standard errors, intervals); the intervals spend no "
                              "privacy beyond it"), validity=SA_VALIDITY,
                   validity_check=validity_check(est.name, epsilon=eps, dataset_size=m.dataset_size * est.parts,
                                                 parts=est.parts))
    else:
        out.update(level=est.level, bootstrap=est.bootstrap, **{k: v for k, v in result.privacy["ssp"].items()
                                                                 if k != "guarantee"},
                   guarantee=(f"({eps:.4g}, {delta:.3g})-DP, example-level, add/remove-one-record neighbours: one "
                              f"Gaussian mechanism on the sufficient statistics ({acc} accountant, "
                              f"GaussianDpEvent({result.mechanism.noise_multiplier:.6g})); it covers the released "
                              "noisy statistics and everything computed from them: model.pt and coefficients.csv "
                              "(estimates, bootstrap standard errors and intervals; the bootstrap spends no "
                              "privacy)"), validity=SSP_VALIDITY,
                   validity_check=validity_check(est.name, epsilon=eps, dataset_size=result.mechanism.dataset_size))
    if not out.get("validity_check", {"claimed": True})["claimed"]:
        log.warning("estimator=%s: %s", est.name, out["validity_check"]["why"])
    if section is not None:
        out["table"] = section["text"]
    return out


def check_estimator(cfg: Any) -> None:
    """The estimator settings alone and against the run's objective, model and privacy."""
    e = cfg.estimator
    one_of("estimator.name", e.name, ESTIMATORS)
    integer("estimator.parts", e.parts, 2, f"must be an integer in [2, {MAX_PARTS}]")
    if e.parts > MAX_PARTS:
        raise bad("estimator.parts", e.parts, f"must be an integer in [2, {MAX_PARTS}]")
    integer("estimator.min_part_rows", e.min_part_rows, 10)
    real("estimator.level", e.level, "must be a number in (0.5, 1)", lo=0.5, hi=1, lo_open=True, hi_open=True)
    integer("estimator.bootstrap", e.bootstrap, 100, "must be an integer in [100, 100000]")
    if e.bootstrap > 100_000:
        raise bad("estimator.bootstrap", e.bootstrap, "must be an integer in [100, 100000]")
    if e.name == "dpsgd":
        return
    if not cfg.privacy.enabled:
        raise bad("estimator", e.name, "needs privacy.enabled=true (its interval accounts for the privacy noise); "
                  "allowed without privacy: estimator=dpsgd")
    if e.name == "ssp" and objective_kind(cfg.objective.name) != "linear":
        raise bad("estimator", "ssp", f"estimates linear regression only, not objective={cfg.objective.name}; "
                  f"allowed with objective={cfg.objective.name}: estimator=dpsgd | subsample_aggregate")
    if not model_is_linear(cfg):
        raise bad("estimator", e.name, "needs a linear model (model=logit: one Linear layer) whose coefficients "
                  "it estimates; allowed with this model: estimator=dpsgd")
    _check_training_only(cfg, e.name)
    if e.name == "ssp":
        ssp_config_check(encoder_for_config(cfg))


def _check_training_only(cfg: Any, name: str) -> None:
    """Training settings that subsample_aggregate / ssp do not support, refused by name."""
    if getattr(cfg, "task", "train") != "train":
        raise bad("estimator", name, "is for task=train only; allowed for this task: estimator=dpsgd")
    if cfg.trainer.resume is not None:
        raise bad("trainer.resume", cfg.trainer.resume, f"must be null with estimator={name} (its runs are not "
                  "resumable); allowed: estimator=dpsgd to resume")
    if cfg.trainer.distributed:
        raise bad("trainer.distributed", True, f"must be false with estimator={name}")
    if cfg.privacy.max_epsilon is not None:
        raise bad("privacy.max_epsilon", cfg.privacy.max_epsilon, f"must be null with estimator={name} (set "
                  "privacy.target_epsilon instead)")
    if name == "ssp" and cfg.privacy.target_epsilon is None:
        raise bad("privacy.target_epsilon", None, "estimator=ssp calibrates its Gaussian noise to a target: set "
                  "privacy.target_epsilon=E (and privacy.noise_multiplier=null)")


def check_estimator_size(cfg: Any, n: int) -> None:
    """Against the PUBLIC training-set size N: subsample_aggregate needs N / K >= min_part_rows."""
    e = cfg.estimator
    if e.name != "subsample_aggregate":
        return
    if n // e.parts < e.min_part_rows:
        most = max(n // e.min_part_rows, 0)
        raise ConfigError(f"estimator.parts={e.parts} is not allowed for N = {n} training rows: each part would "
                          f"have about {n // e.parts} rows, fewer than estimator.min_part_rows={e.min_part_rows}; "
                          f"allowed: estimator.parts <= {most} (or more rows)" + (
                              "" if most >= 2 else "; this table is too small for subsample_aggregate"))
