"""The ``estimator`` settings (``estimator=NAME``, ``conf/estimator/NAME.yaml``) and their checks.

Checked twice, before any row is read: :func:`check_estimator` (the settings alone and against
the objective and model) and :func:`check_estimator_size` (against the PUBLIC N: enough rows
per part). Every refusal names the setting, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from dptrain.core.validation import setting

__all__ = ["MAX_PARTS", "EstimatorConfig"]

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
    interval_share: float = setting(0.25, help="dpsgd with a linear model (objective=binary, multinomial or "
                                    "linear): the share of the run's epsilon spent on two private Newton steps at "
                                    "DP-SGD's model, which give the coefficient table its estimates and sandwich "
                                    "intervals (privacy noise included); 0: estimates without intervals",
                                    allowed="a number in [0, 0.9]")
    bootstrap: int = setting(1000, help="ssp: parametric-bootstrap draws for the interval (no privacy cost: "
                             "they use the released noisy statistics only)", allowed="an integer in [100, 100000]")
