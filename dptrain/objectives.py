"""Objectives: what a model's outputs mean, their per-example loss and their metrics.

An objective is passed to the gradient engine and the training loop; neither knows the loss
otherwise. It says:

* ``output_width(spec)``: how many outputs per example the model needs for the data's target
  (1 is a vector of shape (n,), the model ending in :class:`dptrain.layers.Squeeze`);
* ``per_example_loss(outputs, y)``: one loss per example (the engine differentiates their SUM);
* ``output_gradient(outputs, y, out=None)``: d loss_i / d outputs_i in closed form, which the
  fast engine's autograd-free paths use;
* ``correct(outputs, y)``: the number of correct predictions (a non-private diagnostic);
* ``metrics(outputs, y)``: metrics on held-out rows; ``primary_metric`` is the one a sweep
  optimises;
* ``baseline(data, seed)``: a non-private reference fit on the same features and split;
* ``check_data(spec)``: refuses a data set whose target does not fit.

Objectives are registered by name in ``OBJECTIVES`` and picked with ``objective=NAME`` (a config
group, ``conf/objective/NAME.yaml``). A new objective is one class registered here or in a
plugin module, plus its config file.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from dptrain.errors import DPTrainError
from dptrain.registry import Registry


@dataclass(frozen=True)
class DataSpec:
    """What a data set's rows look like, from its public schema: the number of input features
    and the kind of target ("binary": 0/1 labels as float32)."""

    n_features: int
    target_kind: str = "binary"


class BinaryLogistic:
    """Binary classification with one logit per example: binary cross-entropy, accuracy at
    logit > 0, log-loss and ROC AUC."""

    name = "binary"
    primary_metric = "acc"
    metric_names = ("acc", "loss", "auc")

    def __init__(self, settings: Any = None) -> None:
        self.settings = settings

    def output_width(self, spec: DataSpec) -> int:
        return 1

    def check_data(self, spec: DataSpec) -> None:
        if spec.target_kind != "binary":
            raise DPTrainError(f"objective=binary is not allowed for a {spec.target_kind!r} target: "
                               "it needs 0/1 labels")

    def per_example_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs, y, reduction="none")

    def output_gradient(self, outputs: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """d BCE(z, y) / dz = sigmoid(z) - y (written into ``out`` when given)."""
        return torch.sigmoid(outputs, out=out).sub_(y) if out is not None else torch.sigmoid(outputs).sub_(y)

    def correct(self, outputs: torch.Tensor, y: torch.Tensor) -> int:
        return int(((outputs > 0).to(y.dtype) == y).sum())

    @torch.no_grad()
    def metrics(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        from sklearn.metrics import roc_auc_score

        loss = float(self.per_example_loss(outputs, y).mean())
        acc = float(((outputs > 0).to(y.dtype) == y).float().mean())
        both = 0 < float(y.mean()) < 1
        auc = float(roc_auc_score(y.numpy(), outputs.numpy())) if both else math.nan
        return {"acc": acc, "loss": loss, "auc": auc}

    def baseline(self, data: Any, *, seed: int, fit: bool = True) -> dict[str, float]:
        """Reference numbers on the test rows: the majority-class rate and, with ``fit``, the test
        accuracy of a NON-private sklearn LogisticRegression on the same features and split."""
        y = data.y_test
        out = {"majority_acc": float(max(y.mean(), 1 - y.mean()))}
        if fit:
            from sklearn.linear_model import LogisticRegression

            clf = LogisticRegression(max_iter=2000, random_state=seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                clf.fit(data.x_train.numpy(), data.y_train.numpy())
            out["nonprivate_acc"] = float(clf.score(data.x_test.numpy(), y.numpy()))
        return out


OBJECTIVES: Registry = Registry("objective", setting="objective.name")
OBJECTIVES.register("binary", BinaryLogistic)
#: the default objective (binary logistic), for engines and tools built without a config
BINARY = BinaryLogistic()


def build_objective(settings: Any) -> Any:
    """The objective named by ``settings.name`` (``objective=NAME``), built with its settings."""
    name = settings.name if not isinstance(settings, str) else settings
    return OBJECTIVES.get(name)(settings)
