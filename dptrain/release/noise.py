"""Floating-point-safe noise for releases (docs/release.md section 4).

Why not ``value + rng.laplace(0, scale)``: a floating-point Laplace sample is not a sample of the
real Laplace law. The set of doubles that ``fl(x + L)`` can take, and how often, depends on the
low-order bits of the true value ``x`` (Mironov 2012, "On significance of the least significant
bits for differential privacy"): two inputs that differ only below the noise scale give outputs
with visibly different supports, so an observer can tell them apart.

What this module does instead: every output is an integer multiple of a power-of-two grid step
``gamma`` and is a deterministic function of ONE integer, ``M + K``, where

    M = rint(value / gamma)        (the true value snapped to the grid; exact: gamma is 2^j)
    K = integer noise              (drawn independently of the value)
    output = fl(M + K) * gamma     (fl: IEEE rounding of the exact integer sum; * gamma is exact)

so the low-order bits of the output carry nothing about the true value beyond what ``M + K``
carries; the mechanism is a post-processing of an integer mechanism, and its privacy is that of
the integer mechanism.

Laplace (``kind="laplace"``): K is the discrete Laplace (two-sided geometric) law
P(K = k) proportional to exp(-|k| gamma / t), drawn as the difference of two i.i.d. geometric
variables with success probability p = 1 - exp(-gamma / t). Its variance is
gamma^2 * 2q / (1 - q)^2 with q = exp(-gamma / t), i.e. 2 t^2 - gamma^2 / 6 + O(gamma^4 / t^2).

Privacy of the grid (stated exactly). For neighbouring data sets with |value - value'| <= Delta,
|M - M'| <= Delta / gamma + 1 (rounding each side moves it by at most gamma / 2), and the
discrete Laplace with parameter t gives a privacy loss of at most |M - M'| gamma / t. Hence:

    the grid mechanism with scale t and step gamma is epsilon-DP with epsilon = (Delta + gamma) / t.

For a target epsilon use :func:`calibrate`: it picks gamma = grid_step(Delta / epsilon) and
inflates the scale to t = (Delta + gamma) / epsilon (relative inflation gamma / Delta
<= 2^-GRID_BITS / epsilon, 1e-6 at epsilon = 1). Where the statistic moves by exact multiples of
the grid (a count, step 1) there is no rounding and no inflation: t = Delta / epsilon.

Grid step: grid_step(s) = 2^(floor(log2 s) - GRID_BITS), GRID_BITS = 20, so
gamma in (s 2^-21, s 2^-20]. Why 20: the snapping error |value - M gamma| <= gamma / 2 is at most
~5e-7 of the noise scale (invisible next to the noise), the privacy inflation above is 1e-6
relative at epsilon = 1, and the integers stay small: |K| ~ t / gamma ~ 2^20, far below 2^53, so
K and, for |value| / s below ~2^32, M + K are exact in float64 (beyond that the IEEE sum is
still a function of the exact integer M + K, so the argument above is unchanged).

Normal (``kind="normal"``, the Stata guide's default): the same variance 2 t^2, drawn as a
rounded Gaussian: K = rint(sigma Z / gamma) with sigma = sqrt(2) t, Z ~ N(0, 1). Since M is an
integer, M + rint(W) = rint(M + W): this is a post-processing of the continuous Gaussian
mechanism applied to the snapped value, with sensitivity <= Delta + gamma. It has NO pure
epsilon-DP meaning (Gaussian noise gives at best (epsilon, delta) guarantees); the epsilon that
the release reports for it is nominal only.

Residual floating point: numpy draws geometric and normal variables in floating point (the
geometric by inverting an exponential draw), so their probabilities match the ideal integer laws
only up to double rounding. That error does not depend on the true value (the support is the
integer grid whatever the value), so it cannot create the Mironov leak; a bit-exact integer
sampler (Canonne, Kamath, Steinke 2020) would remove even the probability rounding.

Randomness: every function takes a numpy ``Generator``. A release run draws them from
:class:`dptrain.privacy.randomness.Randomness` (OS CSPRNG by default, one stream per method);
:func:`make_rng` serves the Python API (CSPRNG, or a caller's seed that no output echoes).
"""

