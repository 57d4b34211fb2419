"""Noise calibration: the project's ONE search for the smallest noise multiplier within a target.

:func:`smallest_noise` finds the smallest sigma in [lower, upper] whose epsilon (any callable
``epsilon_of(sigma)`` that does not grow with sigma) is <= a target, to relative tolerance
``rtol``. Every calibration of dptrain goes through it; none keeps a search loop of its own:

- sigma for DP-SGD: :func:`dptrain.privacy.accounting.calibrate_noise_multiplier`
  (``privacy.target_epsilon``, by the RDP or PLD accountant; PLD seeded from the RDP answer);
- the dp/ curve: sigma_c of :func:`dptrain.privacy.curves.curve_noise_multiplier` (the curve's
  budget share) and :func:`dptrain.privacy.curves.fill_target` (the rest of the target by
  another headline accountant);
- ``task=tune``: the DP-SGD sigma of the whole private search,
  :func:`dptrain.tasks.tune.calibrate_search`;
- ``estimator=ssp``: the noise multiplier of one Gaussian mechanism,
  :func:`dptrain.inference.ssp.calibrate`.

**What it guarantees.** The returned sigma was EVALUATED: ``epsilon_of(sigma) <= target``. When
the search solved (sigma > lower), ``sigma / (1 + rtol)`` or a point above it was evaluated
above the target, so for a monotone ``epsilon_of`` the smallest sigma lies in
[sigma / (1 + rtol), sigma]. If even ``lower`` meets the target, ``lower`` is returned; if
``upper`` does not, :class:`Unreachable` is raised (with epsilon at ``upper``), and each caller
turns it into its own message.

**How.** A bracket walked in log sigma from ``start`` in steps of ``factor`` (clamped to
[lower, upper]), then false position on g(log sigma) = log(epsilon / target), which is nearly
linear for the Gaussian mechanisms here: each estimate is nudged by half the tolerance past the
root, away from the end the previous interpolation moved, so that both ends close in, and a
bisection step follows each interpolation that did not halve the bracket (so it never needs much
more than twice bisection's evaluations, and on these smooth curves far fewer). Each sigma is
evaluated once (a PLD evaluation costs ~0.3-0.5 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dptrain.core.errors import DPTrainError

__all__ = ["Unreachable", "smallest_noise"]


class Unreachable(DPTrainError):
    """Even the largest noise multiplier searched (``upper``) does not meet the target:
    ``epsilon`` is its epsilon. Callers catch it and say what the user can change."""

    def __init__(self, upper: float, epsilon: float, target: float) -> None:
        super().__init__(f"target epsilon {target:g} is not reached by noise multiplier {upper:g} "
                         f"(epsilon {epsilon:.6g} there)")
        self.upper, self.epsilon, self.target = upper, epsilon, target


class _Log:
    """g(x) = log(epsilon_of(sigma(x)) / target) for x = log sigma, each sigma evaluated once;
    sigma(x) is exactly ``lower`` / ``upper`` at the ends, so the value returned is the value
    evaluated."""

    def __init__(self, epsilon_of: Callable[[float], float], target: float, lower: float, upper: float) -> None:
        self.epsilon_of, self.target, self.lower, self.upper = epsilon_of, target, lower, upper
        self.bottom, self.top = math.log(lower), math.log(upper)
        self.seen: dict[float, float] = {}

    def sigma(self, x: float) -> float:
        return self.lower if x <= self.bottom else self.upper if x >= self.top else math.exp(x)

    def epsilon(self, x: float) -> float:
        s = self.sigma(x)
        if s not in self.seen:
            self.seen[s] = float(self.epsilon_of(s))
        return self.seen[s]

    def __call__(self, x: float) -> float:
        """> 0 exactly when epsilon > target as compared (NaN: not private enough); its size the
        log ratio's."""
        eps = self.epsilon(x)
        meets = eps <= self.target
        try:
            gx = math.log(eps / self.target)
        except ValueError:  # epsilon 0 (or an infinite target)
            gx = -math.inf
        if math.isnan(gx):
            gx = 0.0 if meets else math.inf
        return min(gx, 0.0) if meets else max(gx, math.ulp(0.0))


