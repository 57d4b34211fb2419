"""The multinomial and linear objectives: their closed-form output gradients, the fast engine's
per-example norms and clipped sums for K-output heads (against an explicit per-example loop and
against Opacus), their metrics (against scikit-learn), the declared targets of the data, and the
two presets end to end."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module

from dptrain.core.dataspec import DataSpec
from dptrain.core.errors import DPTrainError
from dptrain.data import load_dataset, schema_from_config
from dptrain.data.dataset import build_dataset
from dptrain.models.networks import logit, mlp
from dptrain.models.objectives import BINARY, OBJECTIVES, Multinomial
from dptrain.privacy.dpsgd.engine import FastLinearEngine, OpacusEngine
from dptrain.tasks import cli

K = 4
CLASSES = ("a", "b", "c", "d")
LINEAR_SPEC = DataSpec(n_features=12, target_kind="continuous", target_bounds=(10.0, 30.0))
MULTI_SPEC = DataSpec(n_features=12, target_kind="multiclass", class_names=CLASSES)


def _objective(name: str):
    obj = OBJECTIVES.get(name)()
    obj.check_data(LINEAR_SPEC if name == "linear" else MULTI_SPEC)
    return obj


# the heads: K = 1 (linear regression) and K = 4 (multinomial), on the logit and on MLPs
CASES = {
    "linear-logit": ("linear", lambda: logit(in_features=12)),
    "linear-mlp": ("linear", lambda: mlp(in_features=12, hidden=[16, 8], activation="tanh")),
    "multinomial-logit": ("multinomial", lambda: logit(in_features=12, out_features=K)),
    "multinomial-mlp": ("multinomial", lambda: mlp(in_features=12, hidden=[16, 8], activation="tanh",
                                                   out_features=K)),
    "multinomial-mlp-wide-head": ("multinomial", lambda: mlp(in_features=12, hidden=[3], activation="relu",
                                                             out_features=K)),
    "multinomial-mlp-gelu": ("multinomial", lambda: mlp(in_features=12, hidden=[16], activation="gelu",
                                                        out_features=K)),
}


def _batch(kind: str, n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g) * torch.linspace(0.1, 3.0, n)[:, None]
    if kind == "linear":
        return x, torch.rand(n, generator=g)
    return x, torch.randint(0, K, (n,), generator=g)


def _per_example_grads(model, objective, x, y) -> list[list[torch.Tensor]]:
    """Reference: autograd on one example at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(x.shape[0]):
        loss = objective.per_example_loss(model(x[i:i + 1]), y[i:i + 1]).sum()
        out.append([g.detach() for g in torch.autograd.grad(loss, params)])
    return out


