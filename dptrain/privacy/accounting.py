"""Privacy accounting for DP-SGD with Poisson sampling (add/remove-one-record neighbours).

Pure functions map (sample rate q, noise multiplier sigma, steps T, delta) to epsilon with two
accountants of Google's ``dp-accounting`` library: ``"rdp"`` (Renyi DP of the Poisson-subsampled
Gaussian, Mironov, Talwar, Zhang 2019, with the conversion of Balle et al. 2020; cheap, cached
per (q, sigma)) and ``"pld"`` (privacy loss distributions, Koskela et al. 2020 / Doroshenko et
al. 2022; tight second opinion, ~0.3-0.5 s a call). :class:`PrivacyAccountant` only records
history; epsilon is composed from it on demand.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import numbers
from collections.abc import Callable
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import pld as _pld
from dp_accounting import rdp as _rdp

__all__ = ["ACCOUNTANTS", "RDP_ORDERS", "AccountingError", "PrivacyAccountant",
           "calibrate_noise_multiplier", "compute_epsilon", "pld_epsilon", "rdp_epsilon"]

class _DropExcludedOrderWarnings(logging.Filter):
    """dp-accounting logs one warning per fractional order whose series does not converge (large q,
    small sigma) and then leaves that order out, which keeps epsilon a valid upper bound. Those
    lines say nothing a user can act on, so they are dropped; all other absl records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "_compute_log_a_frac failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_DropExcludedOrderWarnings())

#: RDP orders: dp-accounting's defaults (1.1..10.9 by 0.1, 11..63, 128, 256, 512, 1024), so our
#: RDP epsilon equals that of a default ``RdpAccountant``. Capping at 63 (Opacus' default)
#: makes epsilon < ~0.1 at delta = 1e-5 impossible to certify.
RDP_ORDERS: tuple[float, ...] = tuple(
    [round(1 + x / 10.0, 1) for x in range(1, 100)] + [float(a) for a in range(11, 64)]
    + [128.0, 256.0, 512.0, 1024.0]
)
ACCOUNTANTS = ("rdp", "pld")
#: Value discretisation interval of the PLD accountant (dp-accounting's default, tight).
PLD_DISCRETIZATION = 1e-4
_SIGMA_MIN, _SIGMA_MAX = 1e-2, 1e6  # calibration search range for sigma

Segment = tuple[float, float, int]  # (noise_multiplier, sample_rate, steps)


class AccountingError(ValueError):
    """A bad argument to an accounting function; the message names argument, value and range."""


def _bad(name: str, value: Any, allowed: str) -> AccountingError:
    return AccountingError(f"{name}={value!r} is not allowed: {allowed}")


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise _bad(name, value, "must be a real number (not NaN)")
    return float(value)


def _check_q(q: Any) -> float:
    if not 0.0 <= (q := _real("sample_rate", q)) <= 1.0:
        raise _bad("sample_rate", q, "must be in [0, 1]")
    return q


def _check_sigma(sigma: Any) -> float:
    if not 0.0 <= (sigma := _real("noise_multiplier", sigma)) < math.inf:
        raise _bad("noise_multiplier", sigma, "must be finite and >= 0")
    return sigma


def _check_steps(steps: Any, name: str = "steps") -> int:
    if isinstance(steps, float) and steps.is_integer():
        steps = int(steps)
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise _bad(name, steps, "must be an integer >= 0")
    return int(steps)


def _segment(sigma: Any, q: Any, steps: Any, steps_name: str = "steps") -> Segment:
    return _check_sigma(sigma), _check_q(q), _check_steps(steps, steps_name)


def _check_delta(delta: Any) -> float:
    if not 0.0 < (delta := _real("delta", delta)) < 1.0:
        raise _bad("delta", delta, "must be in the open interval (0, 1)")
    return delta


def _check_accountant(accountant: Any) -> str:
    if not isinstance(accountant, str) or accountant not in ACCOUNTANTS:
        raise _bad("accountant", accountant, f"must be one of {ACCOUNTANTS}")
    return accountant


def _event(q: float, sigma: float) -> dp_accounting.DpEvent:
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))


@functools.lru_cache(maxsize=1024)
def _rdp_per_step(q: float, sigma: float) -> np.ndarray:
    """RDP of ONE Poisson-subsampled Gaussian step at each of RDP_ORDERS (read-only array)."""
    acc = _rdp.RdpAccountant(list(RDP_ORDERS))  # add/remove neighbours (its default)
    acc.compose(_event(q, sigma), 1)
    vec = acc.rdp
    vec.setflags(write=False)
    return vec


@functools.lru_cache(maxsize=8)
def _pld_composed(segments: tuple[Segment, ...]) -> _pld.PLDAccountant:
    acc = _pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    for sigma, q, steps in segments:
        acc.compose(_event(q, sigma), steps)
    return acc


