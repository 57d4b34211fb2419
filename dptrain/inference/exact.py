"""The exact, NON-private fit of a linear model's coefficient table (a run with privacy off).

Without privacy there is no reason to publish an optimiser's approximate answer: the table (and
the model) is the maximum-likelihood fit of the same reduced-coded design that the private table
uses (:mod:`dptrain.inference.newton`), by Newton-Raphson to convergence (iteratively reweighted
least squares; step halving when the loss would rise), with the classical standard errors:

* ``binary``: logistic regression (a binomial GLM with the logit link), standard errors from the
  inverse observed information, normal quantiles: statsmodels' ``GLM(..., Binomial())`` and
  ``Logit`` give the same numbers;
* ``multinomial``: each class against the first, the same (statsmodels' ``MNLogit``);
* ``linear``: ordinary least squares on the target's [0, 1] scale (the table maps it back),
  ``s^2 (Z'Z)^-1`` with ``s^2 = RSS / (n - p)``, Student's t(n - p) quantiles (statsmodels' ``OLS``).

Aliased terms are found as R finds them: a pivoted Cholesky of the information matrix in the
declared order drops a term whose curvature given the earlier terms is below 1e-7 of its own (two
codings of one variable), or that has none (a declared level, or the "other" level, without rows);
it is fixed at 0 and reported without an estimate (NA). A term whose curvature vanishes during
the iterations (a level whose rows all have one outcome: the fitted probabilities go to 0 or 1 and
the maximum-likelihood estimate does not exist) is reported as not identified. The sums are taken
over blocks of rows, so memory does not grow with N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dptrain.data.blocks import row_blocks
from dptrain.inference.coefficients import CoefficientEncoder
from dptrain.inference.newton import linear_predictor, reduced_design
from dptrain.privacy.newton import statistics

__all__ = ["ALIAS_TOLERANCE", "ExactFit", "exact_fit"]

#: a term whose curvature given the earlier ones is below this share of its own is aliased (R's
#: qr() tolerance is 1e-7 on the design's columns)
ALIAS_TOLERANCE = 1e-7
#: Newton-Raphson stops when the loss changes by less than this (relative; R's glm uses 1e-8)
TOLERANCE = 1e-10
MAX_ITERATIONS = 100
#: a term whose curvature at the fit is below this share of its curvature at 0 has rows whose fitted
#: probabilities are numerically 0 or 1 (below about 2.5e-5 from them): separation
SEPARATED = 1e-4


@dataclass(frozen=True)
class ExactFit:
    """The maximum-likelihood (least-squares) fit: ``estimate`` (reduced parameters, aliased at 0),
    ``covariance`` (NaN outside the identified terms), ``identified`` / ``aliased`` /
    ``separated`` per parameter, ``dof`` (t quantiles' degrees of freedom; inf: normal),
    ``iterations`` and whether the iterations ``converged``."""

    estimate: np.ndarray
    covariance: np.ndarray
    identified: np.ndarray
    aliased: np.ndarray
    separated: np.ndarray
    dof: float
    iterations: int
    converged: bool


def _sums(x: np.ndarray, y: np.ndarray, theta: np.ndarray, enc: CoefficientEncoder,
          kind: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(gradient, Hessian, loss) of the exact loss over the rows, block by block: binary and
    multinomial the negative log-likelihood, linear half the sum of squares (no clipping)."""
    g_tot, h_tot, loss = None, None, 0.0
    for start, stop in row_blocks(len(x), 1 << 15):
        z = reduced_design(x[start:stop], enc)
        yy = y[start:stop]
        eta = linear_predictor(z, theta, kind)
        if kind == "linear":
            r = eta - np.asarray(yy, dtype=np.float64).reshape(-1)
            g, h = z.T @ r, z.T @ z
            loss += 0.5 * float(r @ r)
        else:
            g, h, _ = statistics(z, yy, eta, kind)
            loss += _nll(eta, yy, kind)
        g_tot = g if g_tot is None else g_tot + g
        h_tot = h if h_tot is None else h_tot + h
    return g_tot, h_tot, loss


def _nll(eta: np.ndarray, y: np.ndarray, kind: str) -> float:
    if kind == "binary":
        eta = np.asarray(eta, dtype=np.float64).reshape(-1)
        return float(np.sum(np.logaddexp(0.0, eta) - np.asarray(y, dtype=np.float64).reshape(-1) * eta))
    top = eta.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(eta - top).sum(axis=1))
    picked = eta[np.arange(len(eta)), np.asarray(y).reshape(-1).astype(np.int64)]
    return float(np.sum(log_norm - picked))


def _pivot(h: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The candidates (declared order) whose curvature given the earlier kept ones is at least
    :data:`ALIAS_TOLERANCE` of their own (and positive): R's aliasing rule."""
    kept: list[int] = []
    for j in candidates:
        own = float(h[j, j])
        if own <= 0:
            continue
        if kept:
            b = np.linalg.lstsq(h[np.ix_(kept, kept)], h[kept, j], rcond=None)[0]
            given = own - float(h[j, kept] @ b)
        else:
            given = own
        if given > ALIAS_TOLERANCE * own:
            kept.append(int(j))
    return np.asarray(kept, dtype=np.int64)


def exact_fit(x: np.ndarray, y: np.ndarray, enc: CoefficientEncoder, kind: str, *, classes: int = 2) -> ExactFit:
    """The fit of the module docstring, from 0, on the encoded rows ``x`` and targets ``y``."""
    p = (1 + len(enc.numeric) + sum(len(levels) for _, levels in enc.categorical)) * (
        classes - 1 if kind == "multinomial" else 1)
    theta = np.zeros(p)
    g, h, loss = _sums(x, y, theta, enc, kind)
    first_curvature = np.diag(h).copy()
    idx = _pivot(h, np.arange(p))
    converged, iterations = False, 0
    for iterations in range(1, MAX_ITERATIONS + 1):  # noqa: B007 - reported after the loop
        step = np.zeros(p)
        step[idx] = np.linalg.solve(h[np.ix_(idx, idx)], g[idx])
        t, new = 1.0, None
        for _ in range(30):  # step halving (R's glm.fit does the same when the deviance rises)
            cand = theta - t * step
            new = _sums(x, y, cand, enc, kind)
            if new[2] <= loss * (1 + 1e-12) + 1e-12:
                break
            t /= 2.0
        theta = cand
        change = abs(loss - new[2]) / (abs(new[2]) + 0.1)
        g, h, loss = new
        if change < TOLERANCE:
            converged = True
            break
    separated = np.zeros(p, dtype=bool)
    if kind != "linear":
        diag = np.diag(h)
        separated[idx] = diag[idx] < SEPARATED * first_curvature[idx]
    ident = np.zeros(p, dtype=bool)
    ident[idx] = True
    aliased = ~ident  # R's NA: a column the earlier ones determine, or one without information (no rows)
    ident &= ~separated
    use = np.flatnonzero(ident)
    cov = np.full((p, p), np.nan)
    dof = math.inf
    if use.size:
        inv = np.linalg.inv(h[np.ix_(use, use)])
        if kind == "linear":
            dof = float(len(x) - use.size)
            inv = inv * (2.0 * loss / max(dof, 1.0))
        cov[np.ix_(use, use)] = (inv + inv.T) / 2.0
    theta[~ident & ~separated] = 0.0
    return ExactFit(theta, cov, ident, aliased, separated, dof, iterations, converged)
