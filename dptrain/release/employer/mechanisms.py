"""Per-cell count mechanisms for employer-employee statistics (issue 34) under (alpha, epsilon)-ER-EE.

A cell (place x industry x ownership, ...) has total employment n = sum_e x_e over its
establishments. Strong alpha-neighbours D, D' differ in ONE establishment whose size x (in D) and
x' (in D') satisfy x <= x' <= max((1 + alpha) x, x + 1); adding or removing one job is the case
x' = x + 1. An establishment's existence, industry, location and coarse size are public. A
mechanism M is (alpha, epsilon)-ER-EE private when Pr[M(D) in S] <= e^epsilon Pr[M(D') in S] for
every S and every strong alpha-neighbours in both directions (``Neighbours.ER_EE``).

The relation's one sensitivity rule, :func:`max_change`: a cell's total moves by at most
max(alpha x, 1) when its establishment of size x changes. Every mechanism here uses it:

* :func:`laplace_worker`: worker-level add/remove DP (Laplace(1/epsilon)); does NOT protect an
  establishment's size (``scripts/lodes_attack.py`` recovers it to within a worker or two).
* :func:`employer_laplace`: employer-level DP with a public size cap (Laplace(cap/epsilon)).
* :func:`log_laplace`: Laplace noise on ln(n + 1/alpha); pure (alpha, epsilon)-ER-EE; biased
  upwards (:func:`log_laplace_unbiased` corrects it).
* :func:`smooth_laplace` / :func:`smooth_gamma`: noise scaled to the beta-smooth sensitivity
  (:func:`smooth_sensitivity`) of the total under strong alpha-neighbours; unbiased.
* :func:`smooth_median`: the Nissim-Raskhodnikova-Smith median (replace-one neighbours).

Noise: worker- and employer-level Laplace draw OpenDP's exact discrete Laplace on the integer
counts (no floating-point Laplace whose low bits could carry the count: Mironov 2012); log-Laplace
adds the grid Laplace of :mod:`dptrain.release.noise` to ln(n + gamma) (a function of one integer,
its scale inflated by the grid's step so that epsilon holds exactly); the smooth mechanisms' scale
depends on the private smooth sensitivity, so their noise is continuous, and their output is rounded
onto a grid whose step depends only on PUBLIC quantities (:func:`smooth_grid_step`: epsilon, delta
and the fact S >= 1): output = step (n / step + rint(W / step)), W the noise, n / step an exact
integer. That equals step rint((n + W) / step), a post-processing of the real-valued mechanism
n + W, so the privacy proof is the real-arithmetic one, and the output's low-order bits are those of
an integer on a public grid, whatever n (Mironov's attack needs a support that moves with n). The
median snaps the values to its public grid first (a per-row map: neighbours stay neighbours).

Intervals (``*_interval``): 95% (``level``) intervals for the true count given the release. For
the smooth mechanisms the noise scale depends on the private largest establishment, so an
interval built from it (or from anything computed from the private sizes, such as the size class
of the cell's largest establishment) would publish it: the width alone would name it. The
``*_interval_public`` functions (:mod:`dptrain.release.employer.intervals`) use public quantities
only: the release y, the settings and the public largest size M. The largest establishment is at
most min(n, M) (a cell's total includes it), S grows with it, so the true n lies, with probability
at least ``level``, in the set of counts m with |y - m| <= c S(min(m, M)) + half the grid step (c
the noise law's quantile per unit of S); the interval is that set's hull. It is a function of the
release (post-processing: no privacy cost), conservative, and wide where a cell's total could be
one establishment (it then is as wide as that establishment's noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dptrain.privacy.samplers import discrete_laplace
from dptrain.release.noise import add_noise, calibrate, grid_step

QUARTIC_NORM = math.pi / math.sqrt(2.0)  # integral of 1 / (1 + z^4) over the real line
QUARTIC_ENVELOPE = 1.0 / (2.0 * math.sqrt(2.0) - 2.0)  # max (1 + z^2) / (1 + z^4), at z^2 = sqrt 2 - 1
QUARTIC_GAMMA = 4.0  # the exponent of the heavy-tailed admissible density 1 / (1 + |z|^gamma)


def _positive(**values: float) -> None:
    for name, v in values.items():
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name}={v!r} must be positive and finite")


def _counts(n) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    if np.any(n < 0) or not np.all(np.isfinite(n)):
        raise ValueError("counts must be finite and non-negative")
    return n


def _integer_counts(n) -> np.ndarray:
    n = _counts(n)
    if np.any(n != np.rint(n)):
        raise ValueError("the count mechanisms release integer counts (a cell total is a whole number of jobs)")
    return np.rint(n).astype(np.int64)


def _discrete_laplace_half_width(scale: float, level: float) -> float:
    """The least integer m with P(|K| <= m) >= level for K discrete Laplace of scale ``scale``:
    P(|K| > m) = 2 q^(m + 1) / (1 + q), q = exp(-1 / scale)."""
    q = math.exp(-1.0 / scale)
    m = max(0, math.ceil(math.log((1.0 - level) * (1.0 + q) / 2.0) / math.log(q)) - 1)
    while 2.0 * q ** (m + 1) / (1.0 + q) > 1.0 - level:
        m += 1
    while m > 0 and 2.0 * q**m / (1.0 + q) <= 1.0 - level:
        m -= 1
    return float(m)


def _laplace_half_width(scale: float, level: float) -> float:
    """t with P(|Laplace(scale)| <= t) = level: t = scale ln(1 / (1 - level))."""
    return scale * math.log(1.0 / (1.0 - level))


# ------------------------------------------------------------------ the relation's sensitivity rule
def max_change(x, alpha: float) -> np.ndarray:
    """The most a cell's total moves when one establishment of size ``x`` changes under strong
    alpha-neighbours: max((1 + alpha) x, x + 1) - x = max(alpha x, 1). (Going down from x, to
    x'' with x <= max((1 + alpha) x'', x'' + 1), the move is at most max(alpha x'', 1) <= this.)"""
    return np.maximum(alpha * np.asarray(x, dtype=float), 1.0)


# ------------------------------------------------------------------ worker- and employer-level Laplace
def laplace_worker(n, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Worker-level add/remove DP: n + discrete Laplace(1/epsilon) (one job moves a count by 1;
    OpenDP's exact sampler: ``rng`` is not used). Unbiased.
    It does NOT protect an establishment's size: a change x -> (1 + alpha) x moves n by alpha x,
    so its privacy loss is alpha x epsilon, unbounded in x."""
    _positive(epsilon=epsilon)
    return discrete_laplace(_integer_counts(n), 1.0 / epsilon).astype(float)