def _epsilon(segments: tuple[Segment, ...], delta: float, accountant: str) -> float:
    """Epsilon of the composition of validated segments (sigma, q, steps)."""
    active = tuple(s for s in segments if s[1] > 0.0 and s[2] > 0)  # others spend nothing
    if not active:
        return 0.0
    if any(sigma == 0.0 for sigma, _, _ in active):
        return math.inf
    if accountant == "pld":
        return max(0.0, float(_pld_composed(active).get_epsilon(delta)))
    total = sum(steps * _rdp_per_step(q, sigma) for sigma, q, steps in active)  # RDP adds up
    return float(_rdp.compute_epsilon(RDP_ORDERS, total, delta)[0])


def rdp_epsilon(*, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` Poisson-subsampled Gaussian steps by RDP accounting.

    Per step, the RDP at order alpha is log(A_alpha) / (alpha - 1) with, for integer alpha,
    A_alpha = sum_k C(alpha, k) (1 - q)^(alpha - k) q^k exp((k^2 - k) / (2 sigma^2))
    (Mironov, Talwar, Zhang 2019; fractional orders by their series); for q = 1 it is
    alpha / (2 sigma^2). T steps compose to T times that, and (Balle et al. 2020, Thm. 21)
    epsilon = min_alpha [T rdp(alpha) + log((alpha - 1) / alpha)
                         - (log delta + log alpha) / (alpha - 1)]
    over ``RDP_ORDERS``. Equals dp-accounting's default ``RdpAccountant``.

    Args:
        sample_rate: Poisson sampling probability q in [0, 1].
        noise_multiplier: sigma >= 0 (noise std / clipping norm).
        steps: Number of steps T >= 0.
        delta: Target delta in (0, 1).

    Returns:
        Epsilon (0.0 if steps == 0 or q == 0; math.inf if sigma == 0). ~1 ms after the first
        call for a given (q, sigma), which computes and caches the per-step RDP (~30 ms).

    Raises:
        AccountingError: On an argument out of range.
    """
    return _epsilon((_segment(noise_multiplier, sample_rate, steps),), _check_delta(delta), "rdp")


def pld_epsilon(*, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` Poisson-subsampled Gaussian steps by PLD accounting (tight).

    Uses ``dp_accounting.pld.PLDAccountant`` (value discretisation interval
    ``PLD_DISCRETIZATION`` = 1e-4, pessimistic estimates), whose epsilon upper-bounds the exact
    one within its discretisation error (which grows slowly with the number of steps).
    Cost: ~0.3-0.5 s per new (q, sigma, steps); the composed PLD is cached.

    Args, returns and errors as :func:`rdp_epsilon`.
    """
    return _epsilon((_segment(noise_multiplier, sample_rate, steps),), _check_delta(delta), "pld")


def compute_epsilon(
    *, accountant: str, sample_rate: float, noise_multiplier: float, steps: int, delta: float
) -> float:
    """Dispatches to :func:`rdp_epsilon` or :func:`pld_epsilon` by ``accountant`` ("rdp"/"pld")."""
    fn = rdp_epsilon if _check_accountant(accountant) == "rdp" else pld_epsilon
    return fn(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, delta=delta)


def _solve(g: Callable[[float], float], lo: float, hi: float, tol: float) -> float:
    """Shrinks a bracket [lo, hi] of log sigma (g(lo) > 0 >= g(hi)) to width <= tol; returns hi.

    False position on log epsilon vs log sigma (nearly linear), nudged by tol/2 across the
    estimated root so that both ends close in; bisection when that does not halve the bracket.
    """
    glo, ghi, push, interpolate = g(lo), g(hi), 0.0, True
    while hi - lo > tol:
        before = hi - lo
        if interpolate and math.isfinite(glo) and math.isfinite(ghi):
            x = hi - ghi * (hi - lo) / (ghi - glo) + push
            x = min(max(x, lo + 0.01 * before), hi - 0.01 * before)
        else:
            x = 0.5 * (lo + hi)
        gx = g(x)
        if gx > 0:
            lo, glo, push = x, gx, tol / 2
        else:
            hi, ghi, push = x, gx, -tol / 2
        interpolate = not interpolate or (hi - lo) <= before / 2
    return hi


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
    rtol: float = 1e-3,
) -> float:
    """Smallest noise multiplier whose epsilon is <= ``target_epsilon``.

    The returned sigma satisfies epsilon(sigma) <= target_epsilon (evaluated, not assumed) and
    sigma / (1 + rtol) does not (up to the accountant's monotonicity), i.e. it is the smallest
    such sigma to RELATIVE tolerance ``rtol``. Searched in [1e-2, 1e6]; if even sigma = 1e-2
    meets the target, 1e-2 is returned. For "pld" the RDP answer seeds the bracket (PLD is
    tighter), ~10 PLD evaluations (a few seconds).

    Args:
        target_epsilon: Target epsilon > 0.
        sample_rate: Poisson sampling probability q in [0, 1].
        steps: Number of steps T >= 0.
        delta: Target delta in (0, 1).
        accountant: "rdp" or "pld".
        rtol: Relative tolerance on sigma, in (0, 1).

    Returns:
        sigma (0.0 when q == 0 or steps == 0: nothing is spent).

    Raises:
        AccountingError: On a bad argument, or naming target_epsilon when sigma <= 1e6 cannot
            reach it.
    """
    if not 0.0 < (target := _real("target_epsilon", target_epsilon)) < math.inf:
        raise _bad("target_epsilon", target_epsilon, "must be finite and > 0")
    q, steps, delta = _check_q(sample_rate), _check_steps(steps), _check_delta(delta)
    accountant = _check_accountant(accountant)
    if not 0.0 < (rtol := _real("rtol", rtol)) < 1.0:
        raise _bad("rtol", rtol, "must be in (0, 1)")
    if q == 0.0 or steps == 0:
        return 0.0

    def g(log_sigma: float) -> float:  # log(eps / target); > 0 means not private enough
        eps = _epsilon(((math.exp(log_sigma), q, steps),), delta, accountant)
        return math.log(eps / target) if eps > 0 else -math.inf

    hi, step = 0.0, math.log(4.0)  # log sigma; PLD starts from the (larger) RDP sigma
    if accountant == "pld":
        with contextlib.suppress(AccountingError):
            hi, step = math.log(calibrate_noise_multiplier(
                target_epsilon=target, sample_rate=q, steps=steps, delta=delta, rtol=rtol)), 0.2
    if g(hi) > 0:
        lo = hi
        while g(hi) > 0:
            lo, hi = hi, hi + step
            if hi > math.log(_SIGMA_MAX):
                raise _bad("target_epsilon", target_epsilon,
                           f"unreachable with noise_multiplier <= {_SIGMA_MAX:g} (q={q}, "
                           f"steps={steps}, delta={delta}, accountant={accountant!r})")
    else:
        lo = hi - step
        while g(lo) <= 0:
            if lo <= math.log(_SIGMA_MIN):
                return math.exp(lo)  # the floor (as evaluated) already meets the target
            lo, hi = max(lo - step, math.log(_SIGMA_MIN)), lo
    return math.exp(_solve(g, lo, hi, math.log1p(rtol)))


class PrivacyAccountant:
    """Records history only: list of (noise_multiplier, sample_rate, steps) segments
    (consecutive identical settings merged). Epsilon is composed from all segments on demand
    (RDP: sum of per-segment RDP vectors; PLD: composition of the per-segment PLDs)."""

    def __init__(self) -> None:
        self._history: list[Segment] = []

    def step(self, *, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Records ``num_steps`` steps at (noise_multiplier, sample_rate); 0 steps is a no-op."""
        sigma, q, n = _segment(noise_multiplier, sample_rate, num_steps, "num_steps")
        if n == 0:
            return
        if self._history and self._history[-1][:2] == (sigma, q):
            self._history[-1] = (sigma, q, self._history[-1][2] + n)
        else:
            self._history.append((sigma, q, n))

    @property
    def steps(self) -> int:
        """Total number of recorded steps."""
        return sum(s[2] for s in self._history)

    @property
    def history(self) -> tuple[tuple[float, float, int], ...]:
        """Segments (noise_multiplier, sample_rate, steps) in order."""
        return tuple(self._history)

    def get_epsilon(self, *, delta: float, accountant: str = "rdp") -> float:
        """Epsilon of the composition of all recorded segments at ``delta``."""
        return _epsilon(self.history, _check_delta(delta), _check_accountant(accountant))

    def state_dict(self) -> dict:
        """Serialisable state: ``{"history": [[sigma, q, steps], ...]}``."""
        return {"history": [list(s) for s in self._history]}

    def load_state_dict(self, state: dict) -> None:
        """Restores the full history from :meth:`state_dict` output (validated, re-merged)."""
        if not isinstance(state, dict) or "history" not in state:
            raise _bad("state", state, "must be a dict with a 'history' list")
        restored = PrivacyAccountant()
        for seg in state["history"]:
            if not isinstance(seg, (list, tuple)) or len(seg) != 3:
                raise _bad("state['history'] segment", seg, "must be [sigma, q, steps]")
            restored.step(noise_multiplier=seg[0], sample_rate=seg[1], num_steps=seg[2])
        self._history = restored._history

    def max_steps_within(
        self, *, max_epsilon: float, noise_multiplier: float, sample_rate: float, delta: float,
        accountant: str = "rdp", limit: int,
    ) -> int:
        """The largest k in [0, limit] such that this history plus k more steps at
        (noise_multiplier, sample_rate) has epsilon <= max_epsilon (a privacy budget). Epsilon
        grows with every step, so a binary search over k is exact."""
        delta, accountant = _check_delta(delta), _check_accountant(accountant)

        def eps_after(k: int) -> float:
            trial = PrivacyAccountant()
            trial._history = list(self._history)
            trial.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate, num_steps=k)
            return trial.get_epsilon(delta=delta, accountant=accountant)

        if eps_after(0) > max_epsilon:
            return 0
        if eps_after(limit) <= max_epsilon:
            return int(limit)
        lo, hi = 0, int(limit)  # eps_after(lo) <= budget < eps_after(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if eps_after(mid) <= max_epsilon:
                lo = mid
            else:
                hi = mid
        return lo
