"""A release run once its cells are listed and estimated, before any method runs: what the runner
(:mod:`dptrain.tasks.release`), the private evaluation (:mod:`dptrain.release.evaluation`) and its
figures share. A leaf of the release package: it imports no runner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dptrain.privacy.randomness import Randomness
from dptrain.release import report
from dptrain.release.api import CellEstimates
from dptrain.release.spec import ReleaseSpec
from dptrain.release.units import UnitBound


@dataclass(frozen=True)
class ReleaseRun:
    """One release run once its cells are listed and estimated (before any method runs)."""

    spec: ReleaseSpec  # what the methods, release.json and the evaluation read
    run_dir: Path
    randomness: Randomness
    truth: pd.DataFrame | None  # the simulator's per-cell truth (simulated data only)
    source: str  # the data source in words
    est: CellEstimates
    simulated: bool = False  # simulated data (data=atlas): the truth is known, the source is no user's table
    diagnostics: dict | None = None  # PRIVATE counts about the rows -> private/data_diagnostics.json
    unit: UnitBound = UnitBound()  # the unit of privacy (data.privacy_unit, privacy.max_rows_per_unit)
    budget: tuple[float, float] = (0.0, 0.0)  # release.epsilon_per_statistic and release.delta, per unit

    def facts(self) -> report.RunFacts:
        return report.RunFacts(config=self.spec, source=self.source, listed=self.est.listed,
                               randomness=self.randomness.describe())
