"""The private Newton release (:mod:`dptrain.privacy.newton`) on a run's coefficient table: the
reference-coded design ``z`` of a row (the intercept, each numeric column scaled by its PUBLIC
bounds into [0, 1], one indicator per non-reference level of each categorical column: the
reference level's is dropped, so the design has full rank), its public bound
``||z||^2 <= 1 + (numeric columns) + (categorical columns)``, the map between a linear layer's
weights and the reduced parameters, and the table's terms with their intervals.
"""

from __future__ import annotations

import math

import numpy as np

from dptrain.data.blocks import row_blocks
from dptrain.inference.coefficients import CoefficientEncoder, coefficient_map, coefficient_offset
from dptrain.privacy.newton import NewtonFit, statistics
from dptrain.privacy.newton_terms import TermClaims, predict_claims, reference_design, reference_statistics

__all__ = ["embed", "layer_weights", "linear_predictor", "model_parameters", "radius2", "reduce", "reduced_design",
           "reduced_to_terms", "term_intervals"]


def _blocks(enc: CoefficientEncoder) -> list[tuple[int, int]]:
    """(first column, number of levels + 1) of each categorical block in the encoded features."""
    out, j = [], len(enc.numeric)
    for _, levels in enc.categorical:
        out.append((j, len(levels) + 1))
        j += len(levels) + 1
    return out


