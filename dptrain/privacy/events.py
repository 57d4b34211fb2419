"""Privacy events: what one step of a mechanism spends, as a value the accountants compose.

An :class:`Event` is a kind and its parameters (plain floats, so a checkpoint stores it as data
and a new mechanism does not change the checkpoint format). Each kind is registered in
``EVENT_KINDS`` with the dp-accounting ``DpEvent`` it stands for, which the accountants (RDP and
PLD) compose where they can (``zcdp`` and ``private_search``: RDP only; ``epsilon_delta``, the
one-shot releases' pure and approximate DP: neither, it composes by basic composition). DP-SGD's
step is ``poisson_gaussian``: Poisson sampling with rate q of a Gaussian mechanism with noise
multiplier sigma, add/remove neighbours.

A new mechanism is a new kind: a class with ``params``, ``dp_event(params)``, ``spends(params)``
and ``unbounded(params)``, registered with ``EVENT_KINDS.register("name", ...)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dptrain.core.registry import Registry

if TYPE_CHECKING:
    import dp_accounting


@dataclass(frozen=True)
class Event:
    """One step's privacy event: ``kind`` (a name in ``EVENT_KINDS``) and its parameters."""

    kind: str
    params: tuple[float, ...]

    def as_list(self) -> list:
        return [self.kind, list(self.params)]


class PoissonGaussian:
    """Poisson-subsampled Gaussian: params (sample_rate q, noise_multiplier sigma)."""

    params = ("sample_rate", "noise_multiplier")

    @staticmethod
    def dp_event(params: tuple[float, ...]) -> dp_accounting.DpEvent:
        import dp_accounting  # here, not at the top: importing dptrain.privacy stays cheap

        q, sigma = params
        return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))

    @staticmethod
    def spends(params: tuple[float, ...]) -> bool:
        """False when the step touches no data (q = 0)."""
        return params[0] > 0.0

    @staticmethod
    def unbounded(params: tuple[float, ...]) -> bool:
        """True when the step has no finite epsilon (sigma = 0)."""
        return params[1] == 0.0


EVENT_KINDS: Registry = Registry("privacy event kind", setting="accountant event")
EVENT_KINDS.register("poisson_gaussian", PoissonGaussian)


def poisson_gaussian(*, sample_rate: float, noise_multiplier: float) -> Event:
    """The event of one DP-SGD step."""
    return Event("poisson_gaussian", (float(sample_rate), float(noise_multiplier)))


def event_from_list(item: list | tuple) -> Event:
    """Inverse of :meth:`Event.as_list` (for checkpoints); the kind must be registered."""
    kind, params = item
    spec = EVENT_KINDS.get(kind)
    params = tuple(float(p) for p in params)
    if len(params) != len(spec.params) or not all(math.isfinite(p) for p in params):
        raise ValueError(f"event {kind!r} needs {len(spec.params)} finite parameters {spec.params}, got {params}")
    return Event(kind, params)


class Gaussian:
    """One Gaussian mechanism on all the rows (no sampling): params (noise_multiplier,)."""

    params = ("noise_multiplier",)

    @staticmethod
    def dp_event(params: tuple[float, ...]) -> dp_accounting.DpEvent:
        import dp_accounting  # here, not at the top: importing dptrain.privacy stays cheap

        return dp_accounting.GaussianDpEvent(params[0])

    @staticmethod
    def spends(params: tuple[float, ...]) -> bool:
        return True

    @staticmethod
    def unbounded(params: tuple[float, ...]) -> bool:
        return params[0] == 0.0


EVENT_KINDS.register("gaussian", Gaussian)


def gaussian_event(noise_multiplier: float) -> Event:
    """The event of one Gaussian mechanism with noise std = noise_multiplier x L2 sensitivity."""
    return Event("gaussian", (float(noise_multiplier),))


