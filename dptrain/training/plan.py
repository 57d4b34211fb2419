"""A training run as typed values: what the command line hands the training library.

A task turns its checked configuration into a :class:`TrainingPlan` ONCE, at its door
(``dptrain.tasks.plan``); :func:`dptrain.training.fit.fit`, the estimators of
:mod:`dptrain.inference` and the run folder's writers read these values, never a configuration
object:

* :class:`Loop`: the training loop's numbers (epochs, expected batch size, engine, logging,
  checkpoints, device, averaging, the dp/ curve's share and bound);
* :class:`dptrain.privacy.budget.Budget`: the privacy budget and its shares;
* the model's and the optimiser's builders (plain ``_target_`` mappings for Hydra's
  ``instantiate``), the objective (checked against the data's public description), the data
  source (:class:`dptrain.data.DataSource`: its public schema and how to read it) and its
  description, the estimator's numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dptrain.core.dataspec import DataSpec
from dptrain.data.schema import Schema
from dptrain.data.source import DataSource
from dptrain.privacy.budget import Budget
from dptrain.privacy.dpsgd.units import UnitBound

__all__ = ["EstimatorSpec", "Loop", "TrainingPlan"]


@dataclass(frozen=True)
class Loop:
    """The training loop (``trainer.*``): ``batch_size`` is the EXPECTED batch size of Poisson
    sampling; ``average`` the share of the last steps whose iterates are averaged."""

    epochs: float = 5.0
    batch_size: int = 1024
    engine: str = "auto"
    average: float = 0.0
    eval_every: int = 50
    eval_rows: int = 1_000_000
    log_every: int = 10
    baseline: bool = False
    progress: bool = True
    threads: int = 0
    checkpoint_every: int = 100
    resume: str | None = None
    distributed: bool = False
    device: str = "auto"
    cuda_graph: bool = True
    dp_curves: bool = True
    curve_loss_bound: float | None = None
    curve_budget_share: float = 0.05


@dataclass(frozen=True)
class EstimatorSpec:
    """How the coefficient table is made (``estimator.*``)."""

    name: str = "dpsgd"
    parts: int = 10
    min_part_rows: int = 1000
    level: float = 0.95
    interval_share: float = 0.25
    bootstrap: int = 1000


@dataclass(frozen=True)
class TrainingPlan:
    """One training run as values (module docstring). ``objective`` is the objective object,
    already checked against ``spec`` (it keeps the declared classes or target bounds);
    ``objective_name`` its registered name; ``data`` the data source (its public schema and how
    to read it); ``spec`` the data's public description; ``test_public``: the test rows are public
    data."""

    seed: int
    loop: Loop
    budget: Budget
    max_grad_norm: float
    model: Mapping[str, Any]
    optim: Mapping[str, Any]
    objective: Any
    objective_name: str
    data: DataSource
    spec: DataSpec
    estimator: EstimatorSpec = field(default_factory=EstimatorSpec)
    test_public: bool = False
    task: str = "train"
    #: the unit of privacy (data.privacy_unit, privacy.max_rows_per_unit, privacy.unit_combine): person-level
    #: DP-SGD (dptrain.privacy.dpsgd.units); None: one row is the unit
    unit: UnitBound | None = None

    @property
    def schema(self) -> Schema:
        """The data's checked public schema."""
        return self.data.schema

    @property
    def data_name(self) -> str:
        """The data source: adult, table or synthetic."""
        return self.data.name

    @property
    def private(self) -> bool:
        """True when the run trains with DP-SGD."""
        return self.budget.enabled