def smallest_noise(epsilon_of: Callable[[float], float], *, target: float, rtol: float, lower: float,
                   upper: float, start: float = 1.0, factor: float = 4.0) -> float:
    """The smallest sigma in [``lower``, ``upper``] with ``epsilon_of(sigma) <= target``, to
    relative tolerance ``rtol`` (module docstring). ``epsilon_of`` must not grow with sigma.

    Args:
        epsilon_of: sigma -> epsilon (math.inf allowed; NaN counts as not private enough).
        target: The target epsilon, > 0.
        rtol: Relative tolerance on sigma, > 0.
        lower, upper: The searched range, 0 < lower < upper < inf.
        start: Where the bracket walk starts (a good guess saves evaluations).
        factor: The bracket walk's step (> 1); near 1 for a close guess.

    Returns:
        sigma, with ``epsilon_of(sigma) <= target`` as evaluated; ``lower`` when ``lower`` meets it.

    Raises:
        Unreachable: When ``upper`` does not meet the target.
        ValueError: On an argument out of range.
    """
    if not (0.0 < lower < upper < math.inf and rtol > 0.0 and factor > 1.0 and target > 0.0):
        raise ValueError(f"smallest_noise: need 0 < lower < upper < inf, rtol > 0, factor > 1, target > 0; got "
                         f"lower={lower!r}, upper={upper!r}, rtol={rtol!r}, factor={factor!r}, target={target!r}")
    g = _Log(epsilon_of, target, lower, upper)
    lo, hi = _bracket(g, math.log(min(max(start, lower), upper)), math.log(factor))
    if lo is None:
        return lower
    return g.sigma(_solve(g, lo, hi, math.log1p(rtol)))


def _bracket(g: _Log, x: float, step: float) -> tuple[float | None, float]:
    """(lo, hi) in log sigma with g(lo) > 0 >= g(hi), walked from ``x`` by ``step`` within
    [bottom, top]; (None, bottom) when the bottom meets the target already."""
    if g(x) > 0:
        while True:
            if x >= g.top:
                raise Unreachable(g.upper, g.epsilon(g.top), g.target)
            lo, x = x, min(x + step, g.top)
            if g(x) <= 0:
                return lo, x
    while True:
        if x <= g.bottom:
            return None, g.bottom
        hi, x = x, max(x - step, g.bottom)
        if g(x) > 0:
            return x, hi


def _solve(g: _Log, lo: float, hi: float, tol: float) -> float:
    """Shrinks the bracket [lo, hi] (g(lo) > 0 >= g(hi)) to width <= ``tol``; returns hi.

    False position on g (log epsilon vs log sigma, nearly linear), each estimate nudged by tol/2
    away from the end the previous interpolation moved, so that both ends close in (on a curved g
    the estimates otherwise keep landing on one side); a bisection step after each interpolation
    that did not halve the bracket.
    """
    glo, ghi, push, interpolate = g(lo), g(hi), 0.0, True
    while hi - lo > tol:
        before = hi - lo
        interpolated = interpolate and math.isfinite(glo) and math.isfinite(ghi)
        if interpolated:
            x = hi - ghi * (hi - lo) / (ghi - glo) + push
            x = min(max(x, lo + 0.01 * before), hi - 0.01 * before)
        else:
            x = 0.5 * (lo + hi)
        gx = g(x)
        if gx > 0:
            lo, glo = x, gx
        else:
            hi, ghi = x, gx
        if interpolated:  # the next estimate aims past the root, toward the end that stayed
            push = tol / 2 if gx > 0 else -tol / 2
        interpolate = not interpolate or (hi - lo) <= before / 2
    return hi
