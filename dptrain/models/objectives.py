"""Objectives: what a model's outputs mean, their per-example loss and their metrics.

An objective is passed to the gradient engine and the training loop; neither knows the loss
otherwise. It says:

* ``output_width(spec)``: how many outputs per example the model needs for the data's target
  (1 is a vector of shape (n,), the model ending in :class:`dptrain.privacy.dpsgd.layers.Squeeze`);
* ``per_example_loss(outputs, y)``: one loss per example (the engine differentiates their SUM);
* ``output_gradient(outputs, y, out=None)``: d loss_i / d outputs_i in closed form, which the
  fast engine's autograd-free paths use;
* ``correct(outputs, y)``: the number of correct predictions (a non-private diagnostic);
* ``metrics(outputs, y)``: metrics on held-out rows; ``primary_metric`` is the one a sweep
  optimises, in the direction ``greater_is_better`` says;
* ``baseline(data, seed)``: a non-private reference fit on the same features and split;
* ``check_data(spec)``: refuses a data set whose target does not fit (naming the objective and
  the setting to declare), and keeps the public facts about the target it needs later (the
  class names, the target's public bounds);
* ``prediction_columns(outputs)``: what ``task=predict`` writes per row;
* ``summary_line(metrics)``: the baseline line of the end-of-run console summary, or None;
* ``curve_loss_bound(spec)``: the default loss bound L of the dp/ training-loss curve (each
  example's loss is clipped into [0, L] there; dptrain.privacy.curves). Optional: without it a
  private run with ``trainer.dp_curves=true`` needs ``trainer.curve_loss_bound``;
* ``row_score(outputs, y)``: ``task=tune``'s per-row validation score in [0, 1] (optional:
  without it task=tune refuses the objective by name);
* ``coefficient_kind``: binary | multinomial | linear, the coefficient table of a linear model
  (dptrain.inference.coefficients; optional: without it no table is written).

Three objectives ship: ``binary`` (one logit, 0/1 labels), ``multinomial`` (softmax over the K
classes declared in ``data.classes``; labels are int64 class indices) and ``linear`` (squared
error on a continuous target with public bounds ``data.target_bounds``; the target is scaled to
[0, 1] by those bounds for training, and metrics and predictions are reported back in the
target's original units).

Objectives are registered by name in ``OBJECTIVES`` and picked with ``objective=NAME`` (a config
group, ``conf/objective/NAME.yaml``, or ``objective.name=NAME``). A new objective is one class
registered here or in a plugin module (``plugins=[...]``, on the command line of every task that
uses it: train, tune, predict), plus, optionally, its config file (docs/extending.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from dptrain.core.dataspec import DataSpec
from dptrain.core.errors import DPTrainError
from dptrain.core.registry import Registry
from dptrain.models import baselines
from dptrain.privacy.dpsgd.losses import BinaryCrossEntropy

#: the kinds of target a data set can declare (``DataSpec.target_kind``)
TARGET_KINDS = ("binary", "multiclass", "continuous")

#: what a data set declares for each kind of target (named in the objectives' refusals)
_DECLARE = {
    "binary": "a binary target (data.positive=LABEL, or numeric 0/1 labels)",
    "multiclass": "a multiclass target with its PUBLIC class list (data.classes=[A, B, C])",
    "continuous": "a continuous target with PUBLIC bounds (data.target_bounds={lower: L, upper: U})",
}


def _refuse_kind(objective: str, spec: DataSpec, needed: str) -> None:
    if spec.target_kind != needed:
        raise DPTrainError(f"objective={objective} is not allowed for a {spec.target_kind!r} target: it needs "
                           f"{_DECLARE[needed]}; allowed for this target: objective="
                           + {"binary": "binary", "multiclass": "multinomial", "continuous": "linear"}.get(
                               spec.target_kind, "?"))


class BinaryLogistic(BinaryCrossEntropy):
    """Binary classification with one logit per example: binary cross-entropy (its loss, gradient
    and count of correct examples are the engines' default, :mod:`dptrain.privacy.dpsgd.losses`),
    accuracy at logit > 0, log-loss and ROC AUC."""

    name = "binary"
    primary_metric = "acc"
    greater_is_better = True
    metric_names = ("acc", "loss", "auc")
    #: what a linear model's coefficients mean (dptrain.inference: the coefficient table's kind)
    coefficient_kind = "binary"

    def row_score(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """task=tune's per-row validation score in [0, 1]: 1 when the row is classified correctly."""
        return ((outputs.reshape(len(y), -1)[:, 0] > 0).to(y.dtype) == y).double()


    def output_width(self, spec: DataSpec) -> int:
        return 1

    def check_data(self, spec: DataSpec) -> None:
        _refuse_kind("binary", spec, "binary")

    def curve_loss_bound(self, spec: DataSpec) -> float:
        """2: about three times log 2, the loss of an uninformed prediction (a logit of -1.85 on a
        positive example costs 2)."""
        return 2.0

    @torch.no_grad()
    def metrics(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        loss = float(self.per_example_loss(outputs, y).mean())
        acc = float(((outputs > 0).to(y.dtype) == y).float().mean())
        both = 0 < float(y.mean()) < 1
        auc = float(baselines.compute("roc_auc", y.numpy(), outputs.numpy())) if both else math.nan
        return {"acc": acc, "loss": loss, "auc": auc}

    def baseline_job(self, data: Any, *, seed: int) -> Job:
        """The NON-private fit :meth:`baseline` runs (dptrain.models.baselines): sklearn LogisticRegression."""
        return "logistic_accuracy", _split(data, seed), {"seed": seed}

    def baseline(self, data: Any, *, seed: int, fit: bool = True) -> dict[str, float]:
        """Reference numbers on the test rows: the majority-class rate and, with ``fit``, the test
        accuracy of a NON-private sklearn LogisticRegression on the same features and split."""
        y = data.y_test
        out = {"majority_acc": float(max(y.mean(), 1 - y.mean()))}
        if fit:
            out["nonprivate_acc"] = float(_run_job(self.baseline_job(data, seed=seed)))
            out["fit_rows"] = baseline_fit_rows(data.x_train.shape[0])
        return out

    def prediction_columns(self, outputs: torch.Tensor) -> dict[str, Any]:
        """score (the logit), probability (of label 1), label (0/1: logit > 0)."""
        z = outputs.double()
        return {"score": z.numpy(), "probability": torch.sigmoid(z).numpy(), "label": (z > 0).long().numpy()}

    def summary_line(self, metrics: dict[str, float]) -> str | None:
        return None  # the privacy report's summary prints binary's baseline line itself


#: a computation of dptrain.models.baselines: (its name in FUNCTIONS, positional arguments, keywords)
Job = tuple[str, tuple, dict]


#: the most training rows a NON-private baseline is fitted on (beyond it: a random subset of this
#: many, drawn with the run's public seed): scikit-learn's fit on 20 million rows took 16 s
BASELINE_ROWS = 1_000_000


def baseline_fit_rows(n_train: int) -> int:
    """How many training rows the baseline is fitted on (:data:`BASELINE_ROWS` at most)."""
    return min(int(n_train), BASELINE_ROWS)


def _split(data: Any, seed: int) -> tuple:
    """The training rows the baseline is fitted on (every one, or a random subset of
    :data:`BASELINE_ROWS` kept in row order) and the test rows, as numpy arrays: x_train, y_train,
    x_test, y_test."""
    x, y = data.x_train.numpy(), data.y_train.numpy()
    if len(x) > BASELINE_ROWS:
        rows = np.sort(np.random.default_rng([int(seed), 36]).choice(len(x), BASELINE_ROWS, replace=False))
        x, y = x[rows], y[rows]
    return (x, y, data.x_test.numpy(), data.y_test.numpy())


def _run_job(job: Job) -> Any:
    name, args, kwargs = job
    return baselines.compute(name, *args, **kwargs)


class Multinomial:
    """Multiclass classification over the K classes declared in ``data.classes``: K outputs per
    example (class scores; no Squeeze), softmax cross-entropy, labels are int64 class indices.
    Test metrics: accuracy (arg-max class), log-loss and the macro average of the one-vs-rest
    ROC AUCs (over the classes present among the test rows, each against all others)."""

    name = "multinomial"
    primary_metric = "acc"
    greater_is_better = True
    metric_names = ("acc", "loss", "auc")
    coefficient_kind = "multinomial"

    def row_score(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """task=tune's per-row validation score in [0, 1]: 1 when the arg-max class is the label."""
        return (outputs.reshape(len(y), -1).argmax(1) == y).double()

        self.class_names: tuple[str, ...] = ()

    def output_width(self, spec: DataSpec) -> int:
        return spec.n_classes

    def check_data(self, spec: DataSpec) -> None:
        _refuse_kind("multinomial", spec, "multiclass")
        if spec.n_classes < 2:
            raise DPTrainError("data.classes is not allowed with fewer than 2 classes for objective=multinomial; "
                               "allowed: a list of at least 2 distinct labels")
        self.class_names = tuple(spec.class_names)

    def per_example_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, y, reduction="none")

    def curve_loss_bound(self, spec: DataSpec) -> float:
        """log(K) + 1: the loss of a uniform prediction over the K declared classes, plus 1."""
        return math.log(spec.n_classes) + 1.0

    def output_gradient(self, outputs: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """d CE(z, y) / dz = softmax(z) - onehot(y), one row per example (written into ``out``)."""
        g = torch.softmax(outputs, dim=1) if out is None else out.copy_(torch.softmax(outputs, dim=1))
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, y] -= 1.0
        return g

    def correct(self, outputs: torch.Tensor, y: torch.Tensor) -> int:
        return int((outputs.argmax(1) == y).sum())

    @torch.no_grad()
    def metrics(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        p = torch.softmax(outputs.double(), dim=1).numpy()
        labels = y.numpy()
        aucs = [float(baselines.compute("roc_auc", labels == k, p[:, k])) for k in range(p.shape[1])
                if 0 < int((labels == k).sum()) < len(labels)]
        return {"acc": float((outputs.argmax(1) == y).double().mean()),
                "loss": float(self.per_example_loss(outputs, y).double().mean()),
                "auc": float(sum(aucs) / len(aucs)) if aucs else math.nan}

    def baseline(self, data: Any, *, seed: int, fit: bool = True) -> dict[str, float]:
        """The majority-class rate on the test rows and, with ``fit``, the test accuracy of a
        NON-private sklearn (multinomial) LogisticRegression on the same features and split."""
        y = data.y_test
        counts = torch.bincount(y, minlength=max(len(self.class_names), 1))
        out = {"majority_acc": float(counts.max()) / max(int(y.shape[0]), 1)}
        if fit:
            out["nonprivate_acc"] = float(_run_job(self.baseline_job(data, seed=seed)))
            out["fit_rows"] = baseline_fit_rows(data.x_train.shape[0])
        return out

    def baseline_job(self, data: Any, *, seed: int) -> Job:
        """The NON-private fit :meth:`baseline` runs (dptrain.models.baselines): sklearn's multinomial
        LogisticRegression."""
        return "logistic_accuracy", _split(data, seed), {"seed": seed}

    def prediction_columns(self, outputs: torch.Tensor) -> dict[str, Any]:
        """``p_<class>`` (the softmax probability of each declared class) and ``label`` (the
        arg-max class's declared name)."""
        p = torch.softmax(outputs.double(), dim=1).numpy()
        names = self.class_names or tuple(str(k) for k in range(p.shape[1]))
        cols: dict[str, Any] = {f"p_{c}": p[:, k] for k, c in enumerate(names)}
        cols["label"] = [names[k] for k in p.argmax(1)]
        return cols

    def summary_line(self, metrics: dict[str, float]) -> str | None:
        return None  # baseline/nonprivate_acc and majority_acc: the summary's classifier line


class LinearRegression:
    """Regression with one output per example and squared error 0.5 (z - y)^2, on a continuous
    target with PUBLIC bounds (``data.target_bounds``). The data scales the target to [0, 1]
    by those bounds (y = (t - lower) / (upper - lower), after clipping t into them), so the
    model predicts on that scale: t_hat = lower + (upper - lower) z. Test metrics in the
    target's ORIGINAL units: ``rmse``, ``mae``; ``r2`` (unit-free); ``loss`` is the training loss,
    mean 0.5 (z - y)^2 on the [0, 1] scale."""

    name = "linear"
    primary_metric = "rmse"
    greater_is_better = False
    metric_names = ("rmse", "r2", "mae", "loss")
    coefficient_kind = "linear"

    def row_score(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """task=tune's per-row validation score in [0, 1]: 1 - min(squared error, 1) on the
        [0, 1]-scaled target."""
        return 1.0 - (outputs.reshape(len(y), -1)[:, 0].double() - y.double()).square().clamp(max=1.0)

        self.target_bounds: tuple[float, float] | None = None

    def output_width(self, spec: DataSpec) -> int:
        return 1

    def check_data(self, spec: DataSpec) -> None:
        _refuse_kind("linear", spec, "continuous")
        if spec.target_bounds is None:
            raise DPTrainError("objective=linear needs data.target_bounds={lower: L, upper: U} (PUBLIC bounds of "
                               "the target); allowed: finite numbers with lower < upper")
        self.target_bounds = (float(spec.target_bounds[0]), float(spec.target_bounds[1]))

    @property
    def _span(self) -> tuple[float, float]:
        if self.target_bounds is None:
            raise DPTrainError("objective=linear: the target's public bounds are unknown (check_data(spec) was not "
                               "called); allowed: a data spec with data.target_bounds")
        lo, hi = self.target_bounds
        return lo, hi - lo

    def per_example_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (outputs - y).square()

    def curve_loss_bound(self, spec: DataSpec) -> float:
        """0.5: the loss of a prediction in [0, 1] (the scaled target's range) is at most 0.5."""
        return 0.5

    def output_gradient(self, outputs: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """d 0.5 (z - y)^2 / dz = z - y (written into ``out`` when given)."""
        return torch.sub(outputs, y, out=out) if out is not None else outputs - y

    def correct(self, outputs: torch.Tensor, y: torch.Tensor) -> int:
        return 0  # no notion of a correct prediction: the loop logs no training accuracy

    @torch.no_grad()
    def metrics(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        _, span = self._span
        err = outputs.double() - y.double()
        yd = y.double()
        sst = float((yd - yd.mean()).square().sum())
        return {"rmse": span * float(err.square().mean().sqrt()),
                "r2": 1.0 - float(err.square().sum()) / sst if sst > 0 else math.nan,
                "mae": span * float(err.abs().mean()),
                "loss": float((0.5 * err.square()).mean())}

    def baseline(self, data: Any, *, seed: int, fit: bool = True) -> dict[str, float]:
        """Reference test RMSEs (original units): predicting the TRAINING mean (``mean_rmse``;
        computed from private rows, so private like every baseline) and, with ``fit``, a
        NON-private sklearn LinearRegression on the same features and split."""
        _, span = self._span
        y = data.y_test.double()
        out = {"mean_rmse": span * float((y - data.y_train.double().mean()).square().mean().sqrt())}
        if fit:
            pred = torch.from_numpy(_run_job(self.baseline_job(data, seed=seed))).double()
            out["nonprivate_rmse"] = span * float((pred - y).square().mean().sqrt())
            out["fit_rows"] = baseline_fit_rows(data.x_train.shape[0])
        return out

    def baseline_job(self, data: Any, *, seed: int) -> Job:
        """The NON-private fit :meth:`baseline` runs (dptrain.models.baselines): sklearn LinearRegression's
        test predictions (``seed``: only which rows, beyond :data:`BASELINE_ROWS`; the fit is deterministic)."""
        return "linear_predictions", _split(data, seed)[:3], {}

    def prediction_columns(self, outputs: torch.Tensor) -> dict[str, Any]:
        """``prediction``: lower + (upper - lower) z, in the target's original units."""
        lo, span = self._span
        return {"prediction": (lo + span * outputs.double()).numpy()}

    def summary_line(self, metrics: dict[str, float]) -> str | None:
        if "baseline/mean_rmse" not in metrics:
            return None
        line = f"baselines (test RMSE): predicting the training mean {metrics['baseline/mean_rmse']:.4f}"
        if "baseline/nonprivate_rmse" in metrics:
            line += (f"   non-private sklearn LinearRegression (same features/split) "
                     f"{metrics['baseline/nonprivate_rmse']:.4f}")
        return line


OBJECTIVES: Registry = Registry("objective", setting="objective.name")
OBJECTIVES.register("binary", BinaryLogistic)
OBJECTIVES.register("multinomial", Multinomial)
OBJECTIVES.register("linear", LinearRegression)
#: the default objective (binary logistic), for engines and tools built without a config
BINARY = BinaryLogistic()


def build_objective(name: str) -> Any:
    """The objective registered as ``name`` (``objective=NAME``), a new instance (it keeps what
    :meth:`check_data` learns of the data's public description)."""
    return OBJECTIVES.get(name)()
