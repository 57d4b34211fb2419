"""The geography mechanism of task=topdown: Census-style TopDown (:mod:`dptrain.release.tables.topdown`).

``topdown``: every unit's cell vector at every level plus the discrete Gaussian (rho split over the
levels by ``shares``; one person moves one unit's vector per level by one: L2 sensitivity 1; a
unit of privacy of at most k persons, ``max_persons_per_unit``: L2 sensitivity k, sigma times k), the
``invariants`` released exactly (outside the guarantee, by policy), then the top-down pass that
makes the counts consistent nonnegative integers (post-processing). rho-zCDP in all (the levels'
rho summed), its (epsilon, delta) the RDP accountant's conversion.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np

from dptrain.core.neighbours import Neighbours
from dptrain.data.geography import Geography
from dptrain.privacy.events import Event, zcdp_event
from dptrain.release.oneshot.base import ONE_SHOT, OneShotMechanism, family_base
from dptrain.release.tables.topdown import Measurements, measure, topdown

__all__ = ["GeographyMechanism", "GeographySettings", "TopDown"]


@dataclass(frozen=True)
class GeographySettings:
    """What the geography mechanisms read (task=topdown: ``topdown.shares``, one rho share per
    level, and ``topdown.invariants``: none | nation | states)."""

    shares: tuple[float, ...]
    invariants: str
    #: at most this many persons per unit of privacy (1: one person): each level's L2 sensitivity
    max_persons_per_unit: int = 1


@family_base
class GeographyMechanism(OneShotMechanism):
    """A mechanism releasing a geography's counts at every level. :meth:`event` takes its
    measurements."""

    family = "geography"
    settings = GeographySettings
    neighbours = Neighbours.ADD_REMOVE

    @abstractmethod
    def release(self, geo: Geography, settings: GeographySettings, *, rho: float,
                rng: np.random.Generator) -> tuple[Measurements, tuple[np.ndarray, ...]]:
        """(the noisy measurements, the released counts of every level) at ``rho`` zCDP in all;
        ``rng`` breaks the post-processing's ties (the measurements' noise is OpenDP's)."""


class TopDown(GeographyMechanism):
    """The measurements and the top-down pass (module docstring)."""

    def release(self, geo: Geography, settings: GeographySettings, *, rho: float,
                rng: np.random.Generator) -> tuple[Measurements, tuple[np.ndarray, ...]]:
        m = measure(geo, rho, shares=settings.shares, invariants=settings.invariants,
                    sensitivity=float(settings.max_persons_per_unit))
        return m, topdown(geo.hierarchy, m, rng=rng)

    def event(self, spent: Measurements) -> Event:
        return zcdp_event(spent.rho)


ONE_SHOT.register("topdown", TopDown())
