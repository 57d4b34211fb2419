"""The NON-private reference numbers of a training run's evaluation, and the test ROC AUC.

Numpy in, floats or arrays out, no torch. The baselines (:func:`logistic_accuracy`,
:func:`linear_predictions`) are scikit-learn fits, imported when a baseline is computed: a run
with ``trainer.baseline=false`` never imports scikit-learn (or scipy). The ROC AUC is numpy's:
a rank statistic computed with one sort, the same value as scikit-learn's ``roc_auc_score``.
:mod:`dptrain.models.objectives` calls these by name through :func:`compute`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FUNCTIONS", "compute", "logistic_accuracy", "linear_predictions", "roc_auc"]

def _fit_quietly(model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    """Fit a scikit-learn model, its warnings silenced, on one BLAS / OpenMP thread: in parallel,
    the multinomial fit on Adult took minutes instead of seconds as soon as another process used a
    core; and one thread gives the same bits on every machine."""
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
    """ROC AUC of ``scores`` against binary ``labels`` (both classes must be present): the
    Mann-Whitney statistic, (sum of the positives' ranks - n_pos (n_pos + 1) / 2) / (n_pos n_neg),
    tied scores sharing their average rank, from one stable sort. Non-finite scores (a diverged
    model, e.g. a tuning candidate at a huge learning rate) rank as the extremes they tend to (NaN
    in the middle) instead of stopping the run."""
    big = np.finfo(np.float64).max
    s = np.nan_to_num(np.asarray(scores, dtype=np.float64).reshape(-1), nan=0.0, posinf=big, neginf=-big)
    y = np.asarray(labels).reshape(-1).astype(bool)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("roc_auc needs both classes among the labels")
    order = np.argsort(s, kind="stable")
    ranked = s[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    ends = np.r_[starts[1:], s.size]
    ranks = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # 1-based, ties averaged
    positive_ranks = float(ranks[y[order]].sum())
    return (positive_ranks - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


#: what :func:`compute` runs, by name
FUNCTIONS: dict[str, Callable[..., Any]] = {"logistic_accuracy": logistic_accuracy,
                                            "linear_predictions": linear_predictions, "roc_auc": roc_auc}


def compute(name: str, *args: Any, **kwargs: Any) -> Any:
    """``FUNCTIONS[name](*args, **kwargs)``."""
    return FUNCTIONS[name](*args, **kwargs)
