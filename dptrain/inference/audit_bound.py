"""The one-run audit's statistics (Steinke, Nasr, Jagielski 2023): from the number of correct
membership guesses about canaries to a lower bound on epsilon. Pure functions; the audit task
(:mod:`dptrain.tasks.audit`) trains the model and scores the canaries.

The bound. For eps-DP the number of correct guesses is stochastically dominated by
Binomial(r, e^eps / (1 + e^eps)) (the paper's Theorem 3.1); for (eps, delta)-DP the tail gains
2 m delta max_i (f(v - i) - f(v)) / i with f(v) = P[Binomial(r, e^eps/(1+e^eps)) >= v] (their
Theorem 5.2). :func:`p_value` is that tail; :func:`epsilon_lower_bound` is the end of the
interval [0, eps) of epsilons it rejects at level 1 - confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------------------------
# The lower bound (pure functions)
# --------------------------------------------------------------------------------------------


def _check_counts(m: int, r: int, v: int) -> None:
    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")


def p_value(*, m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Largest probability of >= v correct guesses out of r (m canaries) that an
    (epsilon, delta)-DP run allows (Steinke, Nasr, Jagielski 2023, Theorems 3.1 and 5.2):

        f(v) + 2 m delta max_{1<=i<=v} (f(v - i) - f(v)) / i,   f(u) = P[Binomial(r, p) >= u],

    with p = e^eps / (1 + e^eps), capped at 1. (i > v adds nothing: f(v - i) = 1 there.)"""
    from scipy import special, stats  # task=audit only: imported where it is used

    _check_counts(m, r, v)
    if not (epsilon >= 0 and 0 <= delta <= 1):
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    p = special.expit(epsilon)
    tail = float(stats.binom.sf(v - 1, r, p))  # P[B >= v]
    if delta > 0 and v >= 1:
        below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, p)  # P[B = v-1], P[B = v-2], ..., P[B = 0]
        slope = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))  # max_i P[v-i <= B < v] / i
        tail += 2.0 * m * delta * slope
    return min(tail, 1.0)


def _pure_dp_bound(r: int, v: int, level: float) -> float:
    """delta = 0: the eps where P[Binomial(r, p(eps)) >= v] = level, from the exact identity
    P[Binomial(r, p) >= v] = I_p(v, r - v + 1) (regularised incomplete beta), i.e. p is the
    ``level`` quantile of Beta(v, r - v + 1); 1 - p is taken from the mirrored Beta so that
    the logit keeps its precision when p is close to 1."""
    from scipy import stats  # task=audit only: imported where it is used

    p = float(stats.beta.ppf(level, v, r - v + 1))
    one_minus_p = float(stats.beta.isf(level, r - v + 1, v))
    if p <= 0.5:
        return 0.0
    return max(0.0, math.log(p) - math.log(one_minus_p))


def epsilon_lower_bound(*, m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """Epsilon lower bound at ``confidence`` from v correct guesses out of r (m canaries):
    the largest eps such that every eps' < eps has :func:`p_value` < 1 - confidence. 0 when
    nothing is rejected (always the case for v <= r / 2). An (eps, delta)-DP run reports a bound
    above eps with probability at most 1 - confidence."""
    from scipy import optimize  # task=audit only: imported where it is used

    _check_counts(m, r, v)
    if not (0.5 < confidence < 1):
        raise ValueError(f"confidence={confidence} must be in (0.5, 1)")
    level = 1.0 - confidence
    if r == 0 or v <= r / 2:
        return 0.0

    def excess(eps: float) -> float:
        return p_value(m=m, r=r, v=v, epsilon=eps, delta=delta) - level

    if excess(0.0) >= 0:
        return 0.0
    pure = _pure_dp_bound(r, v, level)
    if delta == 0:
        return pure
    # p_value(delta) >= p_value(0), which crosses the level exactly at `pure` and increases, so
    # the first crossing lies in (0, pure]: scan a grid for it, then solve in its bracket.
    grid = np.linspace(0.0, pure, 201)
    lo = 0.0
    for eps in grid[1:]:
        if excess(float(eps)) >= 0:
            return float(optimize.brentq(excess, lo, float(eps), xtol=1e-10, rtol=1e-12))
        lo = float(eps)
    return pure  # not reached: p_value(pure) >= level


# --------------------------------------------------------------------------------------------
# Guessing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Guesses:
    k: int  # guesses "in" for the k highest scores and "out" for the k lowest
    r: int  # number of guesses, 2k
    v: int  # correct guesses
    lower_bound: float  # at the union-bound-adjusted confidence


def count_correct(scores: np.ndarray, included: np.ndarray, k: int) -> tuple[int, int]:
    """(r, v): guess "in" for the k highest scores, "out" for the k lowest (ties broken by
    index, which is independent of the coin flips), abstain on the rest."""
    m = len(scores)
    if not (1 <= k <= m // 2):
        raise ValueError(f"k={k} must be in [1, m/2] for m={m}")
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    top, bottom = order[:k], order[m - k:]
    v = int(np.sum(included[top])) + int(np.sum(~included[bottom]))
    return 2 * k, v


def guess_counts(m: int, fractions: list[float]) -> list[int]:
    """The distinct k = floor(f m / 2) of the configured guess fractions, ascending."""
    return sorted({max(1, math.floor(f * m / 2)) for f in fractions})


def audit_scores(scores: np.ndarray, included: np.ndarray, *, fractions: list[float], delta: float,
                 confidence: float) -> tuple[Guesses, list[Guesses]]:
    """Every k of the list with its bound at confidence 1 - (1 - confidence) / K (union bound
    over the K distinct k), and the one with the largest bound (the smallest k on ties)."""
    m = len(scores)
    ks = guess_counts(m, fractions)
    each = 1.0 - (1.0 - confidence) / len(ks)
    rows = []
    for k in ks:
        r, v = count_correct(scores, included, k)
        rows.append(Guesses(k=k, r=r, v=v, lower_bound=epsilon_lower_bound(m=m, r=r, v=v, delta=delta,
                                                                            confidence=each)))
    best = max(rows, key=lambda g: (g.lower_bound, -g.k))
    return best, rows
