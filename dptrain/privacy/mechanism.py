"""The DP-SGD mechanism of one run, as a value.

:class:`DPSGDMechanism` is built once, from the privacy settings and the public N, and owns every
number the guarantee depends on: the noise multiplier sigma (given or calibrated), the clipping
norm C, the expected batch size B, N and so q = B/N, the planned steps, delta, the neighbour
relation and the accountant. Everything else reads it:

* :meth:`build_engine` builds the gradient engine with ITS sigma, C and B, so the noise applied
  is, by construction, the noise accounted;
* :attr:`event` is what the accountant records per step;
* :meth:`fingerprint` is what a checkpoint must match to be resumed;
* :meth:`report_fields` feed the privacy report.

``apply_noise=False`` exists for one purpose: the privacy audit's deliberately broken run, whose
engine adds no noise while the accountant still records sigma (its report says so loudly).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from dptrain.neighbours import Neighbours
from dptrain.privacy.events import Event, poisson_gaussian

log = logging.getLogger(__name__)


def planned_steps(*, epochs: float, sample_rate: float) -> int:
    """The number of steps of a run: epochs / q rounded, at least 1 (the one formula)."""
    return max(1, round(epochs / sample_rate))


@dataclass(frozen=True)
class DPSGDMechanism:
    """Poisson-sampled DP-SGD with flat clipping and Gaussian noise (or, with ``enabled=False``,
    the same pipeline without clipping or noise, which claims nothing)."""

    enabled: bool
    noise_multiplier: float
    max_grad_norm: float
    expected_batch_size: int
    dataset_size: int
    planned_steps: int
    delta: float
    accountant: str
    noise_multiplier_source: str = "config"  # config | calibrated | off
    target_epsilon: float | None = None
    neighbours: Neighbours = Neighbours.ADD_REMOVE
    apply_noise: bool = field(default=True)
    advice: str | None = None  # e.g. a tighter accountant that needs far less noise for the target

    @property
    def sample_rate(self) -> float:
        """q = B / N (Poisson sampling probability of every row)."""
        return self.expected_batch_size / self.dataset_size

    @property
    def event(self) -> Event:
        """The privacy event of one step (what the accountant records)."""
        return poisson_gaussian(sample_rate=self.sample_rate, noise_multiplier=self.noise_multiplier)

    @property
    def private(self) -> bool:
        """True when the run adds noise and so has a finite epsilon."""
        return self.enabled and self.noise_multiplier > 0 and self.apply_noise

    @classmethod
    def from_settings(cls, privacy: Any, *, epochs: float, expected_batch_size: int, dataset_size: int,
                      delta: float) -> DPSGDMechanism:
        """The mechanism of a run from its ``privacy`` settings and the public N: the planned steps
        follow from epochs and q; sigma is ``privacy.noise_multiplier`` or calibrated to
        ``privacy.target_epsilon`` (the smallest sigma whose epsilon is within the target)."""
        q = expected_batch_size / dataset_size
        steps = planned_steps(epochs=epochs, sample_rate=q)
        if not privacy.enabled:
            return cls(enabled=False, noise_multiplier=0.0, max_grad_norm=math.inf,
                       expected_batch_size=expected_batch_size, dataset_size=dataset_size, planned_steps=steps,
                       delta=delta, accountant=privacy.accountant, noise_multiplier_source="off")
        sigma, source, advice = privacy.noise_multiplier, "config", None
        if sigma is None:
            from dptrain.privacy.accounting import calibrate_noise_multiplier

            sigma, source = calibrate_noise_multiplier(
                target_epsilon=privacy.target_epsilon, sample_rate=q, steps=steps, delta=delta,
                accountant=privacy.accountant, rtol=privacy.calibration_rtol), "calibrated"
            log.info("calibrated noise_multiplier=%.6g for target_epsilon=%g (accountant=%s, q=%.6g, steps=%d, "
                     "delta=%g)", sigma, privacy.target_epsilon, privacy.accountant, q, steps, delta)
            advice = _tighter_accountant_advice(privacy, sigma=sigma, q=q, steps=steps, delta=delta)
        return cls(enabled=True, noise_multiplier=float(sigma), max_grad_norm=float(privacy.max_grad_norm),
                   expected_batch_size=expected_batch_size, dataset_size=dataset_size, planned_steps=steps,
                   delta=delta, accountant=privacy.accountant, noise_multiplier_source=source,
                   target_epsilon=privacy.target_epsilon, advice=advice)

    def without_noise(self) -> DPSGDMechanism:
        """The audit's deliberately broken copy: the engine adds no noise, the accountant still
        records this mechanism's sigma. NO guarantee."""
        return replace(self, apply_noise=False)

    def build_engine(self, model: Any, *, engine: str, generator: Any, objective: Any = None) -> Any:
        """The gradient engine that applies THIS mechanism (sigma, C, B) to ``model``."""
        from dptrain.privacy.engine import make_engine

        return make_engine(model, engine=engine if self.enabled else "nonprivate", max_grad_norm=self.max_grad_norm,
                           noise_multiplier=self.noise_multiplier if self.apply_noise else 0.0,
                           expected_batch_size=self.expected_batch_size, generator=generator, objective=objective)

    def fingerprint(self, **extra: Any) -> dict[str, Any]:
        """What a checkpoint must match to be resumed (the mechanism its history describes)."""
        return {
            "enabled": self.enabled, "noise_multiplier": self.noise_multiplier if self.enabled else 0.0,
            "max_grad_norm": self.max_grad_norm if self.enabled else None, "sample_rate": self.sample_rate,
            "expected_batch_size": self.expected_batch_size, "dataset_size": self.dataset_size,
            "delta": self.delta if self.enabled else None, "planned_steps": self.planned_steps,
            "accountant": self.accountant if self.enabled else None, **extra,
        }

    def report_fields(self) -> dict[str, Any]:
        """The mechanism's part of the privacy report."""
        return {
            "enabled": self.enabled, "noise_multiplier": self.noise_multiplier,
            "noise_multiplier_source": self.noise_multiplier_source, "target_epsilon": self.target_epsilon,
            "max_grad_norm": self.max_grad_norm, "sample_rate": self.sample_rate,
            "expected_batch_size": self.expected_batch_size, "dataset_size": self.dataset_size,
            "planned_steps": self.planned_steps, "delta": self.delta, "neighbours": self.neighbours.value,
            "noise_applied": self.apply_noise, "accountant_advice": self.advice,
        }


