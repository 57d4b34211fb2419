"""The employer-employee mechanisms of task=lodes (``lodes.publish`` picks the published one; every
one that can run at the run's budget releases a table): per cell (place x sector x ownership, or
a marginal of it) the released job count and a 95% interval, from the numerical mechanisms of
:mod:`dptrain.release.employer.mechanisms` (their laws, sensitivities and proofs) and the public
intervals of :mod:`dptrain.release.employer.intervals`.

* ``log_laplace``: Laplace noise on ln(n + 1/alpha); pure (alpha, epsilon)-ER-EE, biased upward;
* ``smooth_gamma``: noise scaled to the beta-smooth sensitivity, pure (alpha, epsilon)-ER-EE,
  unbiased; needs beta = epsilon / 10 above ln(1 + alpha);
* ``smooth_laplace``: Laplace noise scaled to the smooth sensitivity, (alpha, epsilon, delta)-ER-EE,
  unbiased; needs beta = epsilon / (2 ln(2 / delta)) above ln(1 + alpha);
* ``laplace_worker``: worker-level (epsilon, 0)-DP (add/remove one job); NOT an establishment's size;
* ``employer_laplace``: (epsilon, 0)-DP, add/remove one establishment of at most ``employer_cap``
  workers (larger ones clipped to the cap).

Each is an (epsilon, delta) event (``epsilon_delta``) under its relation; ER-EE privacy composes
in epsilon like DP.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours
from dptrain.privacy.events import Event, epsilon_delta_event
from dptrain.release.employer import mechanisms as ee
from dptrain.release.employer.intervals import smooth_gamma_interval_public, smooth_laplace_interval_public
from dptrain.release.oneshot.base import (
    ONE_SHOT,
    Guarantee,
    MechanismSettings,
    OneShotMechanism,
    composed,
    family_base,
)

__all__ = ["ErEeMechanism", "ErEeSettings"]

Interval = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ErEeSettings:
    """What the employer-employee mechanisms read (task=lodes: ``lodes.alpha``, the ER-EE factor,
    and ``lodes.employer_cap``, employer_laplace's PUBLIC size cap)."""

    alpha: float
    employer_cap: int


def _size(alpha: float) -> str:
    return f"an establishment's size up to a factor 1 + alpha = {1 + alpha:g} (and one worker's job)"


@family_base
class ErEeMechanism(OneShotMechanism):
    """A mechanism releasing each cell's job count. :meth:`release` takes the cells (columns ``n``:
    the total, ``x_max``: the largest establishment, ``n_capped``: the total of the sizes clipped
    to the cap) and the PUBLIC largest size an establishment can have; :meth:`event` takes the
    (epsilon, delta) it runs at; :meth:`guarantee` words what it protects and its bias."""

    family = "er_ee"
    settings = ErEeSettings
    neighbours = Neighbours.ER_EE
    uses_delta = False

    @abstractmethod
    def release(self, cells: pd.DataFrame, settings: ErEeSettings, *, epsilon: float, delta: float,
                rng: np.random.Generator, max_size: float) -> Interval:
        """(released counts, 95% lower ends, upper ends), one per cell; the intervals from the
        release and public quantities only (the settings, ``max_size``)."""

    @abstractmethod
    def words(self, settings: ErEeSettings, epsilon: float, delta: float) -> tuple[str, str, str]:
        """(the guarantee, what it protects, its bias) in words at (epsilon, delta)."""

    def event(self, spent: tuple[float, float]) -> Event:
        epsilon, delta = spent
        return epsilon_delta_event(epsilon, delta if self.uses_delta else 0.0)

    def guarantee(self, event: Event, *, delta: float, settings: MechanismSettings = None) -> Guarantee:
        epsilon, spent_delta, _ = composed([event], delta=delta)
        statement, protects, bias = self.words(settings, epsilon, spent_delta)
        return Guarantee(epsilon, spent_delta, Neighbours(self.neighbours), "basic composition",
                         statement=statement, protects=protects, bias=bias)


class LogLaplace(ErEeMechanism):
    def release(self, cells: pd.DataFrame, settings: ErEeSettings, *, epsilon: float, delta: float,
                rng: np.random.Generator, max_size: float) -> Interval:
        released = ee.log_laplace(cells["n"].to_numpy(float), settings.alpha, epsilon, rng)
        return (released, *ee.log_laplace_interval(released, settings.alpha, epsilon))

    def words(self, settings: ErEeSettings, epsilon: float, delta: float) -> tuple[str, str, str]:
        return (f"({settings.alpha:g}, {epsilon:g})-{Neighbours.ER_EE.value}", _size(settings.alpha),
                "multiplicative, upward: E = (n + 1/alpha) / (1 - b^2) - 1/alpha, b = ln(1 + alpha) / epsilon")


class SmoothGamma(ErEeMechanism):
    def unavailable(self, settings: ErEeSettings, *, epsilon: float, delta: float) -> str | None:
        beta, _ = ee.smooth_gamma_params(epsilon)
        return None if beta > math.log1p(settings.alpha) else "needs its beta (epsilon / 10) above ln(1 + alpha)"

    def release(self, cells: pd.DataFrame, settings: ErEeSettings, *, epsilon: float, delta: float,
                rng: np.random.Generator, max_size: float) -> Interval:
        released = ee.smooth_gamma(cells["n"].to_numpy(float), cells["x_max"].to_numpy(float), settings.alpha,
                                   epsilon, rng)
        return (released, *smooth_gamma_interval_public(released, settings.alpha, epsilon, max_size))

    def words(self, settings: ErEeSettings, epsilon: float, delta: float) -> tuple[str, str, str]:
        return (f"({settings.alpha:g}, {epsilon:g})-{Neighbours.ER_EE.value} (pure)", _size(settings.alpha),
                "none (the noise has mean 0); its scale depends on the cell's largest establishment")


class SmoothLaplace(ErEeMechanism):
    uses_delta = True

    def unavailable(self, settings: ErEeSettings, *, epsilon: float, delta: float) -> str | None:
        beta, _ = ee.smooth_laplace_params(epsilon, delta)
        return None if beta > math.log1p(settings.alpha) else ("needs its beta (epsilon / (2 ln(2 / delta))) above "
                                                               "ln(1 + alpha)")

    def release(self, cells: pd.DataFrame, settings: ErEeSettings, *, epsilon: float, delta: float,
                rng: np.random.Generator, max_size: float) -> Interval:
        released = ee.smooth_laplace(cells["n"].to_numpy(float), cells["x_max"].to_numpy(float), settings.alpha,
                                     epsilon, delta, rng)
        return (released, *smooth_laplace_interval_public(released, settings.alpha, epsilon, delta, max_size))

    def words(self, settings: ErEeSettings, epsilon: float, delta: float) -> tuple[str, str, str]:
        return (f"({settings.alpha:g}, {epsilon:g}, {delta:g})-{Neighbours.ER_EE.value}", _size(settings.alpha),
                "none (Laplace noise scaled to the smooth sensitivity)")


class LaplaceWorker(ErEeMechanism):
    neighbours = Neighbours.ADD_REMOVE  # one job

    def release(self, cells: pd.DataFrame, settings: ErEeSettings, *, epsilon: float, delta: float,
                rng: np.random.Generator, max_size: float) -> Interval:
        released = ee.laplace_worker(cells["n"].to_numpy(float), epsilon, rng)
        return (released, *ee.laplace_worker_interval(released, epsilon))

    def words(self, settings: ErEeSettings, epsilon: float, delta: float) -> tuple[str, str, str]:
        return (f"({epsilon:g}, 0)-DP, {Neighbours.ADD_REMOVE.value} one job",
                "one worker's job; NOT an establishment's size (an adversary who knows the other establishments of "
                "a cell reads it within a few workers)", "none")


class EmployerLaplace(ErEeMechanism):
    neighbours = Neighbours.ADD_REMOVE  # one establishment, up to the cap

    def release(self, cells: pd.DataFrame, settings: ErEeSettings, *, epsilon: float, delta: float,
                rng: np.random.Generator, max_size: float) -> Interval:
        cap = settings.employer_cap
        released = ee.employer_laplace(cells["n_capped"].to_numpy(float), cap, epsilon, rng)
        return (released, *ee.employer_laplace_interval(released, cap, epsilon))

    def words(self, settings: ErEeSettings, epsilon: float, delta: float) -> tuple[str, str, str]:
        return (f"({epsilon:g}, 0)-DP, add/remove one establishment of at most {settings.employer_cap} workers "
                "(larger ones clipped to the cap)", "a whole establishment (up to the cap)",
                "downward where an establishment is above the cap (clipped); noise scale cap / epsilon")


ONE_SHOT.register("log_laplace", LogLaplace())
ONE_SHOT.register("smooth_gamma", SmoothGamma())
ONE_SHOT.register("smooth_laplace", SmoothLaplace())
ONE_SHOT.register("laplace_worker", LaplaceWorker())
ONE_SHOT.register("employer_laplace", EmployerLaplace())
