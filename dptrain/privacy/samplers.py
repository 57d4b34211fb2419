"""Exact integer noise for the one-shot table releases: the discrete Laplace and the discrete
Gaussian laws, drawn by OpenDP's samplers (``opendp``, the field's floating-point-safe reference:
integer arithmetic and exact Bernoulli trials, no floating-point Laplace or Gaussian draw whose low
bits could depend on the true count; Canonne, Kamath and Steinke 2020).

* discrete Laplace with scale b: P(K = k) = (1 - q) / (1 + q) q^|k|, q = exp(-1 / b). Added to a
  vector of counts whose L1 sensitivity is D (add or remove one row: D = 1 per marginal), it is
  (D / b)-DP (pure).
* discrete Gaussian with scale sigma: P(K = k) proportional to exp(-k^2 / (2 sigma^2)). Added to
  counts of L2 sensitivity D it is (D^2 / (2 sigma^2))-zCDP (the continuous Gaussian's bound,
  which the discrete law meets exactly), accounted as a ``zcdp`` event (RDP).

The samplers draw from OpenDP's own CSPRNG (the operating system's): a run's noise key
(``privacy.noise_seed_file``) cannot reproduce them, and the tasks that use them refuse one.
:func:`pmf_discrete_laplace` and :func:`pmf_discrete_gaussian` give the exact laws for the tests.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["discrete_gaussian", "discrete_laplace", "pmf_discrete_gaussian", "pmf_discrete_laplace"]


def _opendp():
    import opendp.prelude as dp  # here, not at the top: only the table releases need OpenDP (~1 s)

    dp.enable_features("contrib")
    return dp


def _counts(values: np.ndarray) -> list[int]:
    arr = np.asarray(values)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("exact integer noise is added to integer counts only")
    return [int(v) for v in arr.reshape(-1)]


def _add_noise(counts: np.ndarray, scale: float, *, law: str) -> np.ndarray:
    """``counts`` (integers) plus i.i.d. noise of OpenDP's exact ``law`` (laplace: L1 metric,
    gaussian: L2) with scale ``scale``; same shape, int64."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"discrete {law} scale must be a finite number > 0, got {scale!r}")
    dp = _opendp()
    arr = np.asarray(counts)
    space = dp.vector_domain(dp.atom_domain(T=int))
    meas = (dp.m.make_laplace(space, dp.l1_distance(T=int), scale=float(scale)) if law == "laplace" else
            dp.m.make_gaussian(space, dp.l2_distance(T=int), scale=float(scale)))
    return np.asarray(meas(_counts(arr)), dtype=np.int64).reshape(arr.shape)


def discrete_laplace(counts: np.ndarray, scale: float) -> np.ndarray:
    """``counts`` (integers) plus i.i.d. discrete Laplace noise of scale ``scale`` (OpenDP's exact
    sampler); same shape, int64."""
    return _add_noise(counts, scale, law="laplace")


def discrete_gaussian(counts: np.ndarray, sigma: float) -> np.ndarray:
    """``counts`` (integers) plus i.i.d. discrete Gaussian noise of scale ``sigma`` (OpenDP's exact
    sampler); same shape, int64."""
    return _add_noise(counts, sigma, law="gaussian")


def pmf_discrete_laplace(k: np.ndarray, scale: float) -> np.ndarray:
    """The exact law of the discrete Laplace with scale ``scale`` at the integers ``k``."""
    q = math.exp(-1.0 / scale)
    return (1.0 - q) / (1.0 + q) * q ** np.abs(np.asarray(k, dtype=np.float64))


def pmf_discrete_gaussian(k: np.ndarray, sigma: float) -> np.ndarray:
    """The exact law of the discrete Gaussian with scale ``sigma`` at the integers ``k`` (its
    normaliser summed over |k| <= 40 sigma + 40: the rest is below 1e-300)."""
    span = int(40 * sigma) + 40
    support = np.arange(-span, span + 1, dtype=np.float64)
    norm = float(np.sum(np.exp(-support**2 / (2.0 * sigma**2))))
    return np.exp(-np.asarray(k, dtype=np.float64) ** 2 / (2.0 * sigma**2)) / norm
