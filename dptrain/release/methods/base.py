"""The release-method registry and what a method is.

``RELEASE_METHODS`` maps each ``release.method`` value to a :class:`ReleaseMethod` object, which
declares its neighbour relation and whether it has a guarantee, and runs on a run's cells at a
given epsilon. The runner (:mod:`dptrain.tasks.release`) never names a method: it validates
``release.method`` against this registry, runs each method at ``run_epsilon`` (the comparison
convention of :func:`dptrain.core.neighbours.comparison_epsilon`: replace-one methods run at 2
epsilon), and writes release.csv / release.json from the method's own ``published`` and
``release_json``. The private evaluation runs every registered method whose ``in_evaluation``
says so, and the tail figure those with ``tail_figure``.

A new method is one module that subclasses :class:`ReleaseMethod` and registers an instance::

    RELEASE_METHODS.register("my_method", MyMethod())

(docs/release.md section 13, "A new release method"). A method may declare settings of its own
(``settings``: names and defaults); the user gives them as ``release.method_settings={name:
value}``, :func:`check_method_settings` refuses a key the method does not declare and runs the
method's ``check_settings`` before any row is read, the method reads them with
``own_settings(config)``, and release.json records them (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dptrain.core.neighbours import Neighbours, comparison_epsilon
from dptrain.core.registry import Registry
from dptrain.core.validation import bad
from dptrain.release.api import CellEstimates
from dptrain.release.report import RunFacts, baseline_json
from dptrain.release.spec import ReleaseSpec


@dataclass(frozen=True)
class MethodResult:
    """What a method released on the run's cells. ``frame``: one row per listed cell, in cell
    order, with at least ``released``, ``reason``, ``theta_released`` and ``noise_sd`` (see
    :mod:`dptrain.release.methods.common`); ``meta``: the method's own facts (method, neighbours,
    epsilon, delta, guarantee, ...: :func:`~dptrain.release.methods.common.method_meta`);
    ``detail``: anything else the method keeps for its release.json or the evaluation."""

    frame: pd.DataFrame
    meta: dict
    detail: Any = None


class ReleaseMethod:
    """A release method. Subclasses set ``neighbours`` and ``has_guarantee`` and implement
    :meth:`run`; the rest has defaults that suit a method releasing theta per cell."""

    #: the neighbour relation of its guarantee; None for a method without one (suppression)
    neighbours: Neighbours | None = Neighbours.ADD_REMOVE
    #: False for a method that is not differentially private (MOS, suppression)
    has_guarantee: bool = True
    #: drawn in the evaluation's tail-classification figure (at every release.tail_epsilons)
    tail_figure: bool = False
    #: the method's OWN settings and their defaults, given as ``release.method_settings={NAME: value}``
    #: when it is the run's ``release.method``; {}: none (every built-in method)
    settings: Mapping[str, Any] = {}

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Refuse a bad value of one of this method's own settings, before any row is read: raise
        ``bad(f"release.method_settings.{key}", value, allowed)`` (a ConfigError naming the
        setting, the value and what is allowed). ``settings`` is :meth:`own_settings` of the run
        (the declared defaults, updated with ``release.method_settings``). Default: no check."""

    def own_settings(self, config: ReleaseSpec) -> dict[str, Any]:
        """This method's settings in this run: its declared defaults, updated with
        ``release.method_settings`` when it is the run's ``release.method`` (the private
        evaluation runs every other method at its defaults)."""
        out = dict(self.settings)
        if config.method in RELEASE_METHODS and RELEASE_METHODS.get(config.method) is self:
            out.update(dict(config.method_settings or {}))
        return out

    def relation(self, config: ReleaseSpec) -> Neighbours | None:
        """The neighbour relation of this run (a method may take it from the settings)."""
        return self.neighbours

    def run_epsilon(self, epsilon: float, config: ReleaseSpec) -> float:
        """The epsilon the method runs at when methods are compared at ``epsilon`` (add/remove)."""
        rel = self.relation(config)
        return float(epsilon) if rel is None else comparison_epsilon(epsilon, rel)

    def budget(self, epsilon: float, config: ReleaseSpec) -> tuple[float | None, float | None]:
        """The (epsilon, delta) this method's release.json states as its own (before a private cell
        selection is composed in) when it is run at ``release.epsilon_per_statistic=epsilon``:
        the console's first line gives it before the method runs. (None, None) for a method
        without noise (exact values). Default: the run epsilon, delta 0; a method that spends
        more or less (several statistics, a delta, part of its budget) overrides it."""
        if self.relation(config) is None:
            return None, None
        return self.run_epsilon(epsilon, config), 0.0

    def in_evaluation(self, config: ReleaseSpec) -> bool:
        """Whether the private evaluation runs this method."""
        return True

    def warning(self, name: str, config: ReleaseSpec) -> str | None:
        """A line the log shows when this method is the run's ``release.method``."""
        return None

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseSpec) -> MethodResult:
        """Release on ``est``'s cells at ``epsilon`` (already normalised), drawing from ``rng``."""
        raise NotImplementedError

    def published(self, est: CellEstimates, result: MethodResult) -> pd.DataFrame:
        """release.csv: the cell keys and the method's columns, one row per listed cell."""
        return pd.concat([est.cells.keys.reset_index(drop=True), result.frame.reset_index(drop=True)], axis=1)

    def release_json(self, name: str, result: MethodResult, *, facts: RunFacts) -> dict:
        """release.json: this method's own facts (and its own settings, when it declares any)."""
        out = baseline_json(name, result, neighbours=self.relation(facts.config), facts=facts)
        settings = self.own_settings(facts.config)
        if settings:
            out["method_settings"] = settings
        return out