def _reference(model, objective, x, y):
    """(per-example norms, C between the middle two norms, the clipped sum, examples clipped)."""
    per_ex = _per_example_grads(model, objective, x, y)
    norms = torch.tensor([math.sqrt(sum(float(g.pow(2).sum()) for g in gs)) for gs in per_ex])
    srt = norms.sort().values
    n = len(norms)
    C = float(srt[n // 2 - 1] + srt[n // 2]) / 2  # clipping active for half of the examples
    total = [torch.zeros_like(g) for g in per_ex[0]]
    for gs, nrm in zip(per_ex, norms):
        for t, g in zip(total, gs):
            t += g * min(1.0, C / (float(nrm) + 1e-6))
    return norms, C, total, int((norms > C).sum())


def _engine(cls, model, objective, *, C, sigma=0.0, B=40.0, seed=7):
    return cls(model, max_grad_norm=C, noise_multiplier=sigma, expected_batch_size=B,
               generator=torch.Generator().manual_seed(seed), objective=objective)


@pytest.mark.parametrize("name", ["multinomial", "linear"])
def test_output_gradient_is_autograds(name):
    obj = _objective(name)
    torch.manual_seed(0)
    z = torch.randn(30, K if name == "multinomial" else 1).squeeze(-1).requires_grad_(True)
    _, y = _batch(name, n=30)
    (expected,) = torch.autograd.grad(obj.per_example_loss(z, y).sum(), z)
    got = obj.output_gradient(z.detach(), y)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    buf = torch.full_like(expected, 99.0)  # the buffered path writes into its own buffer
    assert obj.output_gradient(z.detach(), y, out=buf) is buf
    torch.testing.assert_close(buf, expected, rtol=1e-6, atol=1e-7)
    if name == "multinomial":  # closed form: softmax(z) - onehot(y)
        onehot = torch.nn.functional.one_hot(y, K).float()
        torch.testing.assert_close(got, torch.softmax(z.detach(), 1) - onehot)
        assert float(got.sum(1).abs().max()) < 1e-6


@pytest.mark.parametrize("case", list(CASES))
def test_fast_engine_norms_and_clipped_sums_match_a_per_example_loop(case):
    """Fast path (closed form for one Linear, the buffered autograd-free path for the MLPs):
    the examples clipped and the clipped sum equal an explicit per-example loop's, over steps of
    different sizes (the workspace grows and is reused)."""
    name, build = CASES[case]
    obj = _objective(name)
    torch.manual_seed(1)
    model = build()
    eng = _engine(FastLinearEngine, model, obj, C=1.0)
    assert eng.fused and (eng.closed_form or eng.plan is not None)  # no autograd, no per-example gradient
    for step, n in enumerate([40, 25, 90]):
        x, y = _batch(name, n=n, seed=step)
        norms, C, expected, clipped = _reference(model, obj, x, y)
        assert clipped == n - n // 2 and (norms < C).sum() == n // 2
        eng.max_grad_norm = C
        stats = eng(x, y)
        assert stats.batch_size == n and stats.clipped == clipped
        assert stats.loss_sum == pytest.approx(float(obj.per_example_loss(model(x), y).sum().detach()), rel=1e-5)
        for p, e in zip(model.parameters(), expected):
            torch.testing.assert_close(p.grad * 40.0, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("case", ["linear-logit", "multinomial-logit", "multinomial-mlp"])
def test_each_clipped_example_has_norm_C_or_its_own(case):
    """One example at a time: the fast engine's gradient has the example's own norm when below
    C, exactly C above it (so the per-example norm the engine computes is the true one)."""
    name, build = CASES[case]
    obj = _objective(name)
    torch.manual_seed(2)
    model = build()
    x, y = _batch(name, n=20)
    per_ex = _per_example_grads(model, obj, x, y)
    C = 0.5
    for i in range(x.shape[0]):
        m = copy.deepcopy(model)
        _engine(FastLinearEngine, m, obj, C=C, B=1.0)(x[i:i + 1], y[i:i + 1])
        norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in m.parameters()))
        raw = math.sqrt(sum(float(g.pow(2).sum()) for g in per_ex[i]))
        assert norm == pytest.approx(min(raw, C), rel=1e-4)


@pytest.mark.parametrize("case", list(CASES))
def test_fast_engine_equals_opacus_with_noise(case):
    """Same batch, C at the median norm, same noise seed: the fast engine's noisy update equals
    Opacus' per-example gradients + the same clipping and draw."""
    name, build = CASES[case]
    obj = _objective(name)
    torch.manual_seed(3)
    model = build()
    x, y = _batch(name, n=64)
    _, C, _, _ = _reference(model, obj, x, y)
    grads = []
    for cls in (FastLinearEngine, OpacusEngine):
        m = copy.deepcopy(model)
        _engine(cls, m, obj, C=C, sigma=1.3, B=60.0, seed=11)(x, y)
        grads.append([p.grad.detach().clone() for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_binary_paths_are_unchanged():
    """A width-1 head with a Squeeze still takes the binary closed form / buffered path; a
    width-1 head without a Squeeze is not a buffered plan."""
    assert FastLinearEngine(logit(in_features=5), max_grad_norm=1.0, noise_multiplier=0.0, expected_batch_size=1.0,
                            generator=torch.Generator(), objective=BINARY).closed_form
    eng = FastLinearEngine(mlp(in_features=5, hidden=[4]), max_grad_norm=1.0, noise_multiplier=0.0,
                           expected_batch_size=1.0, generator=torch.Generator(), objective=BINARY)
    assert eng.plan is not None and eng._squeeze
    bare = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    assert FastLinearEngine(bare, max_grad_norm=1.0, noise_multiplier=0.0, expected_batch_size=1.0,
                            generator=torch.Generator(), objective=BINARY).plan is None


# ------------------------------------------------------------------ metrics


def test_multinomial_metrics_match_sklearn():
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    obj = _objective("multinomial")
    g = torch.Generator().manual_seed(4)
    y = torch.randint(0, K, (200,), generator=g)
    z = torch.randn(200, K, generator=g) + 1.5 * torch.nn.functional.one_hot(y, K)
    p = torch.softmax(z.double(), 1).numpy()
    m = obj.metrics(z, y)
    assert m["acc"] == pytest.approx(accuracy_score(y.numpy(), p.argmax(1)), abs=1e-12)
    assert m["loss"] == pytest.approx(log_loss(y.numpy(), p, labels=list(range(K))), rel=1e-5)
    assert m["auc"] == pytest.approx(roc_auc_score(y.numpy(), p, multi_class="ovr", average="macro"), rel=1e-9)
    # a tiny known case: 3 of 4 right; class 3 absent from the rows (left out of the macro AUC)
    z2 = torch.tensor([[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 2.0, 0], [2.0, 0, 0, 0]])
    y2 = torch.tensor([0, 1, 2, 2])
    m2 = obj.metrics(z2, y2)
    assert m2["acc"] == 0.75
    # one-vs-rest AUCs: class 0: 5/6 (row 3 ties the positive row 0), class 1: 1, class 2: 3/4
    assert m2["auc"] == pytest.approx((5 / 6 + 1 + 0.75) / 3)


def test_linear_metrics_are_in_original_units_and_match_sklearn():
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    obj = _objective("linear")  # bounds [10, 30]: t = 10 + 20 y
    z = torch.tensor([0.5, 0.25, 1.0, 0.0])
    y = torch.tensor([0.5, 0.75, 0.9, 0.1])
    m = obj.metrics(z, y)
    assert m["rmse"] == pytest.approx(20 * math.sqrt((0 + 0.25 + 0.01 + 0.01) / 4))
    assert m["mae"] == pytest.approx(20 * (0 + 0.5 + 0.1 + 0.1) / 4)
    assert m["loss"] == pytest.approx(0.5 * (0 + 0.25 + 0.01 + 0.01) / 4)
    t, t_hat = 10 + 20 * y.double().numpy(), 10 + 20 * z.double().numpy()
    assert m["rmse"] == pytest.approx(math.sqrt(mean_squared_error(t, t_hat)))
    assert m["mae"] == pytest.approx(mean_absolute_error(t, t_hat))
    assert m["r2"] == pytest.approx(r2_score(t, t_hat))
    assert obj.prediction_columns(z)["prediction"].tolist() == [20.0, 15.0, 30.0, 10.0]
    assert not obj.greater_is_better and obj.primary_metric == "rmse"
    assert Multinomial.greater_is_better and OBJECTIVES.get("binary").greater_is_better


# ------------------------------------------------------------------ the data's declared target


def _table(tmp_path, labels, name="t.csv"):
    rng = np.random.default_rng(0)
    n = len(labels)
    df = pd.DataFrame({"a": rng.uniform(0, 1, n), "y": labels, "split": ["train", "test"] * (n // 2)})
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path, df


def test_multiclass_target_is_class_indices_and_undeclared_labels_are_left_out(tmp_path):
    labels = ["lo", "mid", "hi", "mid"] * 25
    path, df = _table(tmp_path, labels)
    decl = {"target": "y", "classes": ["hi", "lo", "mid"], "numeric": {"a": {"lower": 0, "upper": 1}},
            "split_column": "split"}
    data = build_dataset(df, schema_from_config(decl), seed=0, source="t", origin="t")
    assert data.y_train.dtype == torch.int64 and data.spec.n_classes == 3
    codes = {"hi": 0, "lo": 1, "mid": 2}
    assert data.y_train.tolist() == [codes[v] for v in labels[::2]]
    bad = df.assign(y=["lo", "mid", "Zebra-secret", None] * 25)  # issue 44: left out and counted, not refused
    data = build_dataset(bad, schema_from_config(decl), seed=0, source="t", origin="t")
    assert data.y_train.tolist() == [codes["lo"]] * 25 and data.y_test.tolist() == [codes["mid"]] * 25
    assert data.diagnostics["rows"]["left_out_by"]["target"] == {"y": {"missing": 25, "undeclared": 25}}
    mapped = build_dataset(bad, schema_from_config({**decl, "label_map": {"y": {"Zebra-secret": "hi"}}}), seed=0,
                           source="t", origin="t")
    assert mapped.y_train.tolist() == [codes["lo"], codes["hi"]] * 25 and mapped.diagnostics["rows"]["mapped"] == {
        "y": 25}
    with pytest.raises(DPTrainError, match="data.label_map.y"):  # a map onto an undeclared class
        schema_from_config({**decl, "label_map": {"y": {"Zebra-secret": "zebra"}}})
    with pytest.raises(DPTrainError, match="data.positive and data.classes"):
        schema_from_config({**decl, "positive": "hi"})
    with pytest.raises(DPTrainError, match="data.classes"):
        schema_from_config({**decl, "classes": ["hi"]})


def test_continuous_target_is_clipped_scaled_and_counted_privately(tmp_path):
    path, df = _table(tmp_path, [5.0, 20.0, 40.0, 30.0] * 25)
    decl = {"target": "y", "target_bounds": {"lower": 10, "upper": 30}, "numeric": {"a": {"lower": 0, "upper": 1}},
            "split_column": "split"}
    data = build_dataset(df, schema_from_config(decl), seed=0, source="t", origin="t")
    assert data.y_train.dtype == torch.float32 and data.spec.target_bounds == (10.0, 30.0)
    assert data.y_train[:2].tolist() == [0.0, 1.0]  # 5 -> 10 -> 0; 40 -> 30 -> 1
    assert data.y_test[:2].tolist() == [0.5, 1.0]
    assert data.diagnostics["clipped"]["y"] == {"below_lower": 25, "above_upper": 25}
    with pytest.raises(DPTrainError, match="data.target_bounds"):
        schema_from_config({**decl, "target_bounds": {"lower": 30, "upper": 10}})
    with pytest.raises(DPTrainError, match="data.target_bounds.upper is missing"):
        schema_from_config({**decl, "target_bounds": {"lower": 1}})


def test_adult_target_choice_removes_it_from_the_features():
    from dptrain.settings.data import DataConfig

    base = schema_from_config(DataConfig(name="adult", schema="adult"))
    rel = schema_from_config(DataConfig(name="adult", schema="adult", target="relationship",
                                        classes=["Wife", "Own-child", "Husband", "Not-in-family",
                                                 "Other-relative", "Unmarried"]))
    assert rel.target == "relationship" and rel.positive is None and rel.target_kind == "multiclass"
    assert not any(f.startswith("relationship=") for f in rel.feature_names)
    assert len(rel.feature_names) == len(base.feature_names) - 7  # 6 categories + the other slot
    hours = schema_from_config(DataConfig(name="adult", schema="adult", target="hours_per_week",
                                          target_bounds={"lower": 1, "upper": 99}))
    assert "hours_per_week" not in hours.feature_names and hours.target_bounds == (1.0, 99.0)
    assert base.target == "income" and base.positive == ">50K" and base.target_kind == "binary"
    with pytest.raises(DPTrainError, match="data.target='relationship' is not allowed alone"):
        schema_from_config(DataConfig(name="adult", schema="adult", target="relationship"))
    sex = schema_from_config(DataConfig(name="adult", schema="adult", target="sex", positive="Female",
                                        negative="Male"))
    assert sex.target_kind == "binary" and not any(f.startswith("sex=") for f in sex.feature_names)
    assert sex.target_labels == ("Male", "Female") and base.target_labels == ("<=50K", ">50K")
    with pytest.raises(DPTrainError, match="data.positive='Female' is not allowed alone"):
        schema_from_config(DataConfig(name="adult", schema="adult", target="sex", positive="Female"))


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("extra,needle", [
    (["objective=linear"], "objective=linear is not allowed for a 'binary' target"),
    (["objective=multinomial"], "objective=multinomial is not allowed for a 'binary' target"),
    (["data.classes=[lo,hi]"], "objective=binary is not allowed for a 'multiclass' target"),
    (["objective=linear", "data.classes=[lo,hi]"], "data.target_bounds={lower: L, upper: U}"),
    (["objective=multinomial", "data.target_bounds={lower: 0, upper: 1}"], "objective=multinomial is not allowed"),
])
def test_wrong_target_kinds_are_refused_by_name_before_the_data_is_read(extra, needle, tmp_path, capsys):
    missing = tmp_path / "never-read.csv"  # the refusal comes first: the file does not even exist
    with pytest.raises(SystemExit) as exc:
        cli.run(_compose(["experiment=logit", "data=table", f"data.path={missing}", "data.target=y",
                          "++data.numeric={a: {lower: 0, upper: 1}}", *extra]), run_dir=tmp_path / "run")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "never-read" not in err


# ------------------------------------------------------------------ the presets end to end

FAST = ["trainer.epochs=1", "trainer.progress=false", "trainer.baseline=false", "logger.tensorboard=false"]


def test_multiclass_preset_end_to_end_and_predictions(tmp_path):
    from dptrain.data import load_adult_frame
    from dptrain.tasks.predict import load_model

    run = tmp_path / "mc"
    acc = cli.run(_compose(["experiment=multiclass", *FAST]), run_dir=run)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/acc"] == acc and 0.6 < acc < 0.95  # majority class (Husband) ~0.40
    assert 0.75 < metrics["test/auc"] < 1 and 0 < metrics["test/loss"] < 1.6
    assert 0.2 < metrics["privacy/epsilon"] < 0.5  # one epoch of the ~1-epsilon preset
    model = load_model(run)
    rows = load_adult_frame().iloc[:50]
    proba = model.predict_proba(rows)
    assert proba.shape == (50, 6) and np.allclose(proba.sum(1), 1.0)
    classes = ["Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"]
    assert list(model.classes_) == classes
    assert list(model.predict(rows)) == [classes[k] for k in proba.argmax(1)]
    frame = model.prediction_frame(rows)
    assert list(frame.columns) == [f"p_{c}" for c in classes] + ["label"]
    assert model.decision_function(rows).shape == (50, 6)


def test_linreg_preset_end_to_end_and_predictions(tmp_path):
    from dptrain.data import load_adult_frame
    from dptrain.tasks.predict import load_model

    run = tmp_path / "lr"
    rmse = cli.run(_compose(["experiment=linreg", *FAST]), run_dir=run)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/rmse"] == rmse and 10 < rmse < 14  # predicting the mean: ~12.5 hours
    assert metrics["test/mae"] < rmse and -0.3 < metrics["test/r2"] < 0.3
    assert "test/acc" not in metrics
    model = load_model(run)
    rows = load_adult_frame().iloc[:50]
    pred = model.predict(rows)
    raw = model.decision_function(rows)
    assert np.allclose(pred, 1 + 98 * raw) and 20 < pred.mean() < 60  # hours per week, original units
    assert list(model.prediction_frame(rows).columns) == ["prediction"]


def test_preset_target_is_not_a_feature_and_runs_on_opacus(tmp_path):
    cfg = _compose(["experiment=multiclass", *FAST, "trainer.engine=opacus", "trainer.epochs=0.2"])
    data = load_dataset(cfg.data, seed=0)
    assert not any(f.startswith("relationship=") for f in data.feature_names)
    assert data.spec.n_classes == 6 and data.y_train.max() == 5
    acc = cli.run(cfg, run_dir=tmp_path / "op")
    assert 0.3 < acc < 0.95
    privacy = json.loads((tmp_path / "op" / "privacy.json").read_text())
    assert privacy["engine"] == "opacus"


def test_sweep_summary_refuses_a_regression_sweep_by_name(tmp_path):
    """scripts/summarize_sweep.py compares classifiers (test/acc, loss, auc): a run of
    objective=linear is refused by name rather than summarised as empty accuracy columns."""
    import importlib.util
    from pathlib import Path

    import yaml

    script = Path(__file__).resolve().parents[1] / "scripts" / "summarize_sweep.py"
    spec = importlib.util.spec_from_file_location("summarize_sweep", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run = tmp_path / "sweep" / "seed=0"
    (run / "private").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / "private" / "metrics.json").write_text(json.dumps({"test/rmse": 11.4}))
    (run / "privacy.json").write_text(json.dumps({"private": True, "epsilon": 1.0, "seed": 0}))
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"objective": {"name": "linear"}, "seed": 0}))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["seed=0"]))
    with pytest.raises(SystemExit, match="objective=linear"):
        mod.load_runs(tmp_path / "sweep")
