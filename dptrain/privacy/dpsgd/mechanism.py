"""The DP-SGD mechanism of one run, as a value.

:class:`DPSGDMechanism` is built once, from the privacy settings and the public N, and owns every
number the guarantee depends on: the noise multiplier sigma (given or calibrated), the clipping
norm C, the expected batch size B, N and so q = B/N, the planned steps, delta, the neighbour
relation and the accountant. Everything else reads it:

* :meth:`build_engine` builds the gradient engine with ITS sigma, C and B, so the noise applied
  is, by construction, the noise accounted;
* :attr:`event` is what the accountant records per step (:meth:`event_at`: a step that also
  releases the dp/ curve records :attr:`curve_event`, see :mod:`dptrain.privacy.curves`);
* :meth:`release_curve` releases that curve's value with ITS sigma_c and L;
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

from dptrain.core.neighbours import Neighbours
from dptrain.core.validation import ConfigError
from dptrain.privacy.accounting import PLD, RDP, AccountingError, accountant_named, calibrate_noise_multiplier
from dptrain.privacy.budget import Budget
from dptrain.privacy.curves import (
    TAG,
    CurveConfig,
    CurveMechanism,
    curve_noise_multiplier,
    fill_target,
    joint_noise_multiplier,
    releases_between,
)
from dptrain.privacy.curves import history_between as _history_between
from dptrain.privacy.dpsgd import engine as engines  # engines.make_engine: looked up per call (mutation tests wrap it)
from dptrain.privacy.dpsgd.units import UnitBound
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
    curve: CurveMechanism | None = None  # the dp/ training-loss curve (dptrain.privacy.curves), or None
    #: person-level DP-SGD (dptrain.privacy.dpsgd.units): N, B and q count UNITS; None: rows
    unit: UnitBound | None = None

    @property
    def sample_rate(self) -> float:
        """q = B / N (Poisson sampling probability of every row; of every unit with a unit)."""
        return self.expected_batch_size / self.dataset_size

    @property
    def event(self) -> Event:
        """The privacy event of one step (what the accountant records)."""
        return poisson_gaussian(sample_rate=self.sample_rate, noise_multiplier=self.noise_multiplier)

    @property
    def curve_event(self) -> Event | None:
        """The event of a step that also releases the dp/ curve on its batch: one Gaussian of
        noise multiplier (sigma^-2 + sigma_c^-2)^(-1/2) (dptrain.privacy.curves); None without a curve."""
        if self.curve is None:
            return None
        return poisson_gaussian(sample_rate=self.sample_rate,
                                noise_multiplier=joint_noise_multiplier(self.noise_multiplier,
                                                                        self.curve.noise_multiplier))

    def curve_due(self, step: int, *, last: int) -> bool:
        """True when ``step`` releases the dp/ curve (``last``: the run's last step)."""
        return self.curve is not None and self.curve.due(step, last=last)

    def event_at(self, step: int, *, last: int) -> Event:
        """What the accountant records for ``step`` of a run whose last step is ``last``."""
        return self.curve_event if self.curve_due(step, last=last) else self.event

    def history_between(self, start: int, end: int) -> tuple[tuple[Event, int], ...]:
        """The events of steps start + 1 .. end when ``end`` is the last step (for budgets)."""
        c = self.curve
        return _history_between(sigma=self.noise_multiplier, sigma_c=None if c is None else c.noise_multiplier,
                                sample_rate=self.sample_rate, start=start, end=end,
                                log_every=1 if c is None else c.log_every)

    @property
    def curve_noise_std(self) -> float:
        """SD of the noise on the released dp/ curve value: sigma_c L / B (0 without a curve)."""
        c = self.curve
        return 0.0 if c is None else c.noise_multiplier * c.loss_bound / self.expected_batch_size

    def release_curve(self, bounded_loss_sum: float, rng: Any) -> float:
        """dp/train_loss: (sum_i min(loss_i, L) + N(0, (sigma_c L)^2)) / B, one standard normal
        drawn from ``rng`` (a secret stream; the loop uses one per step)."""
        if self.curve is None:
            raise ValueError("this mechanism releases no dp/ curve (trainer.dp_curves=false or no privacy)")
        return bounded_loss_sum / self.expected_batch_size + self.curve_noise_std * float(rng.standard_normal())

    @property
    def private(self) -> bool:
        """True when the run adds noise and so has a finite epsilon."""
        return self.enabled and self.noise_multiplier > 0 and self.apply_noise

    @classmethod
    def from_budget(cls, budget: Budget, *, max_grad_norm: float, epochs: float, expected_batch_size: int,
                    dataset_size: int, delta: float, curves: CurveConfig | None = None,
                    quiet: bool = False) -> DPSGDMechanism:
        """The mechanism of DP-SGD's ``budget`` (its part of the run's: :attr:`Budget.dpsgd`), the
        clipping norm and the public N: the planned steps follow from epochs and q; sigma is the
        budget's noise multiplier or calibrated to its target (the smallest sigma whose epsilon is
        within it).
        ``curves``: the run also releases the dp/ training-loss curve (dptrain.privacy.curves):
        sigma_c is derived from sigma and the budget share, and a target epsilon covers both.
        ``quiet``: the calibration's line goes to the log at DEBUG (a caller that may not use this
        mechanism says what it uses: :meth:`calibration_line`). Person-level DP-SGD: N and B count
        units, and :meth:`per_unit` records the unit."""
        q = expected_batch_size / dataset_size
        steps = planned_steps(epochs=epochs, sample_rate=q)
        if not budget.enabled:
            return cls(enabled=False, noise_multiplier=0.0, max_grad_norm=math.inf,
                       expected_batch_size=expected_batch_size, dataset_size=dataset_size, planned_steps=steps,
                       delta=delta, accountant=budget.accountant, noise_multiplier_source="off")
        sigma, source, advice = budget.noise_multiplier, "config", None
        if sigma is None:
            sigma, advice = _calibrate(budget, q=q, steps=steps, delta=delta, curves=curves, quiet=quiet)
            source = "calibrated"
        curve = _curve(budget, curves, sigma=float(sigma), q=q, steps=steps, delta=delta)
        return cls(enabled=True, noise_multiplier=float(sigma), max_grad_norm=float(max_grad_norm),
                   expected_batch_size=expected_batch_size, dataset_size=dataset_size, planned_steps=steps,
                   delta=delta, accountant=budget.accountant, noise_multiplier_source=source,
                   target_epsilon=budget.target, advice=advice, curve=curve)

    def per_unit(self, unit: UnitBound | None) -> DPSGDMechanism:
        """This mechanism with its unit of privacy (N, B and q already count units); None: per row."""
        return self if unit is None else replace(self, unit=unit)

    def calibration_line(self, budget: Budget) -> str | None:
        """The console's line on a calibrated sigma: the run's whole ``budget`` first, then the
        shares as shares of it (:meth:`Budget.describe`). None for a sigma that was given."""
        if self.noise_multiplier_source != "calibrated":
            return None
        curve = self.curve.budget_share if self.curve is not None else 0.0
        return (f"calibrated noise_multiplier={self.noise_multiplier:.6g} for {budget.describe(curve=curve)}; "
                f"q={self.sample_rate:.6g}, steps={self.planned_steps}, delta={self.delta:g}")

    def without_noise(self) -> DPSGDMechanism:
        """The audit's deliberately broken copy: the engine adds no noise, the accountant still
        records this mechanism's sigma. NO guarantee."""
        return replace(self, apply_noise=False)

    def build_engine(self, model: Any, *, engine: str, generator: Any, objective: Any = None) -> Any:
        """The gradient engine that applies THIS mechanism (sigma, C, B) to ``model`` (and, with a
        dp/ curve, computes each logged step's loss sum clipped to ITS L)."""
        built = engines.make_engine(model, engine=engine if self.enabled else "nonprivate",
                                    max_grad_norm=self.max_grad_norm,
                                    noise_multiplier=self.noise_multiplier if self.apply_noise else 0.0,
                                    expected_batch_size=self.expected_batch_size, generator=generator,
                                    objective=objective)
        if self.curve is not None:  # the dp/ curve's input: each step's sum of losses clipped to L
            built.curve_loss_bound = self.curve.loss_bound
        return built

    def fingerprint(self, **extra: Any) -> dict[str, Any]:
        """What a checkpoint must match to be resumed (the mechanism its history describes). The
        dp/ curve's fields are None without a curve, as in checkpoints written before curves."""
        c = self.curve
        return {
            "enabled": self.enabled, "noise_multiplier": self.noise_multiplier if self.enabled else 0.0,
            "max_grad_norm": self.max_grad_norm if self.enabled else None, "sample_rate": self.sample_rate,
            "expected_batch_size": self.expected_batch_size, "dataset_size": self.dataset_size,
            "delta": self.delta if self.enabled else None, "planned_steps": self.planned_steps,
            "accountant": self.accountant if self.enabled else None,
            "curve_noise_multiplier": None if c is None else c.noise_multiplier,
            "curve_loss_bound": None if c is None else c.loss_bound,
            "curve_log_every": None if c is None else c.log_every,
            **({} if self.unit is None else {"unit_of_privacy": self.unit.report()}), **extra,
        }

    def report_fields(self) -> dict[str, Any]:
        """The mechanism's part of the privacy report (the dp/ curve's: :meth:`curve_report`)."""
        return {
            "enabled": self.enabled, "noise_multiplier": self.noise_multiplier,
            "noise_multiplier_source": self.noise_multiplier_source, "target_epsilon": self.target_epsilon,
            "max_grad_norm": self.max_grad_norm, "sample_rate": self.sample_rate,
            "expected_batch_size": self.expected_batch_size, "dataset_size": self.dataset_size,
            "planned_steps": self.planned_steps, "delta": self.delta, "neighbours": self.neighbours.value,
            "noise_applied": self.apply_noise, "accountant_advice": self.advice, "dp_curves": self.curve_report(),
            "unit_of_privacy": None if self.unit is None else self.unit.report(),
        }

    def _curve_statistic(self) -> str:
        """What the dp/ curve's value is: per row, or (person-level) per unit."""
        if self.unit is None:
            return ("(sum over the step's Poisson batch of min(loss_i, L) + N(0, (sigma_c L)^2)) / B, each "
                    "example's loss clipped into [0, L], B the expected batch size")
        return (f"(sum over the step's Poisson batch of {self.unit.column}s of min(sum over the {self.unit.column}'s "
                f"rows of w_i min(loss_i, L), L) + N(0, (sigma_c L)^2)) / B, w_i the rows' combination weights "
                f"({self.unit.combine}), each {self.unit.column} adding at most L, B the expected number of "
                f"{self.unit.column}s")

    def curve_report(self, releases: int | None = None) -> dict[str, Any] | None:
        """The dp/ curve's part of the report (None without a curve): ``releases`` is how many
        values the run released (default: as planned)."""
        c = self.curve
        if c is None:
            return None
        return {
            "tags": [TAG], "covered": True, "statistic": self._curve_statistic(),
            "noise_multiplier": c.noise_multiplier, "loss_bound": c.loss_bound,
            "loss_bound_source": c.loss_bound_source, "noise_std": self.curve_noise_std,
            "log_every": c.log_every, "budget_share": c.budget_share,
            "releases": c.planned_releases if releases is None else int(releases),
            "planned_releases": c.planned_releases,
            "joint_noise_multiplier": joint_noise_multiplier(self.noise_multiplier, c.noise_multiplier),
            "accounting": "each logged step releases the curve on the gradient's Poisson batch: the pair is one "
            "Gaussian mechanism, recorded as one Poisson-subsampled Gaussian step with noise multiplier "
            "(sigma^-2 + sigma_c^-2)^(-1/2) instead of sigma; every epsilon of this report includes it",
        }


def _calibrate(privacy: Budget, *, q: float, steps: int, delta: float, curves: CurveConfig | None,
               quiet: bool = False) -> tuple[float, str | None]:
    """(sigma calibrated to the budget's target, advice). With a dp/ curve the gradients
    get (1 - s) of the target and the curve the rest (dptrain.privacy.curves)."""
    target = privacy.gradients(curves.budget_share if curves is not None else 0.0)
    try:
        sigma = calibrate_noise_multiplier(target_epsilon=target, sample_rate=q, steps=steps, delta=delta,
                                           accountant=privacy.accountant, rtol=privacy.rtol)
    except AccountingError as err:
        if curves is None:
            raise
        raise ConfigError(
            f"privacy.target_epsilon (DP-SGD's part: {privacy.target!r}) is not allowed with the dp/ curve "
            f"(trainer.curve_budget_share={curves.budget_share:g}: the gradients get epsilon {target:.6g}): {err}; "
            "allowed: a larger target, or trainer.dp_curves=false") from None
    log.log(logging.DEBUG if quiet else logging.INFO,
            "calibrated noise_multiplier=%.6g for DP-SGD's epsilon %g (accountant=%s, q=%.6g, steps=%d, delta=%g%s)",
            sigma, privacy.target, privacy.accountant, q, steps, delta,
            f"; the gradients' share {target:.6g}, the dp/ curve the rest" if curves is not None else "")
    return sigma, _tighter_accountant_advice(privacy, sigma=sigma, q=q, steps=steps, delta=delta, target=target)


def _curve(privacy: Budget, curves: CurveConfig | None, *, sigma: float, q: float, steps: int,
           delta: float) -> CurveMechanism | None:
    """The dp/ curve of a private run (None without ``curves`` or without noise: sigma = 0 has
    no finite epsilon to share)."""
    if curves is None or sigma <= 0:
        return None
    sigma_c = curve_noise_multiplier(sigma=sigma, sample_rate=q, steps=steps, log_every=curves.log_every,
                                     share=curves.budget_share, delta=delta, rtol=privacy.rtol)
    headline = accountant_named(privacy.accountant)
    if privacy.noise_multiplier is None and headline is not RDP:  # the target, by the headline accountant
        sigma_c = fill_target(sigma_c, target_epsilon=privacy.target, delta=delta,
                              accountant=privacy.accountant,
                              history_of=lambda x: _history_between(sigma=sigma, sigma_c=x, sample_rate=q, start=0,
                                                                    end=steps, log_every=curves.log_every))
    k = releases_between(0, steps, curves.log_every)
    log.info("dp/ curve: sigma_c=%.6g, L=%g (%s), %d planned releases, budget share %g", sigma_c,
             curves.loss_bound, curves.loss_bound_source, k, curves.budget_share, extra={"console": False})
    return CurveMechanism(noise_multiplier=sigma_c, loss_bound=curves.loss_bound, log_every=curves.log_every,
                          budget_share=curves.budget_share, loss_bound_source=curves.loss_bound_source,
                          planned_releases=k)


#: below this target epsilon, a run calibrated with RDP also asks PLD how much noise it needs
TINY_TARGET = 0.1
MAX_ADVICE_STEPS = 100_000  # a PLD calibration beyond this many steps costs too much time and memory


def _tighter_accountant_advice(privacy: Budget, *, sigma: float, q: float, steps: int, delta: float,
                               target: float) -> str | None:
    """At a tiny target calibrated by RDP, the PLD accountant often certifies the same epsilon
    with far less noise (RDP's conversion has a floor near 0.0035 at delta 1e-5): say so when it
    needs less than 80% of the noise. ``target``: the gradients' epsilon (the whole target
    without a dp/ curve)."""
    if (accountant_named(privacy.accountant) is not RDP or privacy.target >= TINY_TARGET
            or steps > MAX_ADVICE_STEPS):
        return None

    try:
        tight = calibrate_noise_multiplier(target_epsilon=target, sample_rate=q, steps=steps,
                                           delta=delta, accountant=PLD, rtol=privacy.rtol)
    except AccountingError:
        return None
    if tight >= 0.8 * sigma:
        return None
    text = (f"privacy.accountant=pld certifies DP-SGD's epsilon {privacy.target:g} with noise_multiplier "
            f"{tight:.4g}, {sigma / tight:.1f}x less noise than RDP's {sigma:.4g}: consider privacy.accountant=pld")
    log.warning("%s", text)
    return text
