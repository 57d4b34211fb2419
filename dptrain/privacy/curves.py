"""DP training curves: a training-loss curve whose privacy cost is part of the run's epsilon.

On every logged step (each ``trainer.log_every``-th step and the last one) a private run with
``trainer.dp_curves=true`` releases, under the TensorBoard tag ``dp/train_loss``,

    (sum over the step's Poisson batch of min(loss_i, L) + N(0, (sigma_c L)^2)) / B

with L the loss bound (``trainer.curve_loss_bound``, or the objective's default), B the
EXPECTED batch size (public) and the noise drawn from the run's secret randomness. Each
example's loss is clipped into [0, L], so adding or removing one example moves the sum by at
most L: a Gaussian mechanism with noise multiplier sigma_c.

**Accounting.** The curve uses the same Poisson batch as the step's gradient. Released together,
the pair (noisy clipped gradient sum, noisy clipped loss sum) is ONE Gaussian mechanism on the
batch: scaled by its noise (sigma C and sigma_c L), one example moves it by at most
sqrt(sigma^-2 + sigma_c^-2) in L2 norm, so it is the Gaussian mechanism with noise multiplier

    sigma_eff = (sigma^-2 + sigma_c^-2)^(-1/2)

and a logged step is recorded as ONE ``poisson_gaussian(q, sigma_eff)`` event (the other steps
as ``poisson_gaussian(q, sigma)``), exactly. Recording the curve as a separate Poisson-subsampled
event beside the gradient's would treat the two batches as independent draws, which they are
not: it under-counts (q = 0.01, sigma = 1, 1000 steps, 20 curve releases at sigma_c 0.62: RDP
epsilon 3.91 recorded separately against 5.64 for the shared batch).

**The budget share.** sigma_c is the smallest noise multiplier (to 1%) for which the run's
planned history (T steps, K of them logged) has RDP epsilon at most epsilon_gradients / (1 - s),
where epsilon_gradients is the RDP epsilon of the T gradient steps alone and
s = ``trainer.curve_budget_share``: the curve takes the share s of the run's epsilon. With
``privacy.target_epsilon`` the gradients are calibrated to (1 - s) target by the headline
accountant, so the whole run (gradients and curve) ends within the target (with another headline
accountant than RDP, sigma_c is then the smallest that keeps the run within the target by that
accountant: :func:`fill_target`); with an explicit ``privacy.noise_multiplier`` the curve's cost
comes on top. (The small-q approximation
sigma_c^2 = sigma^2 (1 - s) K / (s T) is far off when sigma_eff is small: a subsampled Gaussian
of little noise amplifies poorly, so sigma_c is solved with the accountant itself.)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dptrain.core.validation import bad
from dptrain.privacy.accounting import RDP, SIGMA_RANGE, history_epsilon
from dptrain.privacy.calibration import Unreachable, smallest_noise
from dptrain.privacy.events import Event, poisson_gaussian

if TYPE_CHECKING:
    import torch

__all__ = ["TAG", "CurveConfig", "CurveMechanism", "bounded_loss_sum", "curve_noise_multiplier", "fill_target",
           "history_between", "joint_noise_multiplier", "releases_between", "resolve_loss_bound"]

#: the TensorBoard tag of the covered training-loss curve
TAG = "dp/train_loss"


@dataclass(frozen=True)
class CurveConfig:
    """What a run asks of its dp/ curve (from ``trainer.*``; the loss bound resolved)."""

    log_every: int
    budget_share: float
    loss_bound: float
    loss_bound_source: str = "config (trainer.curve_loss_bound)"


@dataclass(frozen=True)
class CurveMechanism:
    """The dp/ curve of one run: noise multiplier sigma_c, loss bound L, schedule and share."""

    noise_multiplier: float
    loss_bound: float
    log_every: int
    budget_share: float
    loss_bound_source: str
    planned_releases: int

    def due(self, step: int, *, last: int) -> bool:
        """True on the steps that release the curve: every ``log_every``-th and the last."""
        return step % self.log_every == 0 or step == last


def releases_between(start: int, end: int, log_every: int) -> int:
    """How many of the steps start + 1 .. end release the curve when ``end`` is the last step."""
    if end <= start:
        return 0
    due = end // log_every - start // log_every
    return due + (1 if end % log_every else 0)


def joint_noise_multiplier(sigma: float, sigma_c: float) -> float:
    """sigma_eff = (sigma^-2 + sigma_c^-2)^(-1/2): the gradient and the curve on one batch."""
    if sigma <= 0 or sigma_c <= 0:
        return 0.0
    return 1.0 / math.sqrt(sigma**-2 + sigma_c**-2)


def history_between(*, sigma: float, sigma_c: float | None, sample_rate: float, start: int, end: int,
                    log_every: int) -> tuple[tuple[Event, int], ...]:
    """The events of steps start + 1 .. end (``end`` the last step): (DP-SGD step, count) and,
    with a curve (``sigma_c`` not None), (step that also releases the curve, count)."""
    steps = max(end - start, 0)
    plain = poisson_gaussian(sample_rate=sample_rate, noise_multiplier=sigma)
    if sigma_c is None:
        return ((plain, steps),)
    k = releases_between(start, end, log_every)
    joint = poisson_gaussian(sample_rate=sample_rate, noise_multiplier=joint_noise_multiplier(sigma, sigma_c))
    return ((plain, steps - k), (joint, k))


#: the relative tolerance of sigma_c (or the calibration's, if larger): 1% moves the curve's share
#: of epsilon by about 2% of itself (0.1% of epsilon at a share of 0.05), with half the evaluations
CURVE_RTOL = 1e-2


@functools.lru_cache(maxsize=64)
def curve_noise_multiplier(*, sigma: float, sample_rate: float, steps: int, log_every: int, share: float,
                           delta: float, rtol: float = 1e-3) -> float:
    """sigma_c: the smallest curve noise multiplier (relative tolerance max(``rtol``,
    CURVE_RTOL)) whose planned history (``steps`` steps, those of :func:`releases_between`
    logged) has RDP epsilon <= the gradients' RDP epsilon / (1 - ``share``), as evaluated (module
    docstring), by :func:`dptrain.privacy.calibration.smallest_noise` from the small-q
    approximation: a handful of RDP evaluations. (RDP, whatever the headline accountant: the
    share is a design choice, cheap to evaluate; :func:`fill_target` fits a target by another
    accountant.)"""
    grads = history_epsilon(((poisson_gaussian(sample_rate=sample_rate, noise_multiplier=sigma), steps),),
                            delta=delta, accountant=RDP)
    k = releases_between(0, steps, log_every)
    if not (0 < grads < math.inf) or k == 0:
        return SIGMA_RANGE[1]

    def eps(sigma_c: float) -> float:
        history = history_between(sigma=sigma, sigma_c=sigma_c, sample_rate=sample_rate, start=0, end=steps,
                                  log_every=log_every)
        return history_epsilon(history, delta=delta, accountant=RDP)

    guess = sigma * math.sqrt((1.0 - share) * k / (share * steps))  # the small-q approximation
    return _calibrated(eps, grads / (1.0 - share), guess=guess, factor=2.0, rtol=max(rtol, CURVE_RTOL))


def fill_target(sigma_c: float, *, history_of: Any, target_epsilon: float, delta: float, accountant: str) -> float:
    """The smallest sigma_c (1%) whose planned history ``history_of(sigma_c)`` has epsilon <=
    ``target_epsilon`` by ``accountant``, searched from ``sigma_c`` (the RDP share's). The gradients were calibrated
    to (1 - share) of the target by that accountant, and the curve gets the rest: with RDP the
    share rule does that already; this is for the others (PLD, plugins), whose share of the
    curve differs from RDP's."""
    def eps(x: float) -> float:
        return history_epsilon(history_of(x), delta=delta, accountant=accountant)

    return _calibrated(eps, target_epsilon, guess=sigma_c, factor=1.25, rtol=CURVE_RTOL)


def _calibrated(eps: Callable[[float], float], target: float, *, guess: float, factor: float, rtol: float) -> float:
    """:func:`dptrain.privacy.calibration.smallest_noise` over SIGMA_RANGE; the range's top when
    even that does not meet ``target`` (the curve then adds next to nothing)."""
    try:
        return smallest_noise(eps, target=target, rtol=rtol, lower=SIGMA_RANGE[0], upper=SIGMA_RANGE[1],
                              start=guess, factor=factor)
    except Unreachable:
        return SIGMA_RANGE[1]


def bounded_loss_sum(losses: torch.Tensor, bound: float) -> float:
    """sum_i min(max(loss_i, 0), L), in float64; a non-finite loss counts as L (NaN, +inf) or 0
    (-inf), so each example adds a number in [0, L] whatever its loss."""
    b = float(bound)
    clean = torch.nan_to_num(losses.detach().to(torch.float64), nan=b, posinf=b, neginf=0.0)
    return float(clean.clamp_(0.0, b).sum())


def resolve_loss_bound(given: float | None, objective: Any, spec: Any) -> tuple[float, str]:
    """(L, where it comes from): the given ``trainer.curve_loss_bound`` or the objective's
    ``curve_loss_bound(spec)``."""
    if given is not None:
        return float(given), "config (trainer.curve_loss_bound)"
    default = getattr(objective, "curve_loss_bound", None)
    if default is None:
        raise bad("trainer.curve_loss_bound", None, f"objective={objective.name} declares no default loss bound for "
                  "the dp/ curve (no curve_loss_bound(spec) method); allowed: a number > 0 (each example's loss is "
                  "clipped to it in dp/train_loss), or trainer.dp_curves=false")
    return float(default(spec)), f"objective default ({objective.name})"
