"""The door of the training tasks (train, tune, audit): a checked configuration becomes the typed
values the library below reads (:class:`dptrain.training.plan.TrainingPlan`), once.

Every setting crosses here: ``privacy.*`` and ``estimator.interval_share`` become the run's
:class:`dptrain.privacy.budget.Budget` (the one value that splits the run's epsilon into DP-SGD's
part and the interval release's share), ``trainer.*`` the :class:`dptrain.training.plan.Loop`,
``data`` the public schema and data description, ``objective`` the objective object (checked
against that description), ``model`` and ``optim`` plain builder mappings, ``estimator`` its
numbers. Nothing below the tasks takes a configuration object.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dptrain.data import data_source
from dptrain.models.objectives import build_objective
from dptrain.privacy.budget import INTERVALS, Budget
from dptrain.privacy.dpsgd.units import UnitBound
from dptrain.settings.train import Config
from dptrain.training.plan import EstimatorSpec, Loop, TrainingPlan

__all__ = ["budget_of", "training_plan"]


def _plain(node: Any) -> dict[str, Any]:
    """A builder's mapping (``model``, ``optim``) as a plain dict."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return dict(node)


def budget_of(conf: Config) -> Budget:
    """The run's budget from ``privacy.*``, with the interval release's share
    (``estimator.interval_share``) when the estimator makes one (dpsgd on a private run)."""
    p = conf.privacy
    budget = Budget(enabled=bool(p.enabled), target=p.target_epsilon, noise_multiplier=p.noise_multiplier,
                    delta=p.delta, accountant=p.accountant, rtol=float(p.calibration_rtol),
                    max_epsilon=p.max_epsilon)
    if p.enabled and conf.estimator.name == "dpsgd":
        budget = budget.with_share(INTERVALS, float(conf.estimator.interval_share))
    return budget


def training_plan(conf: Config, *, extra_features: int = 0, task: str | None = None) -> TrainingPlan:
    """The :class:`TrainingPlan` of a checked training configuration (module docstring);
    ``extra_features``: columns the task adds to the public schema's (the audit's canaries)."""
    data = data_source(conf.data)
    spec = data.schema.data_spec(extra_features=extra_features)
    objective = build_objective(conf.objective.name)
    objective.check_data(spec)
    loop = Loop(**{f.name: getattr(conf.trainer, f.name) for f in dataclasses.fields(Loop)})
    estimator = EstimatorSpec(**{f.name: getattr(conf.estimator, f.name) for f in dataclasses.fields(EstimatorSpec)})
    return TrainingPlan(seed=int(conf.seed), loop=loop, budget=budget_of(conf),
                        max_grad_norm=float(conf.privacy.max_grad_norm), model=_plain(conf.model),
                        optim=_plain(conf.optim), objective=objective, objective_name=conf.objective.name,
                        data=data, spec=spec, estimator=estimator, test_public=bool(conf.data.test_public),
                        task=task or str(conf.task), unit=unit_of(conf, data.privacy_unit))


def unit_of(conf: Config, column: str | None) -> UnitBound | None:
    """The run's unit of privacy (None without data.privacy_unit)."""
    if column is None:
        return None
    return UnitBound(column=column, max_rows=int(conf.privacy.max_rows_per_unit),
                     combine=str(conf.privacy.unit_combine))