def reduced_design(x: np.ndarray, enc: CoefficientEncoder) -> np.ndarray:
    """``z`` per row (module docstring): [1, numeric columns, non-reference level indicators], float64."""
    x = np.asarray(x)
    k = len(enc.numeric)
    z = np.empty((len(x), 1 + k + sum(width - 1 for _, width in _blocks(enc))), dtype=np.float64, order="F")
    z[:, 0] = 1.0
    z[:, 1:1 + k] = x[:, :k]
    j = 1 + k
    for start, width in _blocks(enc):
        z[:, j:j + width - 1] = x[:, start + 1:start + width]
        j += width - 1
    return z  # column-major: each column contiguous, so z.T is a row-major matrix (statistics' products)


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
    """(estimate, std_error, lower, upper, informative) of the coefficient table's terms, in the
    order of :func:`dptrain.inference.coefficients.table_terms` (multinomial: class-major, each
    class against the first): a term built from an uninformative parameter gets no interval. The
    interval is Student's t with the degrees of freedom of the term's noisy variance
    (:meth:`NewtonFit.degrees_of_freedom`; about 45 at N = 10,000 and epsilon 1, 130 at N = 25,000:
    the normal interval under-covered by about a point where the meat's noise is large)."""
    a, b = reduced_to_terms(enc)
    blocks = len(fit.estimate) // a.shape[1]  # K - 1 for a multinomial model, else 1
    a, b = np.kron(np.eye(blocks), a), np.tile(b, blocks)
    used = np.abs(a) > 0
    ok = ~np.any(used & ~fit.informative[None, :], axis=1)
    cov = np.where(np.isfinite(fit.covariance), fit.covariance, 0.0)
    est = a @ fit.estimate + b
    se = np.where(ok, np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", a, cov, a), 0.0)), np.nan)
    # here, not at the top: a run without intervals never imports scipy; scipy.special's t quantile
    # (stdtrit, what scipy.stats.t.ppf calls) imports in a quarter of scipy.stats' second
    from scipy.special import stdtrit

    q = stdtrit(fit.degrees_of_freedom(a), 0.5 + level / 2.0)  # the noisy meat's df (Satterthwaite)
    return est, se, est - q * se, est + q * se, ok


def quantile(level: float, dof: float | np.ndarray) -> float | np.ndarray:
    """The two-sided ``level`` quantile of Student's t with ``dof`` degrees of freedom (the normal
    one for an infinite ``dof``)."""
    from scipy.special import stdtrit  # here, not at the top: a run without intervals never imports scipy

    return stdtrit(dof, 0.5 + level / 2.0)


def model_parameters(weight: np.ndarray, bias: np.ndarray, enc: CoefficientEncoder) -> np.ndarray:
    """The reduced parameters of a linear layer (``weight`` (K, d), ``bias`` (K,)): one output's
    :func:`reduce`; a multinomial model's classes 1..K-1 against class 0, class-major."""
    rows = [reduce(float(bias[k]), weight[k], enc) for k in range(weight.shape[0])]
    if enc.kind != "multinomial":
        return rows[0]
    return np.concatenate([r - rows[0] for r in rows[1:]])


def layer_weights(theta: np.ndarray, enc: CoefficientEncoder, outputs: int) -> tuple[np.ndarray, np.ndarray]:
    """(bias (K,), weight (K, d)) of a linear layer with the reduced parameters ``theta``
    (multinomial: class 0's scores 0)."""
    p = len(theta) // max(outputs - 1, 1) if enc.kind == "multinomial" else len(theta)
    blocks = [np.zeros(p)] + [theta[k * p:(k + 1) * p] for k in range(outputs - 1)] if enc.kind == "multinomial" \
        else [theta]
    pairs = [embed(th, enc) for th in blocks]
    return np.array([b for b, _ in pairs]), np.stack([w for _, w in pairs])


#: rows per block of :func:`design_statistics` (a block's float64 design is about 5 MiB at 20 columns)
STATISTICS_BLOCK_ROWS = 1 << 15


def design_statistics(x: np.ndarray, y: np.ndarray, theta: np.ndarray, enc: CoefficientEncoder,
                      kind: str) -> tuple[np.ndarray, ...]:
    """(G, H, S) of :func:`dptrain.privacy.newton.statistics` at ``theta`` over the encoded rows
    ``x`` (float32, as trained on), summed over blocks of rows: each block's reduced design is
    built in float64 and dropped, so memory stays at one block whatever N (the whole design of 15
    million rows was 2.5 GB). The sums equal the whole-matrix products up to floating-point
    rounding in the order of summation."""
    total: tuple[np.ndarray, ...] | None = None
    for start, stop in row_blocks(len(x), STATISTICS_BLOCK_ROWS):
        z = reduced_design(x[start:stop], enc)
        part = statistics(z, y[start:stop], linear_predictor(z, theta, kind), kind)
        total = part if total is None else tuple(a + b for a, b in zip(total, part))
    if total is None:
        raise ValueError("design_statistics needs at least one row")
    return total


def linear_predictor(z: np.ndarray, theta: np.ndarray, kind: str) -> np.ndarray:
    """``eta`` for :func:`dptrain.privacy.newton.statistics`: z @ theta, or a multinomial model's
    (n, K) class scores (class 0's 0)."""
    if kind != "multinomial":
        return z @ theta
    scores = z @ theta.reshape(-1, z.shape[1]).T
    return np.concatenate([np.zeros((len(z), 1)), scores], axis=1)


def reference_moments(enc: CoefficientEncoder) -> np.ndarray:
    """E[z z'] of the reduced design of ``enc`` under the PUBLIC reference design
    (:func:`dptrain.privacy.newton_terms.reference_design`: numeric columns uniform over their
    bounds, declared levels equally likely, independent columns)."""
    return reference_design(len(enc.numeric), [len(levels) for _, levels in enc.categorical])


def outcome_from_loss(kind: str, loss: float) -> tuple[float, float] | None:
    """(w, r^2) of the reference design from a released mean training loss (a DP release: the dp/
    curve): binary, the p whose binary entropy is ``loss`` gives w = r^2 = p (1 - p) (a model's
    mean curvature is at most this, entropy and curvature being concave alike in p, and a loss above
    the optimum's gives more); linear, r^2 = 2 loss (the loss is 0.5 (z - y)^2 on the [0, 1]
    scale). None for a kind or loss it cannot read."""
    if not math.isfinite(loss):
        return None
    if kind == "binary":
        h = min(max(loss, 1e-6), math.log(2.0))
        lo, hi = 1e-12, 0.5
        for _ in range(60):  # binary entropy is increasing on (0, 1/2]
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if -(mid * math.log(mid) + (1 - mid) * math.log1p(-mid)) < h else (lo, mid)
        p = (lo + hi) / 2.0
        return p * (1 - p), p * (1 - p)
    if kind == "linear":
        return 1.0, min(max(2.0 * loss, 1e-6), 1.0)
    return None


def predicted_claims(enc: CoefficientEncoder, n: int, kind: str, sd: dict[str, float], *, classes: int = 2,
                     outcome: tuple[float, float] | None = None) -> TermClaims:
    """The plan (:func:`dptrain.privacy.newton_terms.predict_claims`) on the reference design of
    ``enc`` with ``n`` rows and the release's noise sds ``sd``: which of the table's terms the release
    could claim. Public inputs only."""
    h, s = reference_statistics(reference_moments(enc), n, kind, classes=classes, outcome=outcome)
    a, _ = reduced_to_terms(enc)
    if kind == "multinomial":
        a = np.kron(np.eye(classes - 1), a)
    return predict_claims(h, s, a, sd)
