"""Cell suppression (``release.method=suppression_5 | suppression_10 | suppression_20``): the EXACT
OLS estimate of every cell with N >= k. No noise and NO guarantee (docs/release.md section 5).

One parametrised method, registered once per threshold k; ``release.suppression_k`` picks the
thresholds the private evaluation compares.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dptrain.release.api import CellEstimates
from dptrain.release.cells import Cells, OLSFit, ReleaseError, ols, standard_error
from dptrain.release.cells import statistic as cell_statistic
from dptrain.release.intervals import LEVEL
from dptrain.release.methods.base import RELEASE_METHODS, MethodResult, ReleaseMethod
from dptrain.release.methods.common import (
    check_int,
    check_statistic,
    method_meta,
    reasons,
    result_frame,
)
from dptrain.release.report import RunFacts, baseline_json
from dptrain.release.spec import ReleaseSpec

THRESHOLDS = (5, 10, 20)

GUARANTEE = (
    "none: suppression releases the EXACT per-cell estimate of every cell with N >= k (no noise); it is NOT "
    "differentially private and its privacy loss is uncontrolled (exact values, differencing of overlapping "
    "releases; which cells are released depends on the private N)")


INTERVAL = (
    "exact OLS t-interval theta +/- t_(N-2, 0.975) SE with the homoskedastic SE sqrt(RSS / (N - 2) (1/N + "
    "(x0 - xbar)^2 / Sxx)) (slope: sqrt(RSS / (N - 2) / Sxx)) of the cell's own exact data: no privacy noise to "
    "add; assumes a linear conditional mean with constant residual variance (exact under normal errors, "
    "approximate otherwise); like theta itself it discloses exact private values (the SE, so RSS)")


def suppression(cells: Cells, *, statistic: str, k: int, rate_outcome: bool = False,
                fit: OLSFit | None = None) -> tuple[pd.DataFrame, dict]:
    """Cell suppression: release the exact OLS theta only if N >= k and, for a rate outcome
    (y in {0, 1}), N p >= k events and N (1 - p) >= k non-events. No noise (noise_sd = 0).
    Not DP: the privacy loss is uncontrolled (a released cell is exact; differencing works).
    ``ci_low`` / ``ci_high``: the exact OLS t-interval (``INTERVAL``; also exact private values).
    ``fit``: the cells' OLS fit if already computed."""
    from scipy.stats import t as student_t  # scipy.stats: imported where it is used

    check_statistic(statistic)
    k = check_int(k, "release.k")
    n = cells.n
    rules = [(n < k, f"N < k={k}")]
    if rate_outcome:
        if np.any((cells.y != 0.0) & (cells.y != 1.0)):
            raise ReleaseError("release.rate_outcome=true needs y in {0, 1}: some rows have another value; "
                               "allowed: a binary outcome, or rate_outcome=false")
        rules += [(cells.sy < k, f"events N p < k={k}"), (n - cells.sy < k, f"non-events N (1 - p) < k={k}")]
    fit = ols(cells) if fit is None else fit
    rules.append((~fit.defined, "OLS undefined (N < 3 or no spread in x)"))
    theta = cell_statistic(fit, statistic, cells.domain)
    with np.errstate(invalid="ignore"):  # N < 3: no t quantile (those cells are not released)
        halfwidth = student_t.ppf(0.5 + LEVEL / 2.0, np.where(fit.n > 2, fit.n - 2, np.nan)) \
            * standard_error(fit, statistic, cells.domain)
    frame = result_frame(reasons(cells.n_cells, rules), theta, 0.0, halfwidth=halfwidth)
    return frame, method_meta(
        "suppression", statistic, None, None, 0.0,
        split="none: no noise", reference="Chetty & Friedman 2019 (the teen-birth example); docs/release.md section 5",
        guarantee="none: privacy loss uncontrolled (released cells are exact; which cells are released "
                  "depends on private counts)", k=k, rate_outcome=bool(rate_outcome),
        interval=INTERVAL)


class Suppression(ReleaseMethod):
    """``suppression_k``: exact values of the cells with N >= k."""

    neighbours = None
    has_guarantee = False

    def __init__(self, k: int, *, tail_figure: bool = False) -> None:
        self.k = k
        self.tail_figure = tail_figure

    def in_evaluation(self, config: ReleaseSpec) -> bool:
        return self.k in config.suppression_k

    def warning(self, name: str, config: ReleaseSpec) -> str:
        return (f"release.method={name} releases the EXACT estimate of every cell with N >= k: no noise, NOT "
                "differentially private")

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseSpec) -> MethodResult:
        frame, meta = suppression(est.cells, statistic=config.statistic, k=self.k,
                                  rate_outcome=config.rate_outcome, fit=est.fit)
        return MethodResult(frame, meta)

    def release_json(self, name: str, result: MethodResult, *, facts: RunFacts) -> dict:
        return baseline_json(name, result, neighbours=None, facts=facts, guarantee=GUARANTEE)


for _k in THRESHOLDS:  # suppression_10 is also drawn in the tail figure
    RELEASE_METHODS.register(f"suppression_{_k}", Suppression(_k, tail_figure=_k == 10))
