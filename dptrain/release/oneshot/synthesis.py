"""The synthesizers of task=synthesize (``synthesize.method``): a model of the table fitted from noisy
marginals of its declared domain's codes, from which the synthetic rows are drawn
(post-processing). Both are rho-zCDP in all (their stages' rho summed), converted to (epsilon,
delta) by the RDP accountant; neighbours: add or remove one row.

* ``mst`` (the default): :func:`dptrain.release.synthesis.mst.mst`, a spanning tree of 2-way
  marginals (select, measure, generate);
* ``mwem``: :func:`dptrain.release.synthesis.mwem.mwem`, multiplicative weights over the workload
  of every 2- to ``workload``-way marginal, ``rounds`` select-measure-update rounds.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dptrain.core.neighbours import Neighbours
from dptrain.privacy.events import Event, zcdp_event
from dptrain.release.oneshot.base import ONE_SHOT, OneShotMechanism, family_base
from dptrain.release.synthesis.mst import mst
from dptrain.release.synthesis.mwem import MWEMSettings, mwem

__all__ = ["MST", "MWEM", "SynthesisSettings", "Synthesizer", "marginal_workload"]


@dataclass(frozen=True)
class SynthesisSettings:
    """What the synthesizers read (task=synthesize: ``synthesize.rounds`` and
    ``synthesize.workload``, MWEM's rounds and the largest order of its workload)."""

    rounds: int
    workload: int


@family_base
class Synthesizer(OneShotMechanism):
    """A synthesizer. :meth:`fit` returns the fitted model, which has ``total`` (the noisy row
    count), ``sample(n, rng)`` (n rows of codes), ``spent`` (one dict per stage, with its ``rho``)
    and ``total_rho``; :meth:`event` takes that model."""

    family = "synthesis"
    settings = SynthesisSettings
    neighbours = Neighbours.ADD_REMOVE

    @abstractmethod
    def fit(self, codes: np.ndarray, sizes: Sequence[int], settings: SynthesisSettings, *, rho: float,
            rng: np.random.Generator) -> Any:
        """The model of ``codes`` (n, d) over columns of ``sizes`` levels at ``rho`` zCDP in all;
        ``rng`` draws the selections (the measurements' noise is OpenDP's)."""

    def event(self, spent: Any) -> Event:
        return zcdp_event(spent.total_rho)


def marginal_workload(d: int, order: int) -> list[tuple[int, ...]]:
    """Every 2- to ``order``-way set of ``d`` columns."""
    return [c for k in range(2, order + 1) for c in itertools.combinations(range(d), k)]


class MST(Synthesizer):
    """MST: a spanning tree of 2-way marginals (reads no setting)."""

    def fit(self, codes: np.ndarray, sizes: Sequence[int], settings: SynthesisSettings, *, rho: float,
            rng: np.random.Generator) -> Any:
        return mst(codes, sizes, rho=rho, rng=rng)


class MWEM(Synthesizer):
    """MWEM over every 2- to ``settings.workload``-way marginal, ``settings.rounds`` rounds."""

    def fit(self, codes: np.ndarray, sizes: Sequence[int], settings: SynthesisSettings, *, rho: float,
            rng: np.random.Generator) -> Any:
        return mwem(codes, sizes, marginal_workload(len(sizes), settings.workload),
                    settings=MWEMSettings(rho=rho, rounds=settings.rounds), rng=rng)


ONE_SHOT.register("mst", MST())
ONE_SHOT.register("mwem", MWEM())
