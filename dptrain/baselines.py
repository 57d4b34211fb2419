"""The scikit-learn computations of a training run's evaluation: the NON-private baselines' fits
and the test ROC AUC. Numpy in, floats or arrays out, and no torch, so that the accounting worker
(:mod:`dptrain.privacy.worker`) can compute them beside the run without importing torch.

Every function here is what :mod:`dptrain.objectives` calls. :func:`compute` runs one by name:
the worker's answer when the worker computed that very call (the same function on equal
arguments), else here, in the run's process. :func:`prefetch` sends a call to the worker ahead of
time (the run sends its baseline fit while it trains). A run without a worker, or one whose
worker failed or died, computes each value itself: the same function on the same arrays.

Importing scikit-learn costs 1.5-2.5 s on a 2-core machine (it imports scipy.stats); with the
worker that import, the baseline fit and the AUC leave the run's process (docs/performance.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FUNCTIONS", "compute", "logistic_accuracy", "linear_predictions", "prefetch", "roc_auc", "warm_up"]


def _fit_quietly(model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    """Fit a scikit-learn model, its warnings silenced, on one BLAS / OpenMP thread: in parallel,
    the multinomial fit on Adult took minutes instead of seconds as soon as another process used a
    core; and one thread gives the same bits in the run's process and in the worker."""
    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore")
        return model.fit(x, y)


def logistic_accuracy(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, *,
                      seed: int) -> float:
    """Test accuracy of a NON-private sklearn LogisticRegression (binary, or multinomial over the
    labels present) fitted on the training rows."""
    from sklearn.linear_model import LogisticRegression

    clf = _fit_quietly(LogisticRegression(max_iter=2000, random_state=seed), x_train, y_train)
    return float(clf.score(x_test, y_test))


def linear_predictions(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """Test-row predictions of a NON-private sklearn LinearRegression fitted on the training rows."""
    from sklearn.linear_model import LinearRegression

    return np.asarray(_fit_quietly(LinearRegression(), x_train, y_train).predict(x_test))


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """sklearn's ROC AUC of ``scores`` against binary ``labels`` (both classes must be present).
    Non-finite scores (a diverged model, e.g. a tuning candidate at a huge learning rate) rank as
    the extremes they tend to (NaN in the middle) instead of stopping the run."""
    from sklearn.metrics import roc_auc_score

    scores = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0, posinf=np.finfo(np.float64).max,
                           neginf=-np.finfo(np.float64).max)
    return float(roc_auc_score(labels, scores))


#: what :func:`compute` and the worker may run, by name
FUNCTIONS: dict[str, Callable[..., Any]] = {"logistic_accuracy": logistic_accuracy,
                                            "linear_predictions": linear_predictions, "roc_auc": roc_auc}


def warm_up() -> None:
    """Import what the functions use (the worker does it while the run imports torch)."""
    import sklearn.linear_model  # noqa: F401
    import sklearn.metrics  # noqa: F401
    import threadpoolctl  # noqa: F401


def prefetch(name: str, *args: Any, **kwargs: Any) -> None:
    """Ask the worker, when there is one, to start ``FUNCTIONS[name](*args, **kwargs)`` now; a
    later :func:`compute` of an equal call takes its answer."""
    from dptrain.privacy import worker

    worker.send_job(name, args, kwargs)


def compute(name: str, *args: Any, **kwargs: Any) -> Any:
    """``FUNCTIONS[name](*args, **kwargs)``: the worker's answer to this very call when it has one
    (sent ahead by :func:`prefetch`, or asked now), else computed here."""
    from dptrain.privacy import worker

    found = worker.job_value(name, args, kwargs)
    return found.value if found is not None else FUNCTIONS[name](*args, **kwargs)
