"""The NON-private reference numbers of a training run's evaluation, and the test ROC AUC.

Numpy in, floats or arrays out, no torch. The baselines (:func:`logistic_accuracy`,
:func:`linear_predictions`) are scikit-learn fits, imported when a baseline is computed: a run
with ``trainer.baseline=false`` never imports scikit-learn (or scipy). The ROC AUC is numpy's:
a rank statistic computed from two sorts, the same value as scikit-learn's ``roc_auc_score``.
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
    labels present) fitted on the training rows; NaN when the training rows hold one class only or
    there is no test row (nothing to fit or to score: the run goes on)."""
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(np.asarray(y_train))) < 2 or len(y_test) == 0:
        return float("nan")

    clf = _fit_quietly(LogisticRegression(max_iter=2000, random_state=seed), x_train, y_train)
    return float(clf.score(x_test, y_test))


def linear_predictions(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """Test-row predictions of a NON-private sklearn LinearRegression fitted on the training rows."""
    from sklearn.linear_model import LinearRegression

    return np.asarray(_fit_quietly(LinearRegression(), x_train, y_train).predict(x_test))


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of ``scores`` against binary ``labels`` (both classes must be present): the
    Mann-Whitney statistic P(positive's score > negative's) + P(equal) / 2, the same value as
    ranks with ties averaged (and as scikit-learn's ``roc_auc_score``). The positives' and the
    negatives' scores are sorted apart, and each positive's count of lower and of equal negatives
    is found by binary search (two sorts of the parts: about 3 times faster than one stable argsort
    of every score at 5 million rows). The counts are exact integers. Non-finite scores (a diverged
    model, e.g. a tuning candidate at a huge learning rate) rank as the extremes they tend to (NaN
    in the middle) instead of stopping the run."""
    s = np.asarray(scores).reshape(-1)
    s = s.astype(np.float64) if s.dtype != np.float32 else s  # float32 scores sort as float32: same ranks, faster
    big = np.finfo(s.dtype).max
    s = np.nan_to_num(s, nan=0.0, posinf=big, neginf=-big)
    y = np.asarray(labels).reshape(-1).astype(bool)
    positives, negatives = np.sort(s[y]), np.sort(s[~y])
    n_pos, n_neg = positives.size, negatives.size
    if n_pos == 0 or n_neg == 0:
        raise ValueError("roc_auc needs both classes among the labels")
    below = np.searchsorted(negatives, positives, side="left")
    up_to = np.searchsorted(negatives, positives, side="right")
    twice = 2 * int(below.sum(dtype=np.int64)) + int((up_to - below).sum(dtype=np.int64))
    return twice / (2.0 * n_pos * n_neg)


#: what :func:`compute` runs, by name
FUNCTIONS: dict[str, Callable[..., Any]] = {"logistic_accuracy": logistic_accuracy,
                                            "linear_predictions": linear_predictions, "roc_auc": roc_auc}


def compute(name: str, *args: Any, **kwargs: Any) -> Any:
    """``FUNCTIONS[name](*args, **kwargs)``."""
    return FUNCTIONS[name](*args, **kwargs)