class CellFunction(ReleaseMethod):
    """A method that is one function of the run's cells, ``fn(cells, *, statistic, epsilon, rng)``
    returning (frame, meta), at ``release.delta`` too (``fn(..., delta=...)``) when ``with_delta``."""

    def __init__(self, fn: Callable[..., tuple[pd.DataFrame, dict]], *, neighbours: Neighbours,
                 tail_figure: bool = False, with_delta: bool = False) -> None:
        self.fn, self.neighbours, self.tail_figure, self.with_delta = fn, neighbours, tail_figure, with_delta

    def budget(self, epsilon: float, config: ReleaseSpec) -> tuple[float | None, float | None]:
        eps, _ = super().budget(epsilon, config)
        return eps, config.delta if self.with_delta else 0.0

    def run(self, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
            config: ReleaseSpec) -> MethodResult:
        delta = {"delta": config.delta} if self.with_delta else {}
        return MethodResult(*self.fn(est.cells, statistic=config.statistic, epsilon=epsilon, rng=rng, **delta))


RELEASE_METHODS: Registry[ReleaseMethod] = Registry("release method", setting="release.method")


def run_method(name: str, est: CellEstimates, *, epsilon: float, rng: np.random.Generator,
               config: ReleaseSpec) -> MethodResult:
    """Run the registered method ``name`` at the comparison epsilon of ``epsilon``."""
    method = RELEASE_METHODS.get(name)
    return method.run(est, epsilon=method.run_epsilon(epsilon, config), rng=rng, config=config)


def evaluation_methods(config: ReleaseSpec) -> list[str]:
    """The methods the private evaluation runs, in registry order."""
    return [name for name in RELEASE_METHODS if RELEASE_METHODS.get(name).in_evaluation(config)]


def check_method_settings(config: ReleaseSpec) -> None:
    """``release.method_settings`` against what ``release.method`` declares (a key it does not
    declare is refused, with the ones it does), then the method's own ``check_settings``; before
    any row is read."""
    method = RELEASE_METHODS.get(config.method)
    for key, value in dict(config.method_settings or {}).items():
        if key not in method.settings:
            declared = ", ".join(method.settings) or "none (leave release.method_settings={})"
            raise bad(f"release.method_settings.{key}", value,
                      f"not a setting of release.method={config.method}; its settings: {declared}")
    method.check_settings(method.own_settings(config))