from __future__ import annotations

import secrets

import numpy as np

from .cells import ReleaseError

GRID_BITS = 20
NOISE_KINDS: tuple[str, ...] = ("laplace", "normal")


def make_rng(seed: int | None) -> tuple[np.random.Generator, str]:
    """A numpy Generator and a sentence saying how it was seeded (never the seed itself).

    For the Python API only; a release run (task=release) takes its streams from
    :class:`dptrain.privacy.randomness.Randomness`. ``seed=None``: PCG64 seeded with 256 bits from
    the OS CSPRNG (``secrets``); otherwise a reproducible PCG64 seeded with ``seed`` (a
    non-negative int, all its bits kept by numpy's SeedSequence): whoever knows that seed can
    regenerate the noise and remove it.
    """
    if seed is None:
        return (np.random.Generator(np.random.PCG64(secrets.randbits(256))),
                "numpy PCG64 seeded from the OS CSPRNG (secrets), 256 bits, fresh for this call")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise ReleaseError(f"seed={seed!r} is not allowed: a non-negative integer, or None for a CSPRNG seed")
    return (np.random.Generator(np.random.PCG64(int(seed))),
            ("numpy PCG64 seeded by the caller (REPRODUCIBLE: whoever knows the seed can regenerate and remove "
             "the noise; keep it secret, not for production releases)"))


def grid_step(scale: np.ndarray | float) -> np.ndarray:
    """The grid step for noise of scale ``scale``: 2^(floor(log2 scale) - GRID_BITS), an exact
    power of two in (scale 2^-21, scale 2^-20]. NaN where scale is not finite and > 0."""
    s = np.asarray(scale, dtype=np.float64)
    ok = np.isfinite(s) & (s > 0)
    _, e = np.frexp(np.where(ok, s, 1.0))  # s = m 2^e with m in [0.5, 1): floor(log2 s) = e - 1
    step = np.ldexp(1.0, (e - 1 - GRID_BITS).astype(np.int32))
    if np.any(ok & (step <= 0)):
        raise ReleaseError("release.noise: a noise scale is too small for a float64 grid (below ~1e-300)")
    return np.where(ok, step, np.nan)