def laplace_worker_interval(released, epsilon: float, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``level`` interval for n: released -/+ m, m the discrete Laplace's least half-width with
    coverage >= level (exact law; at least ``level``, the integer steps make it a little more)."""
    t = _discrete_laplace_half_width(1.0 / epsilon, level)
    released = np.asarray(released, dtype=float)
    return released - t, released + t


def employer_laplace(n, max_size: float, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Employer-level DP (add/remove one establishment) with a PUBLIC integer size cap: n + discrete
    Laplace(cap / epsilon) (OpenDP's exact sampler: ``rng`` is not used). ``n`` must be the sum of
    sizes clipped at ``max_size`` (the caller clips; clipping biases n downwards by the mass above
    the cap); given that, the release is unbiased. The
    baseline that destroys utility: the noise is of the order of the largest establishment."""
    _positive(epsilon=epsilon, max_size=max_size)
    return discrete_laplace(_integer_counts(n), max_size / epsilon).astype(float)


def employer_laplace_interval(released, max_size: float, epsilon: float,
                              level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``level`` interval for the clipped n (the discrete Laplace's, as :func:`laplace_worker_interval`)."""
    t = _discrete_laplace_half_width(max_size / epsilon, level)
    released = np.asarray(released, dtype=float)
    return released - t, released + t


# ------------------------------------------------------------------ log-Laplace
def log_laplace_scale(alpha: float, epsilon: float) -> float:
    """b = ln(1 + alpha) / epsilon. With gamma = 1/alpha, l = ln(n + gamma) moves by at most
    ln(1 + alpha): n' - n <= max_change(x) = max(alpha x, 1) <= alpha n + 1 = (1 + alpha)(n + gamma)
    - (n + gamma), because x <= n and 1 <= alpha n + 1 (the +1 case, x < gamma, included: (n + 1 +
    gamma)/(n + gamma) <= 1 + alpha since n + gamma >= gamma = 1/alpha)."""
    _positive(alpha=alpha, epsilon=epsilon)
    return math.log1p(alpha) / epsilon


def log_laplace(n, alpha: float, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """exp(ln(n + gamma) + eta) - gamma, gamma = 1/alpha, eta ~ Laplace(b = ln(1 + alpha)/epsilon):
    pure (alpha, epsilon)-ER-EE (the output's density ratio is exp(|l - l'| / b) <= e^epsilon).
    BIASED upwards: E = (n + gamma) / (1 - b^2) - gamma for b < 1 (infinite for b >= 1), a
    multiplicative bias 1 / (1 - b^2) on n + gamma; :func:`log_laplace_unbiased` removes it."""
    t, step = calibrate(log_laplace_scale(alpha, epsilon) * epsilon, epsilon)  # sensitivity ln(1 + alpha)
    gamma = 1.0 / alpha
    n = _counts(n)
    return np.exp(add_noise(np.log(n + gamma), t, kind="laplace", rng=rng, step=step)) - gamma


def log_laplace_density(y, n: float, alpha: float, epsilon: float) -> np.ndarray:
    """Exact density of :func:`log_laplace`'s output at y > -gamma (0 elsewhere):
    exp(-|ln(y + gamma) - ln(n + gamma)| / b) / (2 b (y + gamma))."""
    b = log_laplace_scale(alpha, epsilon)
    gamma = 1.0 / alpha
    y = np.asarray(y, dtype=float)
    shifted = np.where(y > -gamma, y + gamma, 1.0)
    dens = np.exp(-np.abs(np.log(shifted) - math.log(n + gamma)) / b) / (2.0 * b * shifted)
    return np.where(y > -gamma, dens, 0.0)


def log_laplace_bias_factor(alpha: float, epsilon: float) -> float:
    """E[e^eta] = 1 / (1 - b^2) for eta ~ Laplace(b), b < 1; inf otherwise."""
    b = log_laplace_scale(alpha, epsilon)
    return 1.0 / (1.0 - b * b) if b < 1.0 else math.inf


def log_laplace_expectation(n, alpha: float, epsilon: float) -> np.ndarray:
    """E[log_laplace(n)] = (n + gamma) / (1 - b^2) - gamma."""
    gamma = 1.0 / alpha
    return (_counts(n) + gamma) * log_laplace_bias_factor(alpha, epsilon) - gamma


def log_laplace_unbiased(released, alpha: float, epsilon: float) -> np.ndarray:
    """(released + gamma)(1 - b^2) - gamma: unbiased for n when b < 1. A function of the release
    alone (public alpha, epsilon), so still (alpha, epsilon)-ER-EE by post-processing."""
    factor = log_laplace_bias_factor(alpha, epsilon)
    if not math.isfinite(factor):
        raise ValueError("b = ln(1 + alpha)/epsilon >= 1: the log-Laplace release has no finite mean")
    gamma = 1.0 / alpha
    return (np.asarray(released, dtype=float) + gamma) / factor - gamma


def log_laplace_interval(released, alpha: float, epsilon: float,
                         level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``level`` interval for n: exp(ln(released + gamma) -/+ b ln(1/(1 - level))) - gamma
    (it covers n exactly when |eta| <= t; multiplicative, asymmetric around the release)."""
    b = log_laplace_scale(alpha, epsilon)
    gamma = 1.0 / alpha
    log_y = np.log(np.asarray(released, dtype=float) + gamma)
    t = _laplace_half_width(b, level)
    return np.exp(log_y - t) - gamma, np.exp(log_y + t) - gamma


# ------------------------------------------------------------------ smooth sensitivity of a total
def smooth_grid_step(min_scale: float) -> float:
    """The public grid step of a smooth mechanism whose noise scale is at least ``min_scale`` (a
    public number: the scale per unit of S, since S >= 1): grid_step(min_scale) (about 2^-20 of
    it), at most 1 so that an integer count is an exact multiple of it."""
    return float(min(grid_step(float(min_scale)), 1.0))


def _on_grid(center, noise, step: float) -> np.ndarray:
    """step (center / step + rint(noise / step)): center must be an exact multiple of step (an
    integer count, or a value already snapped); the sum is one of two exact integers scaled by a
    power of two, so the output's bits carry M + K only."""
    center = np.asarray(center, dtype=float)
    units = center / step
    if not np.array_equal(units, np.rint(units)):
        raise ValueError("the value to release is not on the grid (an integer count is needed)")
    return (units + np.rint(np.asarray(noise, dtype=float) / step)) * step


def local_sensitivity(x_max, alpha: float) -> np.ndarray:
    """LS(D) of a cell total under strong alpha-neighbours: max_e max_change(x_e) = max_change(x_max)."""
    return max_change(x_max, alpha)


def cell_max(sizes_per_cell: Sequence) -> np.ndarray:
    """The largest establishment of each cell (0 for a cell without establishments)."""
    return np.array([float(np.max(s)) if np.size(s) else 0.0 for s in sizes_per_cell])


def smooth_sensitivity(sizes_or_x_max, alpha: float, beta: float) -> np.ndarray:
    """beta-smooth sensitivity S(D) = max_k e^(-beta k) max_{d(D, D') <= k} LS(D') of each cell total.

    ``sizes_or_x_max``: a list of per-cell size arrays, or the per-cell largest sizes x_max.
    At distance k the largest establishment is at most g^k(x_max), g(x) = max((1 + alpha) x, x + 1)
    (grow the largest one k times; LS only grows with x_max), so S = max_k e^(-beta k) max(alpha
    g^k(x_max), 1). While alpha x < 1, g adds 1: g^k(x) = x + k up to k0 = ceil(1/alpha - x); after
    it g multiplies by 1 + alpha, so the terms fall like ((1 + alpha) e^(-beta))^k: S is finite iff
    beta > ln(1 + alpha), and then S = max(alpha x_max, 1, e^(-beta k0) alpha (x_max + k0)).
    (k0 - 1 and k0 + 1 are scanned too, which makes the closed form robust to rounding in k0.)
    """
    _positive(alpha=alpha, beta=beta)
    if beta <= math.log1p(alpha):
        raise ValueError(f"beta={beta} <= ln(1 + alpha)={math.log1p(alpha):.6g}: the smooth sensitivity is infinite")
    if isinstance(sizes_or_x_max, (list, tuple)) and any(np.ndim(s) > 0 for s in sizes_or_x_max):
        x = cell_max(sizes_or_x_max)
    else:
        x = np.asarray(sizes_or_x_max, dtype=float)
    k0 = np.where(alpha * x >= 1.0, 0.0, np.ceil(1.0 / alpha - x))
    best = local_sensitivity(x, alpha)
    for k in (k0 - 1.0, k0, k0 + 1.0):
        k = np.maximum(k, 0.0)
        best = np.maximum(best, np.exp(-beta * k) * alpha * (x + k))
    return best


def smooth_laplace_params(epsilon: float, delta: float) -> tuple[float, float]:
    """(beta, noise scale per unit of S) of the NRS Laplace mechanism: beta = epsilon / (2 ln(2 /
    delta)), scale = 2 S / epsilon (Laplace is (epsilon/2, beta)-admissible for that delta)."""
    _positive(epsilon=epsilon, delta=delta)
    if delta >= 1.0:
        raise ValueError("delta must be below 1")
    return epsilon / (2.0 * math.log(2.0 / delta)), 2.0 / epsilon


def smooth_laplace(n, x_max, alpha: float, epsilon: float, delta: float, rng: np.random.Generator) -> np.ndarray:
    """n + Laplace(2 S(D) / epsilon), S the beta-smooth sensitivity with beta = epsilon / (2 ln(2 /
    delta)): (alpha, epsilon, delta)-ER-EE (Nissim-Raskhodnikova-Smith). Unbiased. Needs beta >
    ln(1 + alpha) (else S is infinite and this raises): small alpha or large delta. The output is
    rounded onto the public grid ``smooth_grid_step(2 / epsilon)`` (module docstring)."""
    beta, per_s = smooth_laplace_params(epsilon, delta)
    n = _integer_counts(n).astype(float)
    s = smooth_sensitivity(np.broadcast_to(np.asarray(x_max, dtype=float), n.shape), alpha, beta)
    return _on_grid(n, rng.laplace(0.0, 1.0, size=n.shape) * per_s * s, smooth_grid_step(per_s))


def smooth_laplace_interval(released, s_bound, epsilon: float, delta: float,
                            level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``level`` interval for n given a PUBLIC bound s_bound >= S(D): released -/+ (2 s_bound
    ln(1/(1 - level)) / epsilon + half the grid step) (conservative; exact up to the grid when
    s_bound = S(D))."""
    _, per_s = smooth_laplace_params(epsilon, delta)
    t = (_laplace_half_width(1.0, level) * per_s * np.asarray(s_bound, dtype=float)
         + 0.5 * smooth_grid_step(per_s))
    released = np.asarray(released, dtype=float)
    return released - t, released + t


# ------------------------------------------------------------------ the heavy-tailed admissible noise
def quartic_pdf(z) -> np.ndarray:
    """Density of the NRS admissible noise with gamma = 4: sqrt(2) / (pi (1 + z^4)); mean 0, variance 1."""
    z = np.asarray(z, dtype=float)
    return 1.0 / (QUARTIC_NORM * (1.0 + z ** 4))


def quartic_cdf(z) -> np.ndarray:
    """Closed-form CDF: 1/2 + [ln((z^2 + r z + 1)/(z^2 - r z + 1)) + 2 atan(r z + 1) + 2 atan(r z - 1)]
    / (4 r) / (pi / r), r = sqrt 2."""
    z = np.asarray(z, dtype=float)
    r = math.sqrt(2.0)
    g = (np.log((z * z + r * z + 1.0) / (z * z - r * z + 1.0)) + 2.0 * np.arctan(r * z + 1.0)
         + 2.0 * np.arctan(r * z - 1.0)) / (4.0 * r)
    return 0.5 + g / QUARTIC_NORM


def quartic_quantile(p: float) -> float:
    """The p-quantile of :func:`quartic_pdf` (bisection on the closed-form CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must lie in (0, 1)")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if quartic_cdf(mid) < p else (lo, mid)
    return 0.5 * (lo + hi)


def quartic_sample(size, rng: np.random.Generator) -> np.ndarray:
    """Exact draws from :func:`quartic_pdf` by rejection from the standard Cauchy: the density ratio
    is sqrt 2 (1 + z^2)/(1 + z^4) <= sqrt 2 QUARTIC_ENVELOPE; accept with (1 + z^2) / ((1 + z^4)
    QUARTIC_ENVELOPE) (acceptance rate 1 / (sqrt 2 QUARTIC_ENVELOPE) = 0.586)."""
    total = int(np.prod(size)) if np.ndim(size) else int(size)
    out = np.empty(0)
    while out.size < total:
        z = rng.standard_cauchy(max(2 * (total - out.size), 16))
        keep = rng.uniform(size=z.size) * QUARTIC_ENVELOPE * (1.0 + z ** 4) <= 1.0 + z * z
        out = np.concatenate([out, z[keep]])
    return out[:total].reshape(size)


def smooth_gamma_params(epsilon: float) -> tuple[float, float]:
    """(beta, a) of :func:`smooth_gamma`: beta = epsilon / (2 (gamma + 1)) = epsilon / 10, a = epsilon / 4.

    Pure epsilon: with z = a (y - f(D)) / S(D), the log density ratio splits into a shift s = a (f(D)
    - f(D')) / S(D), |s| <= a (since |f(D) - f(D')| <= LS(D) <= S(D)), costing at most a sup_z
    |d/dz ln(1 + z^4)| = 3^(3/4) a = 0.570 epsilon, and a dilation by lambda = S(D') / S(D) in
    [e^-beta, e^beta], costing |ln lambda + ln(1 + (w/lambda)^4) - ln(1 + w^4)| <= 3 |ln lambda|
    <= 3 beta = 0.3 epsilon. Total <= 0.87 epsilon <= epsilon."""
    _positive(epsilon=epsilon)
    return epsilon / (2.0 * (QUARTIC_GAMMA + 1.0)), epsilon / 4.0


def smooth_gamma(n, x_max, alpha: float, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """n + (S(D) / a) Z, Z with density proportional to 1 / (1 + |z|^4), S the beta-smooth
    sensitivity (:func:`smooth_gamma_params`): PURE (alpha, epsilon)-ER-EE. Unbiased (Z has mean 0
    and variance 1). This is the Nissim-Raskhodnikova-Smith pure-epsilon admissible noise
    (1 / (1 + |z|^gamma), gamma = 4); the issue calls it "smooth Gamma" after its exponent gamma,
    which is how we read the name: it is NOT a Gamma-distributed noise. Needs epsilon / 10 >
    ln(1 + alpha) (e.g. alpha <= 0.105 at epsilon 1). The output is rounded onto the public grid
    ``smooth_grid_step(1 / a)`` (module docstring)."""
    beta, a = smooth_gamma_params(epsilon)
    n = _integer_counts(n).astype(float)
    s = smooth_sensitivity(np.broadcast_to(np.asarray(x_max, dtype=float), n.shape), alpha, beta)
    return _on_grid(n, quartic_sample(n.shape, rng) * s / a, smooth_grid_step(1.0 / a))


def smooth_gamma_density(y, n: float, s: float, epsilon: float) -> np.ndarray:
    """Exact density of :func:`smooth_gamma`'s continuous output (before the grid, which is
    post-processing) for a cell with total n and smooth sensitivity s."""
    _, a = smooth_gamma_params(epsilon)
    return (a / s) * quartic_pdf(a * (np.asarray(y, dtype=float) - n) / s)


def smooth_gamma_interval(released, s_bound, epsilon: float, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``level`` interval for n given a PUBLIC bound s_bound >= S(D): released -/+ (q s_bound / a +
    half the grid step), q the (1 + level)/2 quantile of the quartic law (1.98 at 95%)."""
    _, a = smooth_gamma_params(epsilon)
    t = (quartic_quantile(0.5 + level / 2.0) * np.asarray(s_bound, dtype=float) / a
         + 0.5 * smooth_grid_step(1.0 / a))
    released = np.asarray(released, dtype=float)
    return released - t, released + t


# ------------------------------------------------------------------ the NRS median
def median_smooth_sensitivity(values, lower: float, upper: float, beta: float) -> float:
    """Exact beta-smooth sensitivity of the (lower) median x_m, m = floor((n + 1)/2), of values
    clipped to [lower, upper], under replace-one neighbours (n public):
    S = max_{k=0..n} e^(-beta k) max_{t=0..k+1} (x_{m+t} - x_{m+t-k-1}), with x_i = lower for
    i < 1 and upper for i > n (NRS). O(n^2), stopping once e^(-beta k) (upper - lower) <= S."""
    _positive(beta=beta)
    x = np.sort(np.clip(np.asarray(values, dtype=float).ravel(), lower, upper))
    n = x.size
    if n == 0:
        raise ValueError("the median needs at least one value")
    padded = np.concatenate([np.full(n + 2, float(lower)), x, np.full(n + 2, float(upper))])
    m = (n + 1) // 2
    best = 0.0
    for k in range(n + 1):
        weight = math.exp(-beta * k)
        if weight * (upper - lower) <= best:
            break
        t = np.arange(k + 2)
        hi = padded[m + t + n + 1]
        lo = padded[m + t - k - 1 + n + 1]
        best = max(best, weight * float(np.max(hi - lo)))
    return best


def smooth_median(values, lower: float, upper: float, epsilon: float, rng: np.random.Generator) -> float:
    """The (lower) median of values clipped to public [lower, upper] plus (S / a) Z with the same
    pure-epsilon admissible noise as :func:`smooth_gamma` (beta = epsilon / 10, a = epsilon / 4):
    epsilon-DP under replace-one neighbours (n public). Median-unbiased for the clipped median (Z is
    symmetric); the noise scale depends on the data, so no interval from the release alone.

    Grid: the values (after clipping) and the bounds are snapped to the public step
    ``smooth_grid_step((upper - lower) / a)`` (a per-row map, so the guarantee is unchanged; it
    moves a value by at most half a step, about 2^-21 of the range), so the median is an exact grid
    point and the output is a grid point (module docstring)."""
    beta, a = smooth_gamma_params(epsilon)
    if not (np.isfinite(lower) and np.isfinite(upper) and upper > lower):
        raise ValueError(f"the median's bounds [{lower}, {upper}] must be finite with lower < upper")
    step = smooth_grid_step((upper - lower) / a)
    lo, hi = np.rint(lower / step) * step, np.rint(upper / step) * step
    x = np.rint(np.clip(np.asarray(values, dtype=float).ravel(), lower, upper) / step) * step
    s = median_smooth_sensitivity(x, lo, hi, beta)
    median = float(np.sort(x)[(x.size + 1) // 2 - 1])
    return float(_on_grid(median, quartic_sample(1, rng)[0] * s / a, step))
