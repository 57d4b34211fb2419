"""The ``estimator`` settings (``estimator=NAME``, ``conf/estimator/NAME.yaml``) and their checks.

Checked twice, before any row is read: :func:`check_estimator` (the settings alone and against
the objective and model) and :func:`check_estimator_size` (against the PUBLIC N: enough rows
per part). Every refusal names the setting, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.validation import ConfigError, bad, integer, one_of, real, setting

__all__ = ["ESTIMATORS", "LINEAR_OBJECTIVES", "EstimatorConfig", "check_estimator", "check_estimator_size",
           "objective_kind"]

#: the estimators (estimator=NAME)
ESTIMATORS = ("dpsgd", "subsample_aggregate", "ssp")
#: objective name -> what the linear model's outputs mean (the coefficient table's kind)
OBJECTIVE_KINDS = {"binary": "binary", "multinomial": "multinomial", "multiclass": "multinomial",
                   "linear": "linear", "linear_regression": "linear", "regression": "linear", "gaussian": "linear"}
#: objectives that are linear regression (the only ones ssp estimates)
LINEAR_OBJECTIVES = tuple(k for k, v in OBJECTIVE_KINDS.items() if v == "linear")
MAX_PARTS = 1000


@dataclass
class EstimatorConfig:
    """How the coefficients and their intervals are estimated (docs/inference.md)."""

    name: str = setting("dpsgd", help="dpsgd = DP-SGD on all rows, estimates without an interval; "
                        "subsample_aggregate = DP-SGD on K disjoint parts, mean and t interval (intervals include "
                        "the privacy noise); ssp = noisy sufficient statistics (linear regression only) with a "
                        "parametric-bootstrap interval", allowed="dpsgd | subsample_aggregate | ssp")
    parts: int = setting(10, help="subsample_aggregate: K, the number of disjoint parts (each trained with the "
                         "full privacy budget; parallel composition)", allowed="an integer in [2, 1000] with "
                         "N / K >= estimator.min_part_rows")
    min_part_rows: int = setting(1000, help="subsample_aggregate: the fewest PUBLIC rows per part (N // K) allowed; "
                                 "below it a part's DP-SGD estimate is too noisy and biased for its interval (the "
                                 "coverage study: 200 rows per part under-cover, 2,000 cover)",
                                 allowed="an integer >= 10")
    level: float = setting(0.95, help="the confidence level of the intervals", allowed="a number in (0.5, 1)")
    bootstrap: int = setting(1000, help="ssp: parametric-bootstrap draws for the interval (no privacy cost: "
                             "they use the released noisy statistics only)", allowed="an integer in [100, 100000]")


def objective_kind(objective_name: str) -> str | None:
    """The coefficient table's kind for an objective (None: no linear interpretation known)."""
    return OBJECTIVE_KINDS.get(objective_name)


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
    if e.name == "ssp" and cfg.objective.name not in LINEAR_OBJECTIVES:
        raise bad("estimator", "ssp", f"estimates linear regression only, not objective={cfg.objective.name}; "
                  f"allowed with objective={cfg.objective.name}: estimator=dpsgd | subsample_aggregate")
    from dptrain.inference.run import model_is_linear

    if not model_is_linear(cfg):
        raise bad("estimator", e.name, "needs a linear model (model=logit: one Linear layer) whose coefficients "
                  "it estimates; allowed with this model: estimator=dpsgd")
    _check_training_only(cfg, e.name)
    if e.name == "ssp":
        from dptrain.inference.run import _encoder
        from dptrain.inference.ssp import ssp_config_check

        ssp_config_check(_encoder(cfg))


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
