"""dptrain: train models and release statistics under differential privacy.

The front door: ``import dptrain as dp`` gives the names a user needs, loaded when first used (so
``python -m dptrain`` starts no slower than it did):

* estimators (scikit-learn style, private by default): :class:`DPLogisticRegression`,
  :class:`DPLinearRegression`, :class:`DPMultinomialLogisticRegression`, :class:`DPMLPClassifier`,
  and :class:`PublicBoundsScaler` (features scaled by declared public bounds);
* your own torch loop: :func:`make_private` (and :class:`Squeeze`, the last layer of a model
  with one output per example);
* a trained run: :func:`load_model`;
* small-cell releases: :func:`fit_cells` (the cells' estimates a release method takes);
* a run folder: :func:`verify` (its digests and that nothing unlisted lies outside private/),
  :func:`publish` (the export of exactly what the report covers);
* the registries a plugin adds to: ``ACCOUNTANTS``, ``OBJECTIVES``, ``ENGINES``, ``ESTIMATORS``,
  ``RELEASE_METHODS`` (small-cell methods), ``ONE_SHOT`` (tables, TopDown, synthesis, ER-EE),
  ``TASKS``;
* :class:`DPTrainError`, the base of every refusal.

Everything else keeps its module path (docs/api.md).
"""

import importlib as _importlib
import os as _os
from typing import TYPE_CHECKING

# OpenMP threads that spin while they wait turn a 0.2 ms step into tens of ms as soon as another
# process uses a core (measured: experiment=mlp 0.95 s idle -> 4.5 s beside one busy process).
# Waiting threads that sleep cost nothing measurable when the machine is idle. This must be set
# before torch (and its OpenMP runtime) is loaded; an explicit OMP_WAIT_POLICY is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The same for OpenBLAS (numpy's and scipy's BLAS: the sklearn baseline's fit): its idle threads
# spin for 2^28 cycles (~0.1 s) after every call before they sleep. On 2 busy cores that made the
# baseline fit of experiment=logit 2-4x slower (measured: 4.3 s -> 1.4 s). 4 (2^4 cycles, the
# smallest value OpenBLAS takes) lets them sleep at once; it changes when threads sleep, not how
# the work is split, so every result is bit for bit the same. Read when numpy loads OpenBLAS,
# so it too must be set first; an explicit OPENBLAS_THREAD_TIMEOUT is kept.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__version__ = "0.1.0"

#: each public name and the module that defines it (loaded on first use: PEP 562)
_FRONT_DOOR = {
    "DPLogisticRegression": "dptrain.training.estimators",
    "DPLinearRegression": "dptrain.training.estimators",
    "DPMultinomialLogisticRegression": "dptrain.training.estimators",
    "DPMLPClassifier": "dptrain.training.estimators",
    "PublicBoundsScaler": "dptrain.training.estimators",
    "make_private": "dptrain.training.private",
    "Squeeze": "dptrain.privacy.dpsgd.layers",
    "load_model": "dptrain.tasks.predict",
    "fit_cells": "dptrain.release.api",
    "verify": "dptrain.runfolder.verify",
    "publish": "dptrain.runfolder.publish",
    "ACCOUNTANTS": "dptrain.privacy.accounting",
    "OBJECTIVES": "dptrain.models.objectives",
    "ENGINES": "dptrain.privacy.dpsgd.engine",
    "RELEASE_METHODS": "dptrain.release.methods",
    "ONE_SHOT": "dptrain.release.oneshot",
    "ESTIMATORS": "dptrain.inference.run",
    "TASKS": "dptrain.tasks.registry",
    "DPTrainError": "dptrain.core.errors",
}
#: a front-door name that differs from its name in the defining module
_RENAMED = {"verify": "verify_run"}

__all__ = [
    "ACCOUNTANTS",
    "DPLinearRegression",
    "DPLogisticRegression",
    "DPMLPClassifier",
    "DPMultinomialLogisticRegression",
    "DPTrainError",
    "ENGINES",
    "ESTIMATORS",
    "OBJECTIVES",
    "ONE_SHOT",
    "PublicBoundsScaler",
    "RELEASE_METHODS",
    "Squeeze",
    "TASKS",
    "fit_cells",
    "load_model",
    "make_private",
    "publish",
    "verify",
]


def __getattr__(name: str):
    """Load a front-door name from its module on first use (and keep it: later lookups are plain
    attribute reads)."""
    module = _FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(f"module 'dptrain' has no attribute {name!r}; its names: {', '.join(__all__)}")
    value = getattr(_importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what a type checker and an IDE see: the same names, imported eagerly
    from dptrain.core.errors import DPTrainError
    from dptrain.inference.run import ESTIMATORS
    from dptrain.models.objectives import OBJECTIVES
    from dptrain.privacy.accounting import ACCOUNTANTS
    from dptrain.privacy.dpsgd.engine import ENGINES
    from dptrain.privacy.dpsgd.layers import Squeeze
    from dptrain.release.api import fit_cells
    from dptrain.release.methods import RELEASE_METHODS
    from dptrain.release.oneshot import ONE_SHOT
    from dptrain.runfolder.publish import publish
    from dptrain.runfolder.verify import verify_run as verify
    from dptrain.tasks.predict import load_model
    from dptrain.tasks.registry import TASKS
    from dptrain.training.estimators import (
        DPLinearRegression,
        DPLogisticRegression,
        DPMLPClassifier,
        DPMultinomialLogisticRegression,
        PublicBoundsScaler,
    )
    from dptrain.training.private import make_private