def calibrate(sensitivity: np.ndarray | float, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """(scale t, grid step gamma) that make the grid Laplace epsilon-DP for a statistic of the given
    sensitivity Delta: gamma = grid_step(Delta / epsilon), t = (Delta + gamma) / epsilon.
    Infinite or NaN sensitivity gives t = +inf (the value will come out NaN)."""
    d = np.asarray(sensitivity, dtype=np.float64)
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ReleaseError(f"release.epsilon_per_statistic={epsilon!r} is not allowed: a finite number > 0")
    bad = ~np.isfinite(d)
    dd = np.where(bad, 0.0, d)
    if np.any(dd < 0):
        raise ReleaseError("release.noise: a sensitivity is negative")
    nominal = dd / epsilon
    pos = nominal > 0
    step = grid_step(nominal)  # NaN where the sensitivity is 0 (no noise needed)
    scale = np.where(pos, (dd + np.where(pos, step, 0.0)) / epsilon, 0.0)
    scale = np.where(bad, np.inf, scale)
    return scale, step


def _check_kind(kind: str) -> None:
    if kind not in NOISE_KINDS:
        raise ReleaseError(f"release.noise={kind!r} is not allowed: one of {list(NOISE_KINDS)}")


def _integer_noise(t: np.ndarray, step: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """K (float64 holding integers) with the law of ``kind`` for scale t on grid step, one per
    element. Elements with t not finite and > 0 get a dummy draw (callers mask them), so the
    number of draws does not depend on which elements are valid."""
    ok = np.isfinite(t) & (t > 0) & np.isfinite(step) & (step > 0)
    ratio = np.where(ok, step / np.where(ok, t, 1.0), 1.0)  # gamma / t
    if kind == "laplace":
        p = -np.expm1(-ratio)  # 1 - exp(-gamma / t), accurate for small ratios
        k = rng.geometric(p) - rng.geometric(p)  # int64: two-sided geometric
        return k.astype(np.float64)
    sigma_steps = np.sqrt(2.0) / ratio  # sigma / gamma, sigma = sqrt(2) t: same variance as Laplace
    return np.rint(rng.standard_normal(t.shape) * sigma_steps)


def laplace_noise(scale: np.ndarray | float, *, size: int, rng: np.random.Generator,
                  step: np.ndarray | float | None = None) -> np.ndarray:
    """``size`` discrete Laplace noise values (not added to anything): gamma K with
    P(K = k) proportional to exp(-|k| gamma / scale), gamma = ``step`` or grid_step(scale).
    Every value is an exact multiple of gamma. NaN where scale is +inf."""
    t = np.broadcast_to(np.asarray(scale, dtype=np.float64), (int(size),)).copy()
    if np.any(np.isnan(t) | (t < 0)):
        raise ReleaseError("release.noise: a noise scale is NaN or negative")
    g = grid_step(t) if step is None else np.broadcast_to(np.asarray(step, dtype=np.float64), t.shape)
    k = _integer_noise(t, g, "laplace", rng)
    out = k * g
    out = np.where(t == 0, 0.0, out)
    return np.where(np.isinf(t), np.nan, out)


def add_noise(values: np.ndarray, scale: np.ndarray | float, *, kind: str, rng: np.random.Generator,
              step: np.ndarray | float | None = None) -> np.ndarray:
    """Snap each value to its grid and add grid-aligned noise of scale ``scale`` (per element).

    kind: "laplace" (discrete Laplace, P(K = k) ~ exp(-|k| gamma / scale): epsilon-DP with
    epsilon = (Delta + gamma) / scale for sensitivity Delta) or "normal" (rounded Gaussian with
    variance 2 scale^2: no pure-epsilon meaning). ``step`` overrides the grid (default
    grid_step(scale); pass the step from :func:`calibrate`, or 1 for integer counts).
    NaN values stay NaN; +inf scale gives NaN; scale 0 returns the value unchanged (no noise).
    One draw per element whatever the values, so a seed reproduces the whole release.
    """
    _check_kind(kind)
    v = np.asarray(values, dtype=np.float64)
    t = np.broadcast_to(np.asarray(scale, dtype=np.float64), v.shape).copy()
    if np.any(np.isnan(t) | (t < 0)):
        raise ReleaseError("release.noise: a noise scale is NaN or negative")
    g = grid_step(t) if step is None else np.broadcast_to(np.asarray(step, dtype=np.float64), v.shape).copy()
    live = np.isfinite(t) & (t > 0)
    if np.any(live & ~(np.isfinite(g) & (g > 0))):
        raise ReleaseError("release.noise: a grid step is not a finite number > 0")
    if step is not None:  # a step must be a power of two for M = rint(v / gamma) and M gamma to be exact
        _, e = np.frexp(np.where(live, g, 1.0))
        if np.any(live & (np.where(live, g, 1.0) != np.ldexp(0.5, e))):
            raise ReleaseError("release.noise: a grid step is not a power of two")
    k = _integer_noise(t, g, kind, rng)
    with np.errstate(invalid="ignore"):
        gs = np.where(live, g, 1.0)
        m = np.rint(v / gs)  # exact: gs is a power of two
        out = (m + k) * gs  # IEEE sum of two integers, then an exact power-of-two scaling
    out = np.where(t == 0, v, out)
    out = np.where(np.isinf(t) | np.isnan(v), np.nan, out)
    return out
