"""Noisy sufficient statistics for linear regression (``estimator=ssp``): Wang 2018 (AdaSSP)
for the estimate, Ferrando, Wang & Sheldon 2022 (parametric bootstrap) for the interval.

With the public schema every encoded row lies in a known box: numeric features in [0, 1], each
categorical block one-hot (one entry 1), the target scaled to [0, 1] by its public bounds. Each
row ``z = (1, x, y)`` is centred at a public point ``m`` (:func:`centre`) and the mechanism
releases ``S = C'C`` of the centred rows ``c = z - m`` (it holds N, the centred column sums and
cross-products) plus symmetric Gaussian noise: each entry on and above the diagonal gets an
independent N(0, (s Delta)^2), mirrored below. Adding or removing one row changes S by ``c c'``,
whose upper triangle has L2 norm at most ``Delta = sqrt((||c||^4 + sum_i c_i^4) / 2)`` at the
worst corner of the box (:func:`sensitivity`; the report states it in words with its numbers,
:func:`sensitivity_rule`): this is the Gaussian mechanism with L2 sensitivity Delta and
noise multiplier s, ONE ``GaussianDpEvent(s)`` (add/remove neighbours), s calibrated to
``privacy.target_epsilon`` by the run's accountant (:func:`calibrate`).

Everything after the release is post-processing of S (no privacy spent): the OLS solve on the
reference-coded design (the reference level's column dropped: the one-hot blocks and the
intercept are collinear) with a spectral floor computed from the RELEASED matrix: every
eigenvalue of the noisy Gram matrix below the noise level ``2 s Delta sqrt(p)`` (the expected
spectral norm of the noise matrix) is lifted to it. This is AdaSSP's ridge (which adds
``max(0, noise level - lambda_min)`` to EVERY eigenvalue) applied only in the directions the
noise swamps (an empty category, a constant column); well-determined directions are not shrunk,
so the estimate has no ridge bias there and none at all when N is large. Then the parametric bootstrap: the
noisy statistics are simulated again from the estimate (fixed design ``Q``, residual variance
from the noisy y'y, the mechanism's own noise), the estimator reapplied, and the basic
bootstrap interval ``[t - q_hi(t* - t), t - q_lo(t* - t)]`` formed per term. It includes the
sampling noise and the privacy noise (and the ridge's bias, to first order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dptrain.core.validation import ConfigError
from dptrain.inference.coefficients import CoefficientEncoder, coefficient_map, coefficient_offset
from dptrain.inference.intervals import Interval
from dptrain.privacy.accounting import DEFAULT, PrivacyLedger
from dptrain.privacy.calibration import Unreachable, smallest_noise
from dptrain.privacy.events import gaussian_event  # noqa: F401 - offered here as before

__all__ = ["SSPFit", "calibrate", "gaussian_event", "kept_columns", "release", "sensitivity", "sensitivity_rule",
           "ssp_estimate", "target_weight"]


def _feature_sums(enc: CoefficientEncoder) -> tuple[float, float]:
    """(||c_x||^2, sum_i c_i^4) of the centred intercept and features at the worst corner."""
    sq, quart = 1.0 + 0.25 * len(enc.numeric), 1.0 + 0.0625 * len(enc.numeric)
    for _, levels in enc.categorical:
        k = len(levels) + 1
        sq += (1 - 1 / k) ** 2 + (k - 1) / k**2
        quart += (1 - 1 / k) ** 4 + (k - 1) / k**4
    return sq, quart


def target_weight(enc: CoefficientEncoder) -> float:
    """k: the target enters the release scaled to [0, k] (PUBLIC: the schema's shape only). The
    slopes' noise comes mostly from the noise on X'y, whose share of the release grows with k
    while the sensitivity grows more slowly: per unit of the target, the noise on X'y is
    ``Delta(k) / k``, smallest at ``k = (8 (S^2 + Q))^(1/4)`` (S, Q: :func:`_feature_sums`). For an
    intercept and two numeric columns k = 2.28 and X'y's noise is 31% lower than with k = 1; the
    regression is the same (every estimate and bootstrap draw is divided by k)."""
    sq, quart = _feature_sums(enc)
    return float((8.0 * (sq**2 + quart)) ** 0.25)


def centre(enc: CoefficientEncoder) -> np.ndarray:
    """The PUBLIC centre ``m`` subtracted from every encoded row before the release, over
    z = (1, x, k y): 0 for the intercept, 1/2 for each numeric column (in [0, 1]), k/2 for the
    target (scaled to [0, k], :func:`target_weight`), 1/(L + 1) for each column of a categorical
    block of L declared levels plus ``<other>`` (one-hot). Centring shrinks the largest row, hence
    the noise, about threefold; it is a reparametrisation of the same regression (the slopes are
    unchanged, the intercept moves by a known amount), so it costs nothing in the estimate."""
    m = [0.0] + [0.5] * len(enc.numeric)
    for _, levels in enc.categorical:
        m += [1.0 / (len(levels) + 1)] * (len(levels) + 1)
    return np.asarray(m + [0.5 * target_weight(enc)])


def _corner_sums(enc: CoefficientEncoder) -> tuple[float, float]:
    """(||c||^2, sum_i c_i^4) at the worst corner of the centred box (:func:`sensitivity`)."""
    sq, quart = _feature_sums(enc)
    k = target_weight(enc)
    return sq + 0.25 * k**2, quart + 0.0625 * k**4


def sensitivity(enc: CoefficientEncoder) -> float:
    """Delta: the largest L2 norm of the upper triangle (diagonal included) of ``c c'`` over the
    centred rows ``c = z - m`` (:func:`centre`), i.e. of the change of the released entries when
    one row is added or removed: ``sqrt((||c||^4 + sum_i c_i^4) / 2)``. Both sums are largest at the
    same corner of the box (each numeric column and the target at a bound, any level), where
    ``c_i^2`` is 1 (intercept), 1/4 (numeric), k^2 / 4 (the target on [0, k]: :func:`target_weight`)
    and, for a block of L + 1 one-hot columns, ``(1 - 1/(L+1))^2`` once and ``1/(L+1)^2`` L times."""
    sq, quart = _corner_sums(enc)
    return float(math.sqrt((sq**2 + quart) / 2))


def sensitivity_rule(enc: CoefficientEncoder) -> str:
    """The report's words for :func:`sensitivity`, with its numbers for this encoder."""
    sq, quart = _corner_sums(enc)
    return ("L2 sensitivity of the upper triangle (diagonal included) of C'C under add/remove of one row, where "
            "each row z = (1, x, k y) is CENTRED at the public point m before the release (c = z - m; m: 0 for the "
            "intercept, 1/2 for each numeric column, k/2 for the target, 1/(L+1) for each column of a one-hot block "
            "of L declared levels plus <other>; numeric features scaled to [0, 1] and the target to [0, k] by their "
            f"PUBLIC bounds, k = {target_weight(enc):.6g} from the schema's shape): one row changes the upper "
            "triangle by that of c c', of L2 norm sqrt((||c||^4 + sum_i c_i^4) / 2), largest at a corner of the "
            "box, where ||c||^2 = 1 (intercept) + 1/4 per numeric column + k^2/4 (target) + (1 - 1/j)^2 + "
            "(j - 1)/j^2 per one-hot block of j columns "
            f"= {sq:.6g} and sum_i c_i^4 = {quart:.6g}: Delta = {math.sqrt((sq**2 + quart) / 2):.6g} "
            "(not the uncentred bound ||z||^2)")


def calibrate(*, target_epsilon: float, delta: float, accountant: str = DEFAULT.name, rtol: float = 1e-4) -> float:
    """The smallest noise multiplier s in [1e-3, 1e7] (to relative ``rtol``) whose epsilon (by ``accountant``)
    is <= the target: :func:`dptrain.privacy.calibration.smallest_noise`."""
    def eps(s: float) -> float:
        acc = PrivacyLedger()
        acc.record(gaussian_event(s))
        return acc.get_epsilon(delta=delta, accountant=accountant)

    try:
        return smallest_noise(eps, target=target_epsilon, rtol=rtol, lower=1e-3, upper=1e7, factor=2.0)
    except Unreachable:
        raise ValueError(f"privacy.target_epsilon={target_epsilon!r} needs a noise multiplier above 1e7") from None


def kept_columns(enc: CoefficientEncoder) -> np.ndarray:
    """Indices into z = (1, x, y) of the reference-coded design: the intercept, every numeric
    column and every categorical column but its first declared level."""
    cols, j = [0], 1
    for _ in enc.numeric:
        cols.append(j)
        j += 1
    for _, levels in enc.categorical:
        cols += list(range(j + 1, j + len(levels) + 1))
        j += len(levels) + 1
    return np.asarray(cols)


def _symmetric_noise(rng: np.random.Generator, p: int, std: float, size: tuple[int, ...] = ()) -> np.ndarray:
    e = rng.normal(0.0, std, size=(*size, p, p))
    upper = np.triu(e)
    return upper + np.swapaxes(np.triu(e, 1), -1, -2)


def release(x: np.ndarray, y: np.ndarray, *, noise_std: float, rng: np.random.Generator,
            centre_at: np.ndarray | None = None) -> np.ndarray:
    """The mechanism: C'C of the rows c = (1, x, y) - ``centre_at`` (:func:`centre`; none: 0)
    plus symmetric Gaussian noise of std ``noise_std``."""
    z = np.concatenate([np.ones((len(x), 1)), np.asarray(x, np.float64), np.asarray(y, np.float64)[:, None]], 1)
    if centre_at is not None:
        z -= centre_at
    return z.T @ z + _symmetric_noise(rng, z.shape[1], noise_std)


def _floor(a: np.ndarray, noise_std: float) -> np.ndarray:
    """Per matrix of ``a`` (..., p, p): its eigenvalues below the noise level ``2 noise_std
    sqrt(p)`` (the expected spectral norm of the noise matrix) lifted to that level, the rest
    unchanged (a ridge only in the directions the noise swamps; none when N is large)."""
    tau = 2 * noise_std * math.sqrt(a.shape[-1])
    mu, v = np.linalg.eigh(a)
    return (v * np.maximum(mu, tau)[..., None, :]) @ np.swapaxes(v, -1, -2)


def _solve(a: np.ndarray, b: np.ndarray, noise_std: float) -> np.ndarray:
    return np.linalg.solve(_floor(a, noise_std), b[..., None])[..., 0]


@dataclass(frozen=True)
class SSPFit:
    """The estimate (bias, full weight vector on the encoded features), the original-scale terms
    and their interval, and the mechanism's numbers."""

    bias: float
    weight: np.ndarray
    interval: Interval
    noise_multiplier: float
    sensitivity: float
    sensitivity_rule: str = ""  # the report's words for the sensitivity used (:func:`sensitivity_rule`)


def _bootstrap(a: np.ndarray, b: np.ndarray, yy: float, theta: np.ndarray, *, noise_std: float,
               draws: int, rng: np.random.Generator) -> np.ndarray:
    """``draws`` parametric-bootstrap replicates of theta (reference-coded, scaled space)."""
    p = len(theta)
    q = _floor(a, noise_std)
    n_hat = max(a[0, 0], p + 2.0)
    resid = max((yy - 2 * theta @ b + theta @ a @ theta) / (n_hat - p), 1e-12)
    chol = np.linalg.cholesky(resid * q)
    a_star = q + _symmetric_noise(rng, p, noise_std, (draws,))
    b_star = q @ theta + rng.standard_normal((draws, p)) @ chol.T + rng.normal(0.0, noise_std, (draws, p))
    return _solve(a_star, b_star, noise_std)


def ssp_estimate(x: np.ndarray, y: np.ndarray, enc: CoefficientEncoder, *, noise_multiplier: float,
                 level: float = 0.95, draws: int = 2000, rng: np.random.Generator) -> SSPFit:
    """Release the noisy statistics of the rows (x encoded, y scaled to [0, 1]), solve, and
    bootstrap the interval of every original-scale term (module docstring). ``rng`` must be
    SECRET (the run's randomness): it draws the privacy noise."""
    delta_s = sensitivity(enc)
    std = noise_multiplier * delta_s
    m, k = centre(enc), target_weight(enc)
    s = release(x, k * np.asarray(y, dtype=np.float64), noise_std=std, rng=rng, centre_at=m)
    cols, ycol = kept_columns(enc), s.shape[0] - 1
    a, b, yy = s[np.ix_(cols, cols)], s[cols, ycol], s[ycol, ycol]
    # the regression of the centred target on (1, centred kept columns): same slopes as on the
    # raw columns; the raw intercept is the centred one + m_y - sum_j slope_j m_j
    shift = np.zeros((len(cols), len(cols)))
    shift[0] = -m[cols]
    uncentre = np.eye(len(cols)) + shift
    offset = np.zeros(len(cols))
    offset[0] = m[ycol]
    theta_c = _solve(a, b, std)
    theta = (uncentre @ theta_c + offset) / k  # the regression of k y, divided by k
    boot = (_bootstrap(a, b, yy, theta_c, noise_std=std, draws=draws, rng=rng) @ uncentre.T + offset) / k
    full = np.zeros(s.shape[0] - 1)  # (bias, weights) with the reference levels' weights 0
    full[cols] = theta
    cmap = coefficient_map(enc)

    def terms(t: np.ndarray) -> np.ndarray:
        v = np.zeros((*t.shape[:-1], s.shape[0] - 1))
        v[..., cols] = t
        return v @ cmap.T

    est, dev = terms(theta) + coefficient_offset(enc), terms(boot) - terms(theta)
    alpha = 1 - level
    lo_q, hi_q = np.quantile(dev, [alpha / 2, 1 - alpha / 2], axis=0)
    interval = Interval(est, dev.std(axis=0, ddof=1), est - hi_q, est - lo_q, level)
    return SSPFit(float(full[0]), full[1:], interval, float(noise_multiplier), delta_s, sensitivity_rule(enc))


def ssp_config_check(enc: CoefficientEncoder) -> None:
    """ssp needs a continuous target with public bounds (its sensitivity assumes y in [0, 1])."""
    if enc.kind != "linear" or enc.target_scale is None:
        raise ConfigError("estimator=ssp is not allowed without data.target_bounds: its sensitivity needs the "
                          "target clipped into PUBLIC bounds; allowed: declare data.target_bounds=[lower, upper]")


def describe(fit: SSPFit, *, epsilon: float, delta: float, accountant: str) -> dict[str, Any]:
    """The estimator's part of the privacy report."""
    return {
        "mechanism": "Gaussian mechanism on the sufficient statistics C'C of the centred rows c = (1, x, y) - m "
        "(one release)",
        "sensitivity": fit.sensitivity,
        "sensitivity_rule": fit.sensitivity_rule,
        "noise_multiplier": fit.noise_multiplier,
        "noise_std": fit.noise_multiplier * fit.sensitivity,
        "event": f"GaussianDpEvent({fit.noise_multiplier:.6g}), once",
        "guarantee": f"({epsilon:.4g}, {delta:.3g})-DP, example-level, add/remove-one-record neighbours, for the "
        "released noisy statistics and everything computed from them: the coefficients, their bootstrap "
        f"intervals and model.pt (accountant: {accountant}; the bootstrap reuses the released statistics only)",
    }
