"""Issue 46 (3): task=predict on real rows. A missing, infinite or non-numeric number in a numeric
feature column is refused by default (predict.missing=refuse) or, with predict.missing=nan, its row
is kept with empty prediction columns and counted PRIVATELY (private/predict_counts.json, never the
console); a blank category goes to <other>. The label column holds the model's declared labels
(label_01 keeps the 0/1). The data settings that apply to scoring (thousands, decimal) are
accepted; a training data setting (data.nonfinite, data.target ...) is refused saying what
applies instead, not "choose the source with data=NAME"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.core.validation import ConfigError
from dptrain.data import DataError
from dptrain.tasks import cli
from dptrain.tasks.predict import load_model

SCHEMA = ["data=table", "data.target=y", "data.positive=yes", "data.negative=no",
          "++data.numeric={x: {lower: 0, upper: 1000}, z: {lower: 0, upper: 10}}", "++data.categorical={c: [u, v]}"]
QUICK = ["experiment=logit", "trainer.epochs=2", "trainer.batch_size=40", "trainer.progress=false",
         "trainer.baseline=false", "logger.tensorboard=false"]
#: rows of the file to score with a missing (1), non-numeric (3) or infinite (5) number; 6: a blank category
HOLES = {1: ("x", None), 3: ("x", "unknown"), 5: ("z", "inf"), 6: ("c", None)}


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x, z = rng.uniform(0, 1000, n).round(1), rng.uniform(0, 10, n).round(2)
    y = np.where(x / 1000 + z / 10 + rng.normal(0, 0.3, n) > 1.0, "yes", "no")
    return pd.DataFrame({"id": np.arange(n) + 100, "x": x, "z": z, "c": rng.choice(["u", "v"], n), "y": y})


@pytest.fixture(scope="module")
def model_run(tmp_path_factory) -> Path:
    """A logit model trained on a small table whose binary target is labelled yes / no."""
    folder = tmp_path_factory.mktemp("rows_model")
    _table(400, 0).to_csv(folder / "train.csv", index=False)
    cli.run(_compose([*QUICK, *SCHEMA, f"data.path={folder / 'train.csv'}"]), run_dir=folder / "run")
    return folder / "run"


@pytest.fixture()
def holed(tmp_path) -> tuple[Path, pd.DataFrame]:
    """A file of 30 rows to score with the HOLES planted (written as a user's CSV: empty cells)."""
    df = _table(30, 1).drop(columns="y").astype({"x": object, "z": object})
    for row, (col, value) in HOLES.items():
        df.loc[row, col] = value
    path = tmp_path / "holed.csv"
    df.to_csv(path, index=False)
    return path, df


def _predict(overrides: list[str], run_dir: Path) -> None:
    cli.run(_compose(["task=predict", *overrides]), run_dir=run_dir)


def test_the_nan_policy_keeps_every_row_and_scores_only_the_holed_ones_as_nan(model_run, holed, tmp_path):
    path, df = holed
    _predict([f"run={model_run}", f"data.path={path}", "predict.missing=nan", "data.keep_columns=[id]"],
             tmp_path / "pred")
    out = pd.read_csv(tmp_path / "pred" / "private" / "predictions.csv", keep_default_na=False, na_values=[""])
    assert list(out.columns) == ["id", "score", "probability", "label", "label_01"]
    assert len(out) == len(df) and out["id"].tolist() == df["id"].tolist()  # every row kept, in its place
    nan_rows = [1, 3, 5]
    assert out.loc[nan_rows, ["score", "probability", "label", "label_01"]].isna().all().all()
    whole = [i for i in range(len(df)) if i not in nan_rows]
    assert out.loc[whole].notna().all().all()
    model = load_model(model_run)
    api = model.decision_function(pd.read_csv(path), missing="nan")
    assert np.array_equal(out["score"].to_numpy(), api, equal_nan=True)  # the API's numbers, exactly
    # the other rows score as they do without the holed rows (to float32 rounding of the text's parse)
    expected = model.decision_function(df.loc[whole].astype({"x": float, "z": float}))
    assert np.allclose(out.loc[whole, "score"].to_numpy(), expected, rtol=1e-6, atol=1e-6)
    # a blank category is scored through <other>, as an undeclared label is
    other = df.loc[whole].astype({"x": float, "z": float})
    other.loc[6, "c"] = "not declared"
    assert np.array_equal(model.decision_function(other), expected) and 6 in whole
    counts = json.loads((tmp_path / "pred" / "private" / "predict_counts.json").read_text())
    assert counts == {"rows_read": 30, "rows_scored_as_nan": 3,
                      "numeric_columns": {"x": {"missing": 1, "infinite": 0, "not_a_number": 1},
                                          "z": {"missing": 0, "infinite": 1, "not_a_number": 0}}}
    files = (tmp_path / "pred" / "FILES.txt").read_text()
    assert "private/predict_counts.json" in files.split("PRIVATE:")[1]


def test_the_nan_policy_says_the_same_whether_or_not_a_row_had_a_hole(model_run, holed, tmp_path, caplog):
    """The count is private: the console (the log) and the folder's file list read the same for a
    file with three holed rows and for the same file without a hole."""
    path, df = holed
    clean = tmp_path / "clean.csv"
    _table(30, 1).drop(columns="y").to_csv(clean, index=False)
    seen = []
    for name, rows in (("holed", path), ("clean", clean)):
        caplog.clear()
        with caplog.at_level("INFO"):
            _predict([f"run={model_run}", f"data.path={rows}", "predict.missing=nan"], tmp_path / name)
        lines = [r.getMessage().replace(str(rows), "ROWS").replace(str(tmp_path / name), "OUT").replace(
            f"'{rows}'", "ROWS") for r in caplog.records]
        listing = [line.split()[0] for line in (tmp_path / name / "FILES.txt").read_text().splitlines()
                   if line.startswith("  ") and "private/" in line]
        seen.append((lines, listing))
    assert seen[0] == seen[1] and seen[0][0], seen
    assert any("private/predict_counts.json (PRIVATE)" in line for line in seen[0][0])
    assert json.loads((tmp_path / "clean" / "private" / "predict_counts.json").read_text())["rows_scored_as_nan"] == 0


def test_the_default_refuses_a_hole_naming_the_column_and_the_nan_policy(model_run, holed, tmp_path, capsys):
    path, _ = holed
    with pytest.raises(SystemExit) as stop:
        _predict([f"run={model_run}", f"data.path={path}"], tmp_path / "refused")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "data.numeric.x" in err and "predict.missing=nan" in err
    assert "unknown" not in err  # no value of the rows is quoted
    assert not (tmp_path / "refused" / "private" / "predictions.csv").exists()
    model = load_model(model_run)
    rows = pd.read_csv(path)
    with pytest.raises(DataError, match="data.numeric.x"):
        model.predict(rows)
    with pytest.raises(ConfigError, match="predict.missing='maybe'"):
        model.predict(rows, missing="maybe")


def test_the_api_takes_the_nan_policy_too(model_run, holed):
    _, df = holed
    model = load_model(model_run)
    z = model.decision_function(df, missing="nan")
    assert np.isnan(z[[1, 3, 5]]).all() and np.isfinite(np.delete(z, [1, 3, 5])).all()
    assert np.isnan(model.predict_proba(df, missing="nan")[[1, 3, 5]]).all()
    labels = model.predict(df, missing="nan")
    assert np.isnan(labels[[1, 3, 5]]).all() and set(np.delete(labels, [1, 3, 5])) <= {0, 1}
    assert np.isnan(model.encode(df, missing="nan")[[1, 3, 5]]).all()


def test_labels_are_written_in_the_users_words(model_run, tmp_path):
    rows = _table(60, 2).drop(columns="y")
    rows.to_csv(tmp_path / "rows.csv", index=False)
    _predict([f"run={model_run}", f"data.path={tmp_path / 'rows.csv'}"], tmp_path / "pred")
    out = pd.read_csv(tmp_path / "pred" / "private" / "predictions.csv")
    assert list(out.columns) == ["score", "probability", "label", "label_01"]
    assert set(out["label"]) == {"yes", "no"}  # both predicted on these rows
    assert out["label"].tolist() == np.where(out["score"] > 0, "yes", "no").tolist()
    assert out["label_01"].tolist() == (out["score"] > 0).astype(int).tolist()
    model = load_model(model_run)
    assert out["label_01"].tolist() == model.predict(rows).tolist()  # the API's predict keeps 0/1 (classes_)
    pd.testing.assert_frame_equal(out, model.prediction_frame(rows), check_dtype=False)
    assert "label = 'yes' or 'no'" in (tmp_path / "pred" / "FILES.txt").read_text()


def test_numbers_written_with_separators_are_read_with_predicts_own_settings(model_run, tmp_path, capsys):
    rows = _table(40, 3).drop(columns="y")
    rows["x"] *= 5  # thousands written with a separator (clipped to the declared 1000 alike)
    rows.to_csv(tmp_path / "plain.csv", index=False)
    european = rows.assign(x=[f"{v:,.1f}".replace(",", " ").replace(".", ",") for v in rows["x"]],
                           z=[f"{v:.2f}".replace(".", ",") for v in rows["z"]])
    assert (european["x"].str.contains(" ") & european["x"].str.contains(",")).any()
    european.to_csv(tmp_path / "eu.csv", sep=";", index=False)
    _predict([f"run={model_run}", f"data.path={tmp_path / 'plain.csv'}"], tmp_path / "plain")
    _predict([f"run={model_run}", f"data.path={tmp_path / 'eu.csv'}", "data.delimiter=';'",
              "data.thousands=' '", "data.decimal=','"], tmp_path / "eu")
    plain = pd.read_csv(tmp_path / "plain" / "private" / "predictions.csv")
    eu = pd.read_csv(tmp_path / "eu" / "private" / "predictions.csv")
    pd.testing.assert_frame_equal(plain, eu)
    with pytest.raises(SystemExit) as stop:  # the same file read as the model's file wrote numbers: refused
        _predict([f"run={model_run}", f"data.path={tmp_path / 'eu.csv'}", "data.delimiter=';'"], tmp_path / "no")
    assert stop.value.code == 2 and "data.thousands and data.decimal" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # refused by name, together
        _predict([f"run={model_run}", f"data.path={tmp_path / 'eu.csv'}", "data.thousands=','",
                  "data.decimal=','"], tmp_path / "both")
    assert stop.value.code == 2 and "data.thousands=',' and data.decimal=','" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        _predict([f"run={model_run}", f"data.path={tmp_path / 'eu.csv'}", "data.thousands=x"], tmp_path / "x")
    assert stop.value.code == 2 and "data.thousands='x' is not allowed: must be one of" in capsys.readouterr().err


@pytest.mark.parametrize(("override", "advice"), [
    ("+data.nonfinite=drop", "follows predict.missing"),
    ("++data.target=income", "model's declaration"),
    ("+data.split_column=part", "splits nothing"),
    ("+data.unlisted=drop", "<other> slot"),
    ("+data.name=adult", "reads one file, data.path"),
])
def test_training_data_settings_are_refused_with_what_applies_instead(model_run, override, advice, tmp_path,
                                                                       capsys):
    with pytest.raises(SystemExit) as stop:
        _predict([f"run={model_run}", f"data.path={tmp_path}/none.csv", override], tmp_path / "out")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and advice in err and "not a setting of task=predict" in err, err
    assert "data=NAME" not in err.replace("task=train's data=NAME", "")


def test_the_issues_command_line_gets_the_right_advice(model_run, tmp_path):
    """The issue's report: `data.nonfinite=drop` (no +) said 'choose the source with data=NAME'."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    res = subprocess.run([sys.executable, "-m", "dptrain", "task=predict", f"run={model_run}",
                          f"data.path={tmp_path}/x.csv", "data.nonfinite=drop", f"hydra.run.dir={tmp_path}/out"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "data.nonfinite (a missing, infinite or non-numeric entry" in res.stderr
    assert "predict.missing: refuse (the default) or nan" in res.stderr and "data=NAME" not in res.stderr


@pytest.mark.parametrize("kind", ["multinomial", "linear"])
def test_the_nan_policy_for_multinomial_and_linear_models(kind, holed, tmp_path):
    """The class's name (multinomial) and the prediction in original units (linear) are empty too,
    the other rows scored as the API scores them."""
    path, df = holed
    train = _table(300, 4).assign(y=lambda t: np.where(t.z > 6, "hi", np.where(t.z > 3, "mid", "lo")),
                                  w=lambda t: t.x / 10)
    train.to_csv(tmp_path / "train.csv", index=False)
    declare = {"multinomial": ["objective=multinomial", "data.target=y", "data.classes=[lo,mid,hi]"],
               "linear": ["objective=linear", "data.target=w", "++data.target_bounds={lower: 0, upper: 100}"]}[kind]
    schema = [s for s in SCHEMA if not s.startswith(("data.target=", "data.positive", "data.negative"))]
    cli.run(_compose([*QUICK, *schema, *declare, "data.positive=null", f"data.path={tmp_path / 'train.csv'}"]),
            run_dir=tmp_path / "run")
    _predict([f"run={tmp_path / 'run'}", f"data.path={path}", "predict.missing=nan"], tmp_path / "pred")
    out = pd.read_csv(tmp_path / "pred" / "private" / "predictions.csv")
    label = "label" if kind == "multinomial" else "prediction"
    assert len(out) == 30 and out.loc[[1, 3, 5]].isna().all().all() and out.drop(index=[1, 3, 5]).notna().all().all()
    expected = load_model(tmp_path / "run").prediction_frame(pd.read_csv(path), missing="nan")
    assert out[label].drop(index=[1, 3, 5]).tolist() == expected[label].drop(index=[1, 3, 5]).tolist()
    if kind == "multinomial":
        assert set(out[label].dropna()) <= {"lo", "mid", "hi"} and pd.isna(expected[label][1])
        assert load_model(tmp_path / "run").predict(pd.read_csv(path), missing="nan")[1] is None
