"""Privacy accounting: epsilon of a history of privacy events (add/remove-one-record neighbours).

Accountants are registered by name in ``ACCOUNTANTS`` (the ``privacy.accountant`` setting picks
the headline one and the one that calibrates sigma). Two ship, both from Google's
``dp-accounting`` library: ``"rdp"`` (Renyi DP, for DP-SGD's Poisson-subsampled Gaussian
Mironov, Talwar, Zhang 2019, with the conversion of Balle et al. 2020; cheap, cached per event)
and ``"pld"`` (privacy loss distributions, Koskela et al. 2020 / Doroshenko et al. 2022; tight
second opinion, ~0.3-0.5 s a call). An accountant is an object with ``name``, ``note`` and
``epsilon(history, delta)``, where the history is a tuple of (:class:`Event`, count) pairs.

:class:`PrivacyLedger` only records history (events, see :mod:`dptrain.privacy.events`);
epsilon is composed from it on demand. The functions :func:`rdp_epsilon`, :func:`pld_epsilon`,
:func:`compute_epsilon` and :func:`calibrate_noise_multiplier` are the same computation for one
run of identical DP-SGD steps.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dptrain.core.errors import DPTrainError
from dptrain.core.registry import Registry
from dptrain.privacy import cache
from dptrain.privacy.calibration import Unreachable, smallest_noise
from dptrain.privacy.events import EVENT_KINDS, Event, event_from_list, poisson_gaussian

if TYPE_CHECKING:
    import numpy as np
    from dp_accounting import pld as _pld

# dp-accounting (~1.5 s to import: scipy.signal, scipy.optimize) and numpy are imported by the
# functions that need them, not here: dptrain.settings imports this module for ACCOUNTANTS and
# SIGMA_RANGE, and `import dptrain.tasks.cli` (so every command line, a refused one too) stays free of
# them; with the accounting cache (dptrain.privacy.cache) a repeated run never imports dp-accounting.

__all__ = ["ACCOUNTANTS", "DEFAULT", "PLD", "RDP", "RDP_ORDERS", "REPORTED", "Accountant", "AccountingError",
           "PrivacyLedger", "accountant_named", "calibrate_noise_multiplier", "compact", "compute_epsilon",
           "history_epsilon", "pld_epsilon", "rdp_curve", "rdp_epsilon", "rdp_floor", "rdp_to_epsilon"]

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
#: Value discretisation interval of the PLD accountant (dp-accounting's default, tight).
PLD_DISCRETIZATION = 1e-4
#: The noise multipliers calibration searches (and the config allows): below 1e-2 float32
#: training and the accountants lose meaning, above 1e6 the noise drowns float32 gradients.
SIGMA_RANGE = (1e-2, 1e6)
_SIGMA_MIN, _SIGMA_MAX = SIGMA_RANGE

Segment = tuple[float, float, int]  # (noise_multiplier, sample_rate, steps): the legacy view
History = tuple[tuple["Event", int], ...]  # (event, number of consecutive steps)


class AccountingError(DPTrainError):
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


class Accountant(Protocol):
    """What an accountant is: a ``name`` (its key in ``ACCOUNTANTS``, the ``privacy.accountant``
    setting), a ``note`` for the report, whether it ``supports`` an event, and the ``epsilon`` of a
    history of (event, count) pairs at delta. A new accountant is one class and one registration."""

    name: str
    note: str

    def supports(self, event: Event) -> bool: ...

    def epsilon(self, history: History, delta: float) -> float: ...


class RdpAccountant:
    """Renyi DP composed over the history at ``RDP_ORDERS`` (RDP adds up across steps), converted
    to (epsilon, delta) with the improved conversion (Balle et al. 2020, Thm. 21). It composes
    every registered event kind."""

    name = "rdp"
    note = ("Renyi DP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019), dp-accounting "
            "RdpAccountant, orders up to >= 1024, improved conversion (Balle et al. 2020)")

    def supports(self, event: Event) -> bool:
        return event.kind in EVENT_KINDS

    def epsilon(self, history: History, delta: float) -> float:
        total = sum(count * _rdp_per_step(event) for event, count in history)
        return rdp_to_epsilon(total, delta)


class PldAccountant:
    """Privacy loss distributions composed over the history (tight up to discretisation)."""

    name = "pld"
    note = "privacy loss distribution, dp-accounting PLDAccountant (tight up to discretisation)"

    def supports(self, event: Event) -> bool:
        """The kinds whose dp-accounting event has a privacy loss distribution (not zCDP, not the
        private search: their ``pld`` attribute is False)."""
        return event.kind in EVENT_KINDS and getattr(EVENT_KINDS.get(event.kind), "pld", True)

    def epsilon(self, history: History, delta: float) -> float:
        """The PLD epsilon, read from the accounting cache when this history and delta were
        computed before (:mod:`dptrain.privacy.cache`), else composed here and stored."""
        payload = json.dumps([[[e.kind, list(e.params), int(c)] for e, c in history], float(delta),
                              PLD_DISCRETIZATION])
        cached = cache.load(self.name, payload, length=1)
        if cached is not None:
            return cached[0]
        eps = max(0.0, float(_pld_composed(history).get_epsilon(delta)))
        cache.store(self.name, payload, [eps])
        return eps


def rdp_to_epsilon(rdp: np.ndarray, delta: float) -> float:
    """min over ``RDP_ORDERS`` of r + log(1 - 1/a) - log(delta a) / (a - 1) (Balle et al. 2020,
    Prop. 12; what dp-accounting's ``compute_epsilon`` computes), floored at 0.

    One difference: dp-accounting returns epsilon 0 as soon as delta >= sqrt(1 - exp(-r)) at
    some order (a total-variation bound). That certifies (0, delta)-DP for a noise multiplier in
    the tens of thousands, which is valid but useless: calibrating a tiny target with it jumps to
    that sigma (sigma 56,087 for a target of 0.001 where PLD needs 2,369). Here a finite noise
    multiplier always gets the conversion's positive epsilon; a tiny RDP value that came out
    negative through rounding counts as 0."""
    orders = np.asarray(RDP_ORDERS)
    r = np.maximum(np.asarray(rdp, dtype=np.float64), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = r + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    return float(max(0.0, eps.min()))


#: the two accountants that ship (objects: code names them by these, never by a string)
RDP: Accountant = RdpAccountant()
PLD: Accountant = PldAccountant()
ACCOUNTANTS: Registry = Registry("accountant", setting="privacy.accountant")
ACCOUNTANTS.register(RDP.name, RDP)
ACCOUNTANTS.register(PLD.name, PLD)
#: the accountants every report shows (beside the headline one, if it is another)
REPORTED: tuple[Accountant, ...] = (RDP, PLD)
#: the default headline accountant (``privacy.accountant``'s default), and the one that composes
#: every registered event kind and plans cheaply (cached per event; PLD is at most it)
DEFAULT: Accountant = RDP


def accountant_named(accountant: Accountant | str) -> Accountant:
    """The registered accountant object of ``accountant`` (an object, or its registered name: the
    ``privacy.accountant`` setting)."""
    if isinstance(accountant, str) and accountant in ACCOUNTANTS:
        return ACCOUNTANTS.get(accountant)
    if not isinstance(accountant, str) and getattr(accountant, "name", None) in ACCOUNTANTS:
        return accountant
    raise _bad("accountant", accountant, f"must be one of {tuple(ACCOUNTANTS.names())}")


def _check_accountant(accountant: Any) -> Accountant:
    return accountant_named(accountant)


@functools.lru_cache(maxsize=1024)
def _rdp_per_step(event: Event) -> np.ndarray:
    """RDP of ONE step of ``event`` at each of RDP_ORDERS (read-only array): from the accounting
    cache when this event was computed before (:mod:`dptrain.privacy.cache`), else by
    dp-accounting (imported here, the accounting's one heavy boundary) and stored."""
    payload = json.dumps([event.kind, list(event.params), list(RDP_ORDERS)])
    cached = cache.load("rdp", payload, length=len(RDP_ORDERS))
    if cached is None:
        from dp_accounting import rdp as _rdp

        acc = _rdp.RdpAccountant(list(RDP_ORDERS))  # add/remove neighbours (its default)
        acc.compose(EVENT_KINDS.get(event.kind).dp_event(event.params), 1)
        cached = [float(v) for v in acc.rdp]
        cache.store("rdp", payload, cached)
    vec = np.asarray(cached, dtype=np.float64)
    vec.setflags(write=False)
    return vec


@functools.lru_cache(maxsize=8)
def _pld_composed(history: History) -> _pld.PLDAccountant:
    from dp_accounting import pld as _pld
    acc = _pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    for event, count in history:
        acc.compose(EVENT_KINDS.get(event.kind).dp_event(event.params), count)
    return acc


def compact(history: History) -> History:
    """The same composition with each distinct event once (its counts added; first-occurrence
    order). Both accountants compose a multiset: RDP adds per-event divergences and PLD convolves,
    both commutative, and adaptive composition's bound does not depend on the order. A history
    whose events alternate (DP-SGD steps and the steps that also release a dp/ curve) stays two
    entries long for the accountants."""
    totals: dict[Event, int] = {}
    for event, count in history:
        totals[event] = totals.get(event, 0) + count
    return tuple(totals.items())


def supports(accountant: Accountant, event: Event) -> bool:
    """Whether ``accountant`` composes ``event``: its ``supports`` when it has one; an accountant
    without it (a plugin's ``name`` and ``epsilon`` only) is taken to compose every event."""
    check = getattr(accountant, "supports", None)
    return True if check is None else bool(check(event))


def _epsilon(history: History, delta: float, accountant: Accountant) -> float:
    """Epsilon of a validated history by ``accountant``: 0 when no step touched data, infinite
    when one had no noise; an event the accountant does not support is refused by name."""
    active = tuple((e, c) for e, c in compact(history) if c > 0 and EVENT_KINDS.get(e.kind).spends(e.params))
    if not active:
        return 0.0
    if any(EVENT_KINDS.get(e.kind).unbounded(e.params) for e, _ in active):
        return math.inf
    for event, _ in active:
        if not supports(accountant, event):
            raise _bad("accountant", accountant.name, f"does not compose the event {event.kind!r}; allowed: "
                       + ", ".join(n for n in ACCOUNTANTS.names() if supports(ACCOUNTANTS.get(n), event)))
    return accountant.epsilon(active, delta)


def _one_run(sigma: float, q: float, steps: int) -> History:
    return ((poisson_gaussian(sample_rate=q, noise_multiplier=sigma), steps),)


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
    return _epsilon(_one_run(*_segment(noise_multiplier, sample_rate, steps)), _check_delta(delta), RDP)


def pld_epsilon(*, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` Poisson-subsampled Gaussian steps by PLD accounting (tight).

    Uses ``dp_accounting.pld.PLDAccountant`` (value discretisation interval
    ``PLD_DISCRETIZATION`` = 1e-4, pessimistic estimates), whose epsilon upper-bounds the exact
    one within its discretisation error (which grows slowly with the number of steps).
    Cost: ~0.3-0.5 s per new (q, sigma, steps); the composed PLD is cached.

    Args, returns and errors as :func:`rdp_epsilon`.
    """
    return _epsilon(_one_run(*_segment(noise_multiplier, sample_rate, steps)), _check_delta(delta), PLD)


def compute_epsilon(
    *, accountant: Accountant | str, sample_rate: float, noise_multiplier: float, steps: int, delta: float
) -> float:
    """Epsilon of ``steps`` identical DP-SGD steps by the registered ``accountant``."""
    return _epsilon(_one_run(*_segment(noise_multiplier, sample_rate, steps)), _check_delta(delta),
                    _check_accountant(accountant))


def history_epsilon(history: History, *, delta: float, accountant: Accountant | str = DEFAULT) -> float:
    """Epsilon of a history of (event, count) pairs (e.g. a planned run) by ``accountant`` (an
    object, or a registered name)."""
    for event, count in history:
        event_from_list(event.as_list())
        _check_steps(count, "count")
    return _epsilon(tuple(history), _check_delta(delta), _check_accountant(accountant))


def rdp_curve(history: History) -> np.ndarray:
    """The composed RDP of a history at each of ``RDP_ORDERS`` (add/remove neighbours)."""
    return sum(count * _rdp_per_step(event) for event, count in history)


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant | str = DEFAULT,
    rtol: float = 1e-3,
) -> float:
    """Smallest noise multiplier whose epsilon is <= ``target_epsilon``.

    The returned sigma satisfies epsilon(sigma) <= target_epsilon (evaluated, not assumed) and
    sigma / (1 + rtol) does not (up to the accountant's monotonicity), i.e. it is the smallest
    such sigma to RELATIVE tolerance ``rtol``. Searched in [1e-2, 1e6]; if even sigma = 1e-2
    meets the target, 1e-2 is returned. For "pld" the RDP answer seeds the bracket (PLD is
    tighter), ~10 PLD evaluations (a few seconds). The search is the project's one calibration
    routine, :func:`dptrain.privacy.calibration.smallest_noise`.

    Args:
        target_epsilon: Target epsilon > 0.
        sample_rate: Poisson sampling probability q in [0, 1].
        steps: Number of steps T >= 0.
        delta: Target delta in (0, 1).
        accountant: a registered accountant (object or name).
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
    if accountant is RDP and target <= rdp_floor(delta):
        raise _bad("target_epsilon", target_epsilon, _rdp_floor_advice(target, q, steps, delta, rtol))

    def eps(sigma: float) -> float:
        return _epsilon(_one_run(sigma, q, steps), delta, accountant)

    start, factor = 1.0, 4.0  # other accountants start from the RDP sigma (PLD is tighter: a little less)
    if accountant is not RDP and target > rdp_floor(delta):
        with contextlib.suppress(AccountingError):
            start, factor = calibrate_noise_multiplier(
                target_epsilon=target, sample_rate=q, steps=steps, delta=delta, rtol=rtol), math.exp(0.2)
    try:
        return smallest_noise(eps, target=target, rtol=rtol, lower=_SIGMA_MIN, upper=_SIGMA_MAX, start=start,
                              factor=factor)
    except Unreachable:
        raise _bad("target_epsilon", target_epsilon,
                   f"unreachable with noise_multiplier <= {_SIGMA_MAX:g} (q={q}, steps={steps}, delta={delta}, "
                   f"accountant={accountant.name!r})") from None


def rdp_floor(delta: float) -> float:
    """The smallest epsilon RDP accounting (orders up to 1024) certifies at ``delta`` whatever the
    noise: the conversion's value at zero Renyi divergence."""
    return rdp_to_epsilon([0.0] * len(RDP_ORDERS), delta)


def _rdp_floor_advice(target: float, q: float, steps: int, delta: float, rtol: float) -> str:
    """Why an RDP target is unreachable and what to do. (The PLD noise multiplier is not computed
    here: for extreme settings, 1e6 steps and more, a PLD composition needs gigabytes.)"""
    return (f"RDP accounting (orders up to {RDP_ORDERS[-1]:g}) cannot certify an epsilon below "
            f"{rdp_floor(delta):.4g} at delta={delta:g}, whatever the noise (q={q:g}, steps={steps}); allowed: a "
            "larger target, or privacy.accountant=pld, which is tight and certifies smaller epsilons")


class PrivacyLedger:
    """The ledger of a run's privacy events (not an accountant: it computes nothing). Records
    history only: (event, count) pairs in order, consecutive identical events merged. Epsilon is
    composed from the whole history on demand by any registered accountant (from the
    count of each distinct event, kept as events are recorded: see :func:`compact`)."""

    def __init__(self) -> None:
        self._events: list[tuple[Event, int]] = []
        self._totals: dict[Event, int] = {}

    def record(self, event: Event, num_steps: int = 1) -> None:
        """Records ``num_steps`` steps of ``event``; 0 steps is a no-op."""
        n = _check_steps(num_steps, "num_steps")
        if event.kind == "poisson_gaussian":
            _segment(event.params[1], event.params[0], n, "num_steps")
        if n == 0:
            return
        if self._events and self._events[-1][0] == event:
            self._events[-1] = (event, self._events[-1][1] + n)
        else:
            self._events.append((event, n))
        self._totals[event] = self._totals.get(event, 0) + n

    def step(self, *, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Records ``num_steps`` DP-SGD steps at (noise_multiplier, sample_rate)."""
        sigma, q, n = _segment(noise_multiplier, sample_rate, num_steps, "num_steps")
        self.record(poisson_gaussian(sample_rate=q, noise_multiplier=sigma), n)

    @property
    def events(self) -> History:
        """(event, count) pairs in order."""
        return tuple(self._events)

    @property
    def totals(self) -> History:
        """Each distinct event once with its total count (first-occurrence order): what the
        accountants compose."""
        return tuple(self._totals.items())

    def count(self, event: Event) -> int:
        """How many steps of ``event`` were recorded."""
        return self._totals.get(event, 0)

    @property
    def steps(self) -> int:
        """Total number of recorded steps."""
        return sum(self._totals.values())

    @property
    def history(self) -> tuple[Segment, ...]:
        """The DP-SGD view: (noise_multiplier, sample_rate, steps) per run of identical
        ``poisson_gaussian`` events (other kinds are not shown here; see :attr:`events`)."""
        return tuple((e.params[1], e.params[0], c) for e, c in self._events if e.kind == "poisson_gaussian")

    def get_epsilon(self, *, delta: float, accountant: Accountant | str = DEFAULT) -> float:
        """Epsilon of the composition of all recorded events at ``delta``."""
        return _epsilon(self.totals, _check_delta(delta), _check_accountant(accountant))

    def state_dict(self) -> dict:
        """Serialisable state: ``{"events": [[kind, [params...], count], ...]}``."""
        return {"events": [[*e.as_list(), c] for e, c in self._events]}

    def load_state_dict(self, state: dict) -> None:
        """Restores the full history from :meth:`state_dict` output (validated, re-merged); the
        earlier format ``{"history": [[sigma, q, steps], ...]}`` is read too."""
        restored = PrivacyLedger()
        if isinstance(state, dict) and "events" in state:
            for item in state["events"]:
                if not isinstance(item, (list, tuple)) or len(item) != 3:
                    raise _bad("state['events'] item", item, "must be [kind, [params], count]")
                try:
                    event = event_from_list(item[:2])
                except (ValueError, TypeError, DPTrainError) as err:
                    raise _bad("state['events'] item", item, str(err)) from None
                restored.record(event, item[2])
        elif isinstance(state, dict) and "history" in state:
            for seg in state["history"]:
                if not isinstance(seg, (list, tuple)) or len(seg) != 3:
                    raise _bad("state['history'] segment", seg, "must be [sigma, q, steps]")
                restored.step(noise_multiplier=seg[0], sample_rate=seg[1], num_steps=seg[2])
        else:
            raise _bad("state", state, "must be a dict with an 'events' list")
        self._events, self._totals = restored._events, restored._totals

    def max_steps_within(self, *, max_epsilon: float, event: Event | None = None, delta: float,
                         accountant: Accountant | str = DEFAULT, limit: int,
                         events_for: Callable[[int], History] | None = None) -> int:
        """The largest k in [0, limit] such that this history plus k more steps has epsilon
        <= max_epsilon (a privacy budget). The k steps are ``event`` k times or, with
        ``events_for``, the history ``events_for(k)`` (e.g. a run whose logged steps, the last
        one included, also release a dp/ curve). Epsilon must grow with k (it does when
        ``events_for(k + 1)`` holds ``events_for(k)`` plus one more step), so a binary search
        over k is exact."""
        delta, accountant = _check_delta(delta), _check_accountant(accountant)
        if events_for is None:
            if event is None:
                raise _bad("event", event, "give the event of one step, or events_for")
            events_for = lambda k: ((event, k),)  # noqa: E731

        def eps_after(k: int) -> float:
            return _epsilon(self.totals + tuple(events_for(k)), delta, accountant)

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
