"""A trained model is a publishable artifact with its public feature encoder: model.pt scores new
rows without the config that trained it, through the API (load_model) and the command line
(task=predict), with the same predictions; bad input is refused by name before any row is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from dptrain.data import DataError, load_adult_frame, load_dataset, schema_from_config
from dptrain.tasks import cli
from dptrain.tasks.predict import load_model
from dptrain.training.checkpoint import CheckpointError

REPO = Path(__file__).resolve().parents[1]
FAST = ["trainer.epochs=1", "trainer.progress=false", "trainer.baseline=false", "logger.tensorboard=false"]


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture(scope="module")
def logit_run(tmp_path_factory) -> Path:
    """`experiment=logit` (one epoch) on the shipped Adult data: a run folder with model.pt."""
    run = tmp_path_factory.mktemp("logit_run")
    cli.run(_compose(["experiment=logit", *FAST]), run_dir=run)
    return run


@pytest.fixture(scope="module")
def new_rows(tmp_path_factory) -> Path:
    """New rows to score: Adult rows without the target, plus an id and an unrelated column."""
    df = load_adult_frame().iloc[::97].drop(columns=["income", "split"]).reset_index(drop=True)
    df.insert(0, "id", np.arange(len(df)) * 7 + 3)
    df["note"] = "unused"
    path = tmp_path_factory.mktemp("rows") / "new.csv"
    df.to_csv(path, index=False)
    return path


def test_model_file_holds_weights_and_the_resolved_public_schema_only(logit_run):
    state = torch.load(logit_run / "model.pt", weights_only=True)
    assert state["format"] == "dptrain-model-v2" and state["objective"] == "binary"
    # the logit preset keeps one coding of education (data.exclude=[education_num]): 111 features
    assert state["model"]["_target_"] == "dptrain.models.networks.logit" and state["in_features"] == 111
    schema = state["schema"]
    declared = schema_from_config(OmegaConf.to_object(_compose(["experiment=logit"])).data)
    assert schema["target"] == declared.target == "income" and schema["positive"] == declared.positive == ">50K"
    assert {s["name"]: (s["lower"], s["upper"], s["transform"]) for s in schema["numeric"]} == {
        s.name: (s.lower, s.upper, s.transform) for s in declared.numeric}
    assert schema["numeric"][0] == {"name": "age", "lower": 17.0, "upper": 90.0, "transform": "none"}
    assert {c["name"]: tuple(c["labels"]) for c in schema["categorical"]} == dict(declared.categorical)
    assert "Married-civ-spouse" in dict(declared.categorical)["marital_status"]
    assert state["feature_names"] == schema["feature_names"] and len(state["feature_names"]) == 111
    privacy = json.loads((logit_run / "privacy.json").read_text())
    assert state["guarantee"] == privacy["guarantee"] and state["privacy"]["epsilon"] == privacy["epsilon"]
    # the data config's other settings (paths, split, sizes) are not in the model file
    assert set(schema) == {"target", "positive", "negative", "numeric", "categorical", "feature_names"}
    assert set(state) == {"format", "state_dict", "model", "in_features", "objective", "schema", "feature_names",
                          "guarantee", "privacy", "coefficients"}
    # the coefficient table (publishable, as coefficients.csv) travels with the model: load_model(run).coefficients()
    table = pd.read_csv(logit_run / "coefficients.csv")
    assert state["coefficients"]["table"]["term"] == table.term.tolist()


def test_loaded_model_encodes_like_training_and_scores_like_the_trained_model(logit_run):
    model = load_model(logit_run)  # the folder, or its model.pt
    assert load_model(logit_run / "model.pt").feature_names == model.feature_names
    cfg = _compose(["experiment=logit"])
    data = load_dataset(OmegaConf.to_object(cfg).data, seed=0)
    frame = load_adult_frame()
    test_rows = frame[frame["split"] == "test"].drop(columns=["income"])
    x = model.encode(test_rows)
    assert np.array_equal(x, data.x_test.numpy())  # the same public encoder as the training run
    z = model.decision_function(test_rows)
    state = torch.load(logit_run / "model.pt", weights_only=True)["state_dict"]
    w, b = state["0.weight"].double().numpy()[0], float(state["0.bias"])
    assert np.allclose(z, x.astype(np.float64) @ w + b, atol=1e-5)
    proba = model.predict_proba(test_rows)
    assert proba.shape == (len(test_rows), 2) and np.allclose(proba.sum(1), 1.0)
    assert np.array_equal(model.predict(test_rows), (z > 0).astype(int))
    y = (frame.loc[frame["split"] == "test", "income"].str.strip() == ">50K").to_numpy()
    assert (model.predict(test_rows) == y).mean() > 0.8


def test_missing_declared_columns_are_refused_by_name(logit_run):
    model = load_model(logit_run)
    rows = load_adult_frame().head(20).drop(columns=["age", "sex", "income"])
    with pytest.raises(DataError) as err:
        model.predict(rows)
    assert "'age' (data.numeric.age)" in str(err.value) and "'sex' (data.categorical.sex)" in str(err.value)
    rows = load_adult_frame().head(20)
    rows.loc[3, "hours_per_week"] = np.nan
    with pytest.raises(DataError, match="data.numeric.hours_per_week"):
        model.predict(rows)


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "dptrain", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_cli_predictions_equal_the_api_predictions(logit_run, new_rows, tmp_path):
    """`experiment=logit`'s model scores a CSV of new rows through the command line and through
    load_model with the same predictions, one row per input row, in a new run folder."""
    res = _cli(["task=predict", f"run={logit_run}", f"data.path={new_rows}", "data.keep_columns=[id]",
                f"hydra.run.dir={tmp_path}/pred"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = pd.read_csv(tmp_path / "pred" / "private" / "predictions.csv")
    rows = pd.read_csv(new_rows)
    assert list(out.columns) == ["id", "score", "probability", "label", "label_01"] and len(out) == len(rows)
    model = load_model(logit_run)
    assert np.array_equal(out["id"].to_numpy(), rows["id"].to_numpy())
    assert np.array_equal(out["score"].to_numpy(), model.decision_function(rows))
    assert np.array_equal(out["probability"].to_numpy(), model.predict_proba(rows)[:, 1])
    assert np.array_equal(out["label_01"].to_numpy(), model.predict(rows))  # the API's predict: 0/1 (classes_)
    assert out["label"].tolist() == np.where(out["label_01"] == 1, ">50K", "<=50K").tolist()  # the declared labels
    files = (tmp_path / "pred" / "FILES.txt").read_text()
    private_part = files.split("PRIVATE:")[1]
    assert "private/predictions.csv" in private_part and "computed from those rows" in private_part
    assert "as private as those rows" in private_part and "TRAINING rows only" in files
    assert not (tmp_path / "pred" / "predictions.csv").exists()
    assert (logit_run / "model.pt").exists() and not (logit_run / "private" / "predictions.csv").exists()


def _predict_inprocess(overrides: list[str], run_dir: Path) -> float:
    return cli.run(_compose(["task=predict", *overrides]), run_dir=run_dir)


def test_public_rows_give_publishable_predictions(logit_run, new_rows, tmp_path):
    _predict_inprocess([f"run={logit_run}", f"data.path={new_rows}", "data.public=true"], tmp_path)
    out = pd.read_csv(tmp_path / "predictions.csv")
    assert list(out.columns) == ["score", "probability", "label", "label_01"]
    assert "predictions.csv" in (tmp_path / "FILES.txt").read_text().split("PRIVATE:")[0]


def test_public_predictions_are_vouched_for_by_the_folders_list(logit_run, new_rows, tmp_path):
    """Issue 45: predict wrote FILES.txt before its predictions, so publishable predictions
    (data.public=true) had no digest and `dptrain verify` failed on them as UNLISTED. The folder now
    writes its list last: the predictions are digested and the folder verifies; private ones (under
    private/) are not digested."""
    from dptrain.runfolder import verify

    _predict_inprocess([f"run={logit_run}", f"data.path={new_rows}", "data.public=true"], tmp_path / "pub")
    rows, ok = verify.verify_run(tmp_path / "pub")
    assert ok and ("predictions.csv", "ok") in [(r[0], r[1]) for r in rows], rows
    _predict_inprocess([f"run={logit_run}", f"data.path={new_rows}"], tmp_path / "priv")
    assert "predictions.csv" not in verify.read_manifest_digests(tmp_path / "priv")


def test_parquet_and_semicolon_files_score_like_the_api(logit_run, new_rows, tmp_path):
    rows = pd.read_csv(new_rows)
    rows.to_parquet(tmp_path / "new.parquet")
    rows.to_csv(tmp_path / "new_semi.csv", sep=";", index=False)
    expected = load_model(logit_run).decision_function(rows)
    for i, extra in enumerate([[f"data.path={tmp_path}/new.parquet"],
                               [f"data.path={tmp_path}/new_semi.csv", "data.delimiter=';'"]]):
        _predict_inprocess([f"run={logit_run}", *extra], tmp_path / str(i))
        out = pd.read_csv(tmp_path / str(i) / "private" / "predictions.csv")
        assert np.array_equal(out["score"].to_numpy(), expected)


def test_refusals_come_before_any_row_is_read(logit_run, new_rows, tmp_path, capsys, monkeypatch):
    import dptrain.tasks.predict as predict

    def no_rows(*args, **kwargs):
        raise AssertionError("a row was read")

    monkeypatch.setattr(predict, "read_table", no_rows)
    lacking = tmp_path / "lacking.csv"
    pd.read_csv(new_rows).drop(columns=["age", "workclass"]).to_csv(lacking, index=False)
    cases = [
        ([f"run={tmp_path}", f"data.path={new_rows}"], "run="),  # a folder without model.pt
        ([f"data.path={new_rows}"], "run=None"),
        ([f"run={logit_run}"], "data.path"),
        ([f"run={logit_run}", f"data.path={lacking}"], "'age' (data.numeric.age), 'workclass' (data.categorical"),
        ([f"run={logit_run}", f"data.path={new_rows}", "data.keep_columns=[nope]"], "data.keep_columns"),
    ]
    for overrides, needle in cases:
        with pytest.raises(SystemExit) as exc:
            _predict_inprocess(overrides, tmp_path / "out")
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert needle in err, err
    assert not (tmp_path / "out" / "FILES.txt").exists()
    with pytest.raises(SystemExit):  # never into the training run folder itself
        _predict_inprocess([f"run={logit_run}", f"data.path={new_rows}"], logit_run)
    assert "training run folder" in capsys.readouterr().err


def test_model_files_that_cannot_be_used_are_refused(logit_run, tmp_path):
    state = torch.load(logit_run / "model.pt", weights_only=True)
    old = {k: state[k] for k in ("state_dict", "model", "feature_names", "guarantee")}
    torch.save({**old, "format": "dptrain-model-v1", "schema": {}}, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="older dptrain"):
        load_model(tmp_path / "old.pt")
    torch.save({**state, "model": {"_target_": "os.getcwd"}}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="trust_model_target"):
        load_model(tmp_path / "foreign.pt")
    torch.save({**state, "model": {"_target_": "dptrain.models.networks.mlp", "hidden": [4]}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="cannot be rebuilt"):
        load_model(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_model(tmp_path / "junk.pt")


def user_net(*, in_features: int, width: int = 6) -> torch.nn.Sequential:
    """A model of the user's own (model._target_=test_predict.user_net)."""
    from dptrain.privacy.dpsgd.layers import Squeeze

    return torch.nn.Sequential(torch.nn.Linear(in_features, width), torch.nn.Tanh(), torch.nn.Linear(width, 1),
                               Squeeze())


def test_a_custom_model_target_trains_and_loads_only_when_trusted(new_rows, tmp_path):
    """`model._target_=module.function` trains the user's own model from the command line; its
    model.pt names that builder, which load_model / task=predict build only when trusted."""
    cli.run(_compose(["experiment=logit", *FAST, "model._target_=test_predict.user_net"]), run_dir=tmp_path / "run")
    with pytest.raises(CheckpointError, match="trust_model_target"):
        load_model(tmp_path / "run")
    model = load_model(tmp_path / "run", trust_model_target=True)
    assert isinstance(model.module[1], torch.nn.Tanh) and model.module[0].out_features == 6
    rows = pd.read_csv(new_rows)
    with pytest.raises(SystemExit):
        _predict_inprocess([f"run={tmp_path / 'run'}", f"data.path={new_rows}"], tmp_path / "refused")
    _predict_inprocess([f"run={tmp_path / 'run'}", f"data.path={new_rows}", "trust_model_target=true"],
                       tmp_path / "pred")
    out = pd.read_csv(tmp_path / "pred" / "private" / "predictions.csv")
    assert np.array_equal(out["score"].to_numpy(), model.decision_function(rows))
