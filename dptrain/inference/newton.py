"""The private Newton release (:mod:`dptrain.privacy.newton`) on a run's coefficient table: the
reference-coded design ``z`` of a row (the intercept, each numeric column scaled by its PUBLIC
bounds into [0, 1], one indicator per non-reference level of each categorical column: the
reference level's is dropped, so the design has full rank), its public bound
``||z||^2 <= 1 + (numeric columns) + (categorical columns)``, the map between a linear layer's
weights and the reduced parameters, and the table's terms with their intervals.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from dptrain.inference.coefficients import CoefficientEncoder, coefficient_map, coefficient_offset
from dptrain.privacy.newton import NewtonFit

__all__ = ["embed", "radius2", "reduce", "reduced_design", "reduced_to_terms", "term_intervals"]


def _blocks(enc: CoefficientEncoder) -> list[tuple[int, int]]:
    """(first column, number of levels + 1) of each categorical block in the encoded features."""
    out, j = [], len(enc.numeric)
    for _, levels in enc.categorical:
        out.append((j, len(levels) + 1))
        j += len(levels) + 1
    return out


def reduced_design(x: np.ndarray, enc: CoefficientEncoder) -> np.ndarray:
    """``z`` per row (module docstring): [1, numeric columns, non-reference level indicators]."""
    x = np.asarray(x, dtype=np.float64)
    cols = [np.ones((len(x), 1)), x[:, :len(enc.numeric)]]
    for start, width in _blocks(enc):
        cols.append(x[:, start + 1:start + width])
    return np.concatenate(cols, axis=1)


def radius2(enc: CoefficientEncoder) -> float:
    """The PUBLIC bound on ``||z||^2``: 1 + numeric columns + categorical columns."""
    return 1.0 + len(enc.numeric) + len(enc.categorical)


def reduce(bias: float, weight: np.ndarray, enc: CoefficientEncoder) -> np.ndarray:
    """The reduced parameters of one output (intercept absorbs the reference levels' weights)."""
    w = np.asarray(weight, dtype=np.float64).reshape(-1)
    theta = [float(bias) + sum(float(w[s]) for s, _ in _blocks(enc)), *w[:len(enc.numeric)]]
    for start, width in _blocks(enc):
        theta += list(w[start + 1:start + width] - w[start])
    return np.asarray(theta)


def embed(theta: np.ndarray, enc: CoefficientEncoder) -> tuple[float, np.ndarray]:
    """(bias, weight) of a linear layer with the reduced parameters ``theta`` (reference levels 0)."""
    d = enc.n_features
    w = np.zeros(d)
    k = len(enc.numeric)
    w[:k] = theta[1:1 + k]
    j = 1 + k
    for start, width in _blocks(enc):
        w[start + 1:start + width] = theta[j:j + width - 1]
        j += width - 1
    return float(theta[0]), w


def reduced_to_terms(enc: CoefficientEncoder) -> tuple[np.ndarray, np.ndarray]:
    """(A, b): the coefficient table's terms are ``A @ theta + b`` for reduced parameters theta."""
    p = 1 + len(enc.numeric) + sum(w - 1 for _, w in _blocks(enc))
    e = np.zeros((1 + enc.n_features, p))
    for col in range(p):
        unit = np.zeros(p)
        unit[col] = 1.0
        bias, w = embed(unit, enc)
        e[0, col], e[1:, col] = bias, w
    return coefficient_map(enc) @ e, coefficient_offset(enc)


def term_intervals(fit: NewtonFit, enc: CoefficientEncoder, *, level: float) -> tuple[np.ndarray, ...]:
    """(estimate, std_error, lower, upper, informative) of the coefficient table's terms (one output):
    a term built from an uninformative parameter gets no standard error or interval."""
    a, b = reduced_to_terms(enc)
    used = np.abs(a) > 0
    ok = ~np.any(used & ~fit.informative[None, :], axis=1)
    cov = np.where(np.isfinite(fit.covariance), fit.covariance, 0.0)
    est = a @ fit.estimate + b
    se = np.where(ok, np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", a, cov, a), 0.0)), np.nan)
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    return est, se, est - z * se, est + z * se, ok
