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


#: the generated panel's unit column (data=panel)
PANEL_UNIT = "person_id"
#: the panel's rows-per-person law: P(m) proportional to m^-PANEL_TAIL on 1..max_rows (heavy-tailed)
PANEL_TAIL = 1.2
#: the share of a panel row's features that is the person's own (constant over the person's rows)
PANEL_PERSON_SHARE = 0.7


def panel_rows_law(max_rows: int) -> np.ndarray:
    """P(a person has m rows), m = 1..max_rows: proportional to m^-1.2 (heavy-tailed)."""
    m = np.arange(1, int(max_rows) + 1, dtype=np.float64)
    p = m ** -PANEL_TAIL
    return p / p.sum()


def make_panel(n_units: int, max_rows: int, n_features: int, *, seed: int, target: str = "y",
               signal: float = 4.0) -> pd.DataFrame:
    """A generated panel: ``n_units`` persons (column ``person_id``), each with 1..``max_rows`` rows
    drawn from :func:`panel_rows_law`; each row's features x0..x{d-1} in [-1, 1] are 0.7 times the
    person's own uniform vector plus 0.3 times the row's; the label is y ~ Bernoulli(sigmoid(x . w))
    with w = :func:`true_weights` (the known logistic truth: the same w as data=synthetic's for the
    seed). Seeded by the public ``seed`` (``default_rng([seed, 2])``); no download."""
    if n_units < 1 or max_rows < 1 or n_features < 1:
        raise ValueError("make_panel needs n_units, max_rows and n_features >= 1")
    w = true_weights(n_features, seed=seed, signal=signal)
    rng = np.random.default_rng([int(seed), 2])
    rows = rng.choice(np.arange(1, int(max_rows) + 1), size=int(n_units), p=panel_rows_law(max_rows))
    person = np.repeat(np.arange(int(n_units)), rows)
    own = rng.uniform(LOWER, UPPER, size=(int(n_units), n_features))
    x = PANEL_PERSON_SHARE * own[person] + (1 - PANEL_PERSON_SHARE) * rng.uniform(LOWER, UPPER,
                                                                                   size=(person.size, n_features))
    p = 1.0 / (1.0 + np.exp(-(x @ w)))
    df = pd.DataFrame(x, columns=feature_columns(n_features))
    df[target] = (rng.random(person.size) < p).astype(np.int8)
    df[PANEL_UNIT] = person
    return df