class ZCDP:
    """A mechanism that is rho-zCDP (Bun and Steinke 2016): the discrete Gaussian on counts of L2
    sensitivity D at scale sigma (rho = D^2 / (2 sigma^2)), or a pure epsilon-DP one
    (rho = epsilon^2 / 2). Params (rho,). RDP accounting only (dp-accounting has no PLD of it)."""

    params = ("rho",)
    pld = False  # no privacy loss distribution: accountants that need one do not support it

    @staticmethod
    def dp_event(params: tuple[float, ...]) -> dp_accounting.DpEvent:
        import dp_accounting  # here, not at the top: importing dptrain.privacy stays cheap

        return dp_accounting.ZCDpEvent(params[0])

    @staticmethod
    def spends(params: tuple[float, ...]) -> bool:
        return params[0] > 0.0

    @staticmethod
    def unbounded(params: tuple[float, ...]) -> bool:
        return not math.isfinite(params[0])


EVENT_KINDS.register("zcdp", ZCDP)


def zcdp_event(rho: float) -> Event:
    """The event of a rho-zCDP mechanism."""
    return Event("zcdp", (float(rho),))


class EpsilonDelta:
    """A mechanism that is (epsilon, delta)-DP by its own proof, under the relation its mechanism
    states: the discrete Laplace on counts of L1 sensitivity 1 (delta 0), the stability-based
    histogram, an employer-employee mechanism's (alpha, epsilon[, delta])-ER-EE. Params (epsilon,
    delta). Such events compose by basic composition (the epsilons add up, and the deltas); the
    RDP and PLD accountants do not take them (dp-accounting has no PLD or RDP of an arbitrary
    (epsilon, delta) mechanism)."""

    params = ("epsilon", "delta")

    @staticmethod
    def dp_event(params: tuple[float, ...]) -> dp_accounting.DpEvent:
        import dp_accounting  # here, not at the top: importing dptrain.privacy stays cheap

        return dp_accounting.EpsilonDeltaDpEvent(params[0], params[1])

    @staticmethod
    def spends(params: tuple[float, ...]) -> bool:
        return params[0] > 0.0 or params[1] > 0.0

    @staticmethod
    def unbounded(params: tuple[float, ...]) -> bool:
        return not math.isfinite(params[0])


EVENT_KINDS.register("epsilon_delta", EpsilonDelta)


def epsilon_delta_event(epsilon: float, delta: float = 0.0) -> Event:
    """The event of an (epsilon, delta)-DP mechanism (:class:`EpsilonDelta`)."""
    return Event("epsilon_delta", (float(epsilon), float(delta)))


class PrivateSearch:
    """A private hyperparameter search (Papernot and Steinke 2022): a random number K of candidate
    trainings, each ``steps`` Poisson-subsampled Gaussian steps plus one Gaussian noisy score, the
    best one released; K follows the truncated negative binomial with ``mean`` and ``shape``
    (shape 0: logarithmic, 1: geometric). Params (sample_rate, noise_multiplier, steps,
    score_noise, mean, shape). RDP accounting only (dp-accounting has no PLD of it)."""

    params = ("sample_rate", "noise_multiplier", "steps", "score_noise", "mean", "shape")
    pld = False  # no privacy loss distribution: accountants that need one do not support it

    @staticmethod
    def dp_event(params: tuple[float, ...]) -> dp_accounting.DpEvent:
        import dp_accounting  # here, not at the top: importing dptrain.privacy stays cheap

        q, sigma, steps, score_noise, mean, shape = params
        one = dp_accounting.ComposedDpEvent([
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), int(steps)),
            dp_accounting.GaussianDpEvent(score_noise)])
        return dp_accounting.dp_event.RepeatAndSelectDpEvent(one, mean, shape)

    @staticmethod
    def spends(params: tuple[float, ...]) -> bool:
        return True

    @staticmethod
    def unbounded(params: tuple[float, ...]) -> bool:
        """No finite epsilon: a candidate's score without noise, or training steps without noise."""
        q, sigma, steps, score_noise = params[:4]
        return score_noise == 0.0 or (sigma == 0.0 and q > 0.0 and steps > 0)


EVENT_KINDS.register("private_search", PrivateSearch)


def private_search(*, sample_rate: float, noise_multiplier: float, steps: int, score_noise: float, mean: float,
                   shape: float) -> Event:
    """The event of a whole private search (:class:`PrivateSearch`)."""
    return Event("private_search", (float(sample_rate), float(noise_multiplier), float(steps), float(score_noise),
                                    float(mean), float(shape)))
