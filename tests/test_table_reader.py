"""One reader of a user's table (dptrain.data.reading.read_table): training, task=release,
task=predict and dptrain check read a file through it, with the same location check, format
detection, delimiter, byte order mark, numbers written with data.thousands / data.decimal and
header checks. A table written the European way (a byte order mark, ';' between fields, numbers
like 12.345,6) reads as the same table written plainly, in every entry point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from dptrain.data import DataError, load_dataset, read_table
from dptrain.data.files import locate
from dptrain.settings.data import DataConfig, NumericColumn
from dptrain.tasks import check as table_check
from dptrain.tasks import cli
from dptrain.tasks.predict import load_model
from dptrain.tasks.release import load_rows

N = 240
EUROPEAN = ["data.delimiter=';'", "data.thousands=.", "data.decimal=','"]
DECLARED = ["data=table", "data.target=answer", "data.positive=yes", "data.negative=no", "data.split_key=[id]",
            "++data.numeric={income: {lower: 0, upper: 20000}, rank: {lower: 0, upper: 1}}",
            "++data.categorical={region: [N, S]}"]
RELEASE = ["task=release", "data=table", "release.x=rank", "release.y=income", "release.cells=[cell]",
           "release.cell_values={cell: [1, 2, 3, 4]}", "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 20000}",
           "release.method=ss_laplace", "release.private_evaluation=false"]
TRAIN = ["experiment=logit", "trainer.epochs=1", "trainer.batch_size=64", "trainer.progress=false",
         "trainer.baseline=false", "logger.tensorboard=false", "estimator.interval_share=0",
         "privacy.noise_multiplier=1.0"]


def _plain() -> pd.DataFrame:
    """The table: income (a feature, first: the byte order mark precedes its name), rank, region,
    cell, the target answer and an id (the split's key, so both files split alike)."""
    rng = np.random.default_rng(0)
    income = np.round(rng.uniform(0, 20000, N), 1)
    rank = np.round(rng.uniform(0, 1, N), 3)
    answer = np.where(rng.random(N) < 1 / (1 + np.exp(-(income / 5000 - 2 + rank))), "yes", "no")
    return pd.DataFrame({"income": income, "rank": rank, "region": rng.choice(["N", "S"], N),
                         "cell": rng.integers(1, 5, N), "answer": answer, "id": np.arange(N)})


def _european(v: float, digits: int) -> str:
    """12345.6 -> '12.345,6' (a '.' between digit groups, a decimal comma)."""
    return f"{v:,.{digits}f}".replace(",", "_").replace(".", ",").replace("_", ".")


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> tuple[Path, Path, pd.DataFrame]:
    folder = tmp_path_factory.mktemp("tables")
    df = _plain()
    plain, messy = folder / "plain.csv", folder / "european.csv"
    df.to_csv(plain, index=False)
    written = df.assign(income=[_european(v, 1) for v in df.income], rank=[_european(v, 3) for v in df["rank"]])
    assert written.income.str.contains(r"\.\d{3},").any()  # digit groups, not only decimal commas
    written.to_csv(messy, sep=";", index=False, encoding="utf-8-sig")
    assert messy.read_bytes().startswith(b"\xef\xbb\xbfincome;")
    return plain, messy, df


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _data_cfg(path: Path, european: bool) -> DataConfig:
    more = {"delimiter": ";", "thousands": ".", "decimal": ","} if european else {}
    return DataConfig(name="table", path=str(path), target="answer", positive="yes", negative="no",
                      numeric={"income": NumericColumn(0, 20000), "rank": NumericColumn(0, 1)},
                      categorical={"region": ["N", "S"]}, split_key=["id"], **more)


def test_training_reads_the_european_file_as_the_plain_one(tables):
    plain, messy, _ = tables
    a, b = load_dataset(_data_cfg(plain, False), seed=3), load_dataset(_data_cfg(messy, True), seed=3)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert b.diagnostics["rows"]["left_out"] == 0 and a.n_train + a.n_test == N


def test_a_release_reads_x_and_y_with_the_declared_separators(tables, tmp_path, capsys):
    """task=release read its table with data.delimiter only: data.thousands / data.decimal were
    accepted and ignored, so every x and y written 12.345,6 was no number and its row left out."""
    plain, messy, df = tables
    rows, *_ = load_rows(OmegaConf.to_object(_compose([*RELEASE, f"data.path={messy}", *EUROPEAN])))
    assert np.array_equal(rows["income"].to_numpy(), df.income.to_numpy())
    assert np.array_equal(rows["rank"].to_numpy(), df["rank"].to_numpy())
    cli.run(_compose([*RELEASE, f"data.path={messy}", *EUROPEAN]), run_dir=tmp_path / "run")
    counts = json.loads((tmp_path / "run" / "private" / "data_diagnostics.json").read_text())
    assert counts["rows"]["read"] == counts["rows"]["kept"] == N, counts
    # dptrain check of that release reads them alike: no entry that is no number
    code = table_check.main([*RELEASE, f"data.path={messy}", *EUROPEAN, f"hydra.run.dir={tmp_path / 'check'}"])
    assert code == 0
    report = json.loads((tmp_path / "check" / "private" / "check.json").read_text())
    assert report["numeric"]["income"]["not_a_number"] == report["numeric"]["rank"]["not_a_number"] == 0
    assert report["run"]["kept"] == N
    capsys.readouterr()


def test_a_release_refuses_a_missing_column_by_name_before_any_row_is_read(tables, monkeypatch):
    plain, _, _ = tables
    import dptrain.data.reading as reading

    monkeypatch.setattr(reading.pd, "read_csv", lambda *a, **k: pytest.fail("a row was read"))
    conf = OmegaConf.to_object(_compose([*RELEASE, f"data.path={plain}", "release.x=Rank"]))
    with pytest.raises(DataError, match=r"release.x: column 'Rank' is not in data.path=.*closest column names: "
                                         r"'rank'"):
        load_rows(conf)


@pytest.fixture(scope="module")
def european_run(tables, tmp_path_factory) -> Path:
    """A model trained on the European file (its schema keeps the declared separators)."""
    _, messy, _ = tables
    run = tmp_path_factory.mktemp("european_run")
    cli.run(_compose([*TRAIN, *DECLARED, f"data.path={messy}", *EUROPEAN]), run_dir=run)
    return run


def test_predict_scores_the_european_file_like_the_plain_rows(tables, european_run, tmp_path):
    """task=predict read the header with pandas' utf-8 (not utf-8-sig): the byte order mark stuck to
    the first column's name, and the model's feature 'income' was reported missing."""
    plain, messy, df = tables
    cli.run(_compose(["task=predict", f"run={european_run}", f"data.path={messy}", "data.delimiter=';'",
                      "data.keep_columns=[id]"]), run_dir=tmp_path / "pred")
    out = pd.read_csv(tmp_path / "pred" / "private" / "predictions.csv")
    model = load_model(european_run)
    assert np.array_equal(out["id"].to_numpy(), df.id.to_numpy())
    assert np.array_equal(out["score"].to_numpy(), model.decision_function(df))  # the numbers, not their text
    # a folder of Parquet files is a table for predict too (the same reader as training's)
    folder = tmp_path / "parts"
    folder.mkdir()
    df.iloc[:100].to_parquet(folder / "a.parquet")
    df.iloc[100:].to_parquet(folder / "b.parquet")
    cli.run(_compose(["task=predict", f"run={european_run}", f"data.path={folder}"]), run_dir=tmp_path / "pred2")
    again = pd.read_csv(tmp_path / "pred2" / "private" / "predictions.csv")
    assert np.array_equal(again["score"].to_numpy(), out["score"].to_numpy())


def test_every_entry_point_refuses_a_missing_path_alike(tables, european_run, tmp_path, capsys):
    """The one location check: training, a release, predict and dptrain check name the same
    problem in the same words (data.path, no such file, what is allowed)."""
    nope = tmp_path / "nope.csv"
    with pytest.raises(DataError) as train:
        load_dataset(_data_cfg(nope, False), seed=0)
    conf = OmegaConf.to_object(_compose([*RELEASE, f"data.path={nope}"]))
    with pytest.raises(DataError) as release:
        load_rows(conf)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.run(_compose(["task=predict", f"run={european_run}", f"data.path={nope}"]), run_dir=tmp_path / "p")
    predict = capsys.readouterr().err.strip().removeprefix("dptrain: error: ")
    assert table_check.main([*DECLARED, f"data.path={nope}", f"hydra.run.dir={tmp_path / 'c'}"]) == 2
    check = capsys.readouterr().err.strip().removeprefix("dptrain: error: ")
    expected = str(locate_error(nope))
    assert str(train.value) == str(release.value) == predict == check == expected
    assert "no such file" in expected and "a folder of Parquet files" in expected


def locate_error(path: Path) -> DataError:
    try:
        locate(path)
    except DataError as err:
        return err
    raise AssertionError("located a path that does not exist")


def test_the_reader_checks_the_header_before_any_row(tables, tmp_path, monkeypatch):
    """required columns are looked for in the header (CSV, Parquet file, folder of Parquet files:
    naming the folder's file that lacks one), and no row is read before."""
    plain, _, df = tables
    folder = tmp_path / "set"
    folder.mkdir()
    df.to_parquet(folder / "a.parquet")
    df.drop(columns=["rank"]).to_parquet(folder / "b.parquet")
    df.to_parquet(tmp_path / "t.parquet")
    import dptrain.data.parquet as parquet
    import dptrain.data.reading as reading

    monkeypatch.setattr(reading.pd, "read_csv", lambda *a, **k: pytest.fail("a row was read"))
    monkeypatch.setattr(parquet, "read_rows", lambda *a, **k: pytest.fail("a row was read"))
    required = [("release.x", "rank"), ("release.y", "salary")]
    for path in (plain, tmp_path / "t.parquet"):
        with pytest.raises(DataError, match=r"release.y: column 'salary' is not in data.path="):
            read_table(path, required=required)
    with pytest.raises(DataError, match=r"release.x: column 'rank' is not in .*the folder's file 'b.parquet'"):
        read_table(folder, required=[("release.x", "rank")])
