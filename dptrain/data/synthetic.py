"""Seeded synthetic data for tests and smoke runs: a logistic model.

``x ~ Uniform[-1, 1]^d``, weights ``w ~ N(0, signal^2 / d)`` (so the logit's standard deviation
is about ``signal / sqrt(3)`` whatever d), ``y ~ Bernoulli(sigmoid(x . w))``. Everything is drawn
from ``numpy.random.default_rng([seed, 1])``: deterministic given the seed. The columns are
``x0 .. x{d-1}`` and the label column; :func:`dptrain.data.load_dataset` encodes them through the
same public-schema path as a real table (the generator's range [-1, 1] is the public schema)
and the same per-row hash split (:func:`dptrain.data.split.split_scores`), so the test part is
about ``test_fraction`` of the rows, not exactly. The rows are generated, not anyone's data
(``data.test_public: true`` in conf/data/synthetic.yaml).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

LOWER, UPPER = -1.0, 1.0


def feature_columns(n_features: int) -> list[str]:
    return [f"x{i}" for i in range(n_features)]


def true_weights(n_features: int, *, seed: int, signal: float = 4.0) -> np.ndarray:
    """The generator's weight vector for this seed (the first draw of its stream)."""
    rng = np.random.default_rng([int(seed), 1])
    return rng.normal(0.0, signal / math.sqrt(n_features), size=n_features)


def make_synthetic(n_rows: int, n_features: int, *, seed: int, target: str = "y",
                   signal: float = 4.0) -> pd.DataFrame:
    """``n_rows`` rows: float columns x0..x{n_features-1} in [-1, 1] and a 0/1 int column
    ``target``. Same seed -> same frame."""
    if n_rows < 0 or n_features < 1:
        raise ValueError("make_synthetic needs n_rows >= 0 and n_features >= 1")
    rng = np.random.default_rng([int(seed), 1])
    w = rng.normal(0.0, signal / math.sqrt(n_features), size=n_features)
    x = rng.uniform(LOWER, UPPER, size=(n_rows, n_features))
    p = 1.0 / (1.0 + np.exp(-(x @ w)))
    y = (rng.random(n_rows) < p).astype(np.int8)
    df = pd.DataFrame(x, columns=feature_columns(n_features))
    df[target] = y
    return df
