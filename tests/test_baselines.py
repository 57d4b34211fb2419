"""dptrain.models.baselines: the scikit-learn side of a run's evaluation (the NON-private baselines and the
test ROC AUC), torch-free so that the accounting worker can compute it. Without a worker each
objective's numbers are sklearn's own, fitted here."""

from __future__ import annotations

import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.metrics import roc_auc_score

from dptrain.models import baselines
from dptrain.models.objectives import BinaryLogistic, Multinomial
from dptrain.models.objectives import LinearRegression as LinearObjective


def _rows(kind: str, n: int = 600, d: int = 5, seed: int = 3) -> SimpleNamespace:
    g = np.random.default_rng(seed)
    x = g.normal(size=(n, d)).astype(np.float32)
    z = x @ g.normal(size=d)
    y = {"binary": (z + g.normal(size=n) > 0).astype(np.float32),
         "multiclass": np.digitize(z, np.quantile(z, [1 / 3, 2 / 3])).astype(np.int64),
         "continuous": (1 / (1 + np.exp(-z))).astype(np.float32)}[kind]
    cut = n * 2 // 3
    return SimpleNamespace(x_train=torch.from_numpy(x[:cut]), y_train=torch.from_numpy(y[:cut]),
                           x_test=torch.from_numpy(x[cut:]), y_test=torch.from_numpy(y[cut:]))


def test_the_binary_baseline_and_auc_are_sklearns():
    data = _rows("binary")
    x, y, xt, yt = (t.numpy() for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    ref = LogisticRegression(max_iter=2000, random_state=7).fit(x, y).score(xt, yt)
    out = BinaryLogistic().baseline(data, seed=7)
    assert out["nonprivate_acc"] == pytest.approx(ref, abs=1e-12)
    assert out["majority_acc"] == pytest.approx(max(yt.mean(), 1 - yt.mean()))
    assert "nonprivate_acc" not in BinaryLogistic().baseline(data, seed=7, fit=False)
    scores = torch.from_numpy(xt @ np.arange(1, 6, dtype=np.float32))
    m = BinaryLogistic().metrics(scores, data.y_test)
    assert m["auc"] == pytest.approx(roc_auc_score(yt, scores.numpy()), abs=1e-12)
    assert math.isnan(BinaryLogistic().metrics(scores, torch.ones_like(data.y_test))["auc"])  # one class: no AUC


def test_the_multinomial_and_linear_baselines_are_sklearns():
    data = _rows("multiclass")
    x, y, xt, yt = (t.numpy() for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    ref = LogisticRegression(max_iter=2000, random_state=1).fit(x, y).score(xt, yt)
    objective = Multinomial()
    objective.class_names = ("a", "b", "c")
    assert objective.baseline(data, seed=1)["nonprivate_acc"] == pytest.approx(ref, abs=1e-12)
    data = _rows("continuous")
    x, y, xt, yt = (t.numpy() for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    pred = LinearRegression().fit(x, y).predict(xt)
    objective = LinearObjective()
    objective.target_bounds = (0.0, 10.0)  # the declared target range: [0, 10]
    rmse = 10.0 * float(np.sqrt(np.mean((pred.astype(np.float64) - yt.astype(np.float64)) ** 2)))
    assert objective.baseline(data, seed=0)["nonprivate_rmse"] == pytest.approx(rmse, rel=1e-9)


def test_compute_runs_the_named_function():
    labels, scores = np.array([0, 1, 1, 0, 1]), np.array([0.1, 0.8, 0.3, 0.4, 0.9])
    assert baselines.compute("roc_auc", labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-15)
    with pytest.raises(KeyError):
        baselines.compute("no_such_function")


def test_the_numpy_auc_is_sklearns_with_ties_and_one_sort():
    """The ROC AUC is a rank statistic computed in numpy (no scikit-learn import in a run without
    a baseline): equal to scikit-learn's on continuous scores, on heavily tied scores and on a
    single distinct score."""
    rng = np.random.default_rng(3)
    for case in range(60):
        n = int(rng.integers(2, 400))
        y = rng.integers(0, 2, n)
        y[:2] = (0, 1)
        scores = rng.normal(size=n) if case % 3 == 0 else rng.integers(0, 4, n).astype(float)
        assert baselines.roc_auc(y, scores) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)
    assert baselines.roc_auc(np.array([0, 1, 0, 1]), np.zeros(4)) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        baselines.roc_auc(np.ones(3), np.arange(3.0))


def test_the_module_imports_no_torch_and_no_sklearn():
    """Importing it imports neither torch nor scikit-learn (nor scipy): a run without a baseline
    computes its ROC AUC without them."""
    code = ("import sys; import dptrain.models.baselines; "
            "print(sorted(m for m in ('torch', 'sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_auc_of_a_diverged_model_is_computed_not_raised():
    """A tuning candidate at lr 3e38 gives inf/NaN outputs; sklearn raised "Input contains
    infinity" and ended the whole search (issue 29, finding 5)."""
    labels = np.array([0, 1, 0, 1, 1])
    assert baselines.roc_auc(labels, np.array([-np.inf, np.inf, np.nan, 2.0, np.inf])) == 1.0
    assert baselines.roc_auc(labels, np.full(5, np.nan)) == 0.5