#: below this target epsilon, a run calibrated with RDP also asks PLD how much noise it needs
TINY_TARGET = 0.1
MAX_ADVICE_STEPS = 100_000  # a PLD calibration beyond this many steps costs too much time and memory


def _tighter_accountant_advice(privacy: Any, *, sigma: float, q: float, steps: int, delta: float) -> str | None:
    """At a tiny target calibrated by RDP, the PLD accountant often certifies the same epsilon
    with far less noise (RDP's conversion has a floor near 0.0035 at delta 1e-5): say so when it
    needs less than 80% of the noise."""
    if privacy.accountant != "rdp" or privacy.target_epsilon >= TINY_TARGET or steps > MAX_ADVICE_STEPS:
        return None
    from dptrain.privacy.accounting import AccountingError, calibrate_noise_multiplier

    try:
        tight = calibrate_noise_multiplier(target_epsilon=privacy.target_epsilon, sample_rate=q, steps=steps,
                                           delta=delta, accountant="pld", rtol=privacy.calibration_rtol)
    except AccountingError:
        return None
    if tight >= 0.8 * sigma:
        return None
    text = (f"privacy.accountant=pld certifies target_epsilon={privacy.target_epsilon:g} with noise_multiplier "
            f"{tight:.4g}, {sigma / tight:.1f}x less noise than RDP's {sigma:.4g}: consider privacy.accountant=pld")
    log.warning("%s", text)
    return text
