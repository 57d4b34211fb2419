"""No private value leaks into error messages, logs, the console or TensorBoard.

Distinctive sentinels are planted in the private rows (a numeric cell 987654.321, a category
"SECRET_CANARY_XYZ", bad values in bad rows) and searched for, as text and as raw bytes, in:
the exceptions (with their full formatted traceback) from loading bad data, the log records and
the console output of small CLI runs (task=train and task=release, good and bad data), every
file of the run folders, and the TensorBoard event files (scalars, text, hparams; raw bytes).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.data import DataError, load_dataset
from dptrain.tasks import cli

NUM = 987654.321
CAT = "SECRET_CANARY_XYZ"
LABEL = "CANARY_LABEL_QQQ"  # a second category, used in the cells of a release's unused column
NEEDLES = (CAT, LABEL, "987654.321", "987654", "9.87654")


@pytest.fixture(autouse=True)
def no_hang():
    def _timeout(*_):
        raise TimeoutError("no-leak test ran for more than 120 s")

    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _pattern(needle: str) -> re.Pattern:
    """A sentinel as it would appear if leaked: a numeric one not inside a longer run of digits (a
    noisy released float's digits, e.g. 0.3987654..., are not the planted value; CI once matched
    one by chance), the integer one not followed by a digit either; a text one anywhere."""
    if not re.fullmatch(r"[0-9.]+", needle):
        return re.compile(re.escape(needle))
    tail = r"(?![0-9])" if needle.isdigit() else ""
    return re.compile(r"(?<![0-9.])" + re.escape(needle) + tail)


def assert_clean(text: str | bytes, where: str) -> None:
    if isinstance(text, bytes):
        for s in NEEDLES:
            pattern = _pattern(s)
            assert not re.search(pattern.pattern.encode("utf-8"), text), f"private value {s!r} found in {where}"
            assert s.encode("utf-16-le") not in text, f"private value {s!r} found in {where} (utf-16)"
        return
    for s in NEEDLES:
        m = _pattern(s).search(text)
        assert m is None, f"private value {s!r} found in {where}: ...{text[max(0, m.start() - 200):m.start() + 200]}..."


def assert_run_folder_clean(run_dir: Path) -> None:
    """Every file a run wrote except the model checkpoint (weights, not text) holds no sentinel."""
    files = [p for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".pt"]
    assert files
    for p in files:
        assert_clean(p.read_bytes(), str(p.relative_to(run_dir)))


def table(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """A learnable table with the sentinels planted in valid positions: an out-of-bounds numeric
    value (clipped), an unknown category (the other slot)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, n).round(3)
    df = pd.DataFrame({
        "a": a,
        "b": rng.uniform(0, 50, n).round(2),
        "c": rng.choice(["u", "v"], n),
        "y": (a + 0.3 * rng.standard_normal(n) > 0.5).astype(int),
    })
    df.loc[5, "a"] = NUM
    df.loc[7, "b"] = -NUM
    df.loc[[11, 12], "c"] = CAT
    df.loc[13, "c"] = LABEL
    return df


def data_cfg(path: Path, **over) -> dict:
    c = {"name": "table", "path": str(path), "target": "y", "positive": None,
         "numeric": {"a": {"lower": 0, "upper": 1}, "b": {"lower": 0, "upper": 50, "transform": "log1p"}},
         "categorical": {"c": ["u", "v"]}, "nonfinite": "error", "split_column": None, "test_fraction": 0.25}
    c.update(over)
    return c


# ---------------------------------------------------------------------------------------------
# Exceptions from bad data: message and full traceback
# ---------------------------------------------------------------------------------------------


def _bad_files(tmp: Path) -> list[tuple[str, Path, dict]]:
    out: list[tuple[str, Path, dict]] = []
    good = table(40)

    df = good.copy()
    df["a"] = df["a"].astype(object)
    df.loc[[2, 3], "a"] = CAT
    for suffix in (".csv", ".parquet", ".dta"):
        p = tmp / f"nonnum{suffix}"
        d = df.astype({"a": str}) if suffix != ".csv" else df
        (d.to_csv(p, index=False) if suffix == ".csv"
         else (d.to_parquet(p) if suffix == ".parquet" else d.to_stata(p, write_index=False)))
        out.append((f"non-numeric ({suffix})", p, {}))

    df = good.copy()
    df["y"] = df["y"].astype(float)
    df.loc[4, "y"] = NUM
    p = tmp / "target.csv"
    df.to_csv(p, index=False)
    out.append(("target not 0/1", p, {}))

    df = good.copy()
    df["part"] = ["train"] * 30 + ["test"] * 10
    df.loc[3, "part"] = CAT
    p = tmp / "split.csv"
    df.to_csv(p, index=False)
    out.append(("bad split value", p, {"split_column": "part"}))

    p = tmp / "ragged.csv"
    p.write_text(good.to_csv(index=False) + f"0.5,{NUM},u,1,{CAT}\n")
    out.append(("ragged row", p, {}))

    p = tmp / "latin1.csv"
    p.write_bytes(good.to_csv(index=False).encode() + f"0.5,{NUM},{CAT}\xe9,1\n".encode("latin-1"))
    out.append(("non-UTF-8", p, {}))
    p = tmp / "latin1.csv.gz"
    p.write_bytes(gzip.compress(f"a,b,c,{CAT}\xe9\n0.5,1,u,1\n".encode("latin-1")))
    out.append(("non-UTF-8 header (gz)", p, {}))

    p = tmp / "quote.csv"
    p.write_text(good.to_csv(index=False) + f'0.5,1,"{CAT},1\n0.1,{NUM},u,0\n')
    out.append(("unclosed quote", p, {}))

    p = tmp / "headerless.csv"
    p.write_text(good.to_csv(index=False, header=False).replace("u,", f"{CAT},", 1))
    out.append(("headerless (row values as column names)", p, {}))

    p = tmp / "dupheader.csv"
    p.write_text(f"a,b,c,y,{CAT},{CAT}\n" + "\n".join(f"0.1,2,u,{i % 2},{NUM},x" for i in range(10)) + "\n")
    out.append(("duplicate header names", p, {}))

    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp / "nested.parquet"
    pq.write_table(pa.table({"a": [0.1] * 8, "b": [1.0] * 8, "c": pa.array([[CAT, str(NUM)]] * 8), "y": [0, 1] * 4}), p)
    out.append(("nested category", p, {}))

    for suffix in (".parquet", ".dta"):
        p = tmp / f"garbage{suffix}"
        p.write_bytes(f"{CAT},{NUM}\n".encode() * 20)
        out.append((f"unreadable {suffix}", p, {}))

    df = good.copy()
    df["y"] = 1
    df.loc[0, "c"] = CAT
    p = tmp / "oneclass.csv"
    df.to_csv(p, index=False)
    out.append(("one class", p, {}))

    df = good.copy()
    df["y"] = np.where(df.y == 1, CAT, LABEL)
    p = tmp / "nopositive.csv"
    df.to_csv(p, index=False)
    out.append(("positive label absent", p, {"positive": "yes", "negative": "no"}))
    out.append(("text target with positive=null", p, {}))

    df = good.copy()
    df.loc[2, "a"] = np.nan
    df.loc[3, "b"] = np.inf
    p = tmp / "nonfinite.parquet"
    df.to_parquet(p)
    out.append(("non-finite", p, {}))
    return out


#: bad rows a declared rule handles (issue 44): the table loads, its rows left out and counted
RUNS = {"target not 0/1", "bad split value", "one class"}


def test_bad_data_errors_quote_no_private_value(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    cases = _bad_files(tmp_path)
    for what, path, over in cases:
        if what in RUNS:
            assert load_dataset(data_cfg(path, **over), seed=0).n_train > 0, what
            continue
        with pytest.raises(DataError) as ei:
            load_dataset(data_cfg(path, **over), seed=0)
        msg = str(ei.value)
        assert "data." in msg and "allowed" in msg, (what, msg)
        assert_clean(msg, f"the message for {what}")
        assert_clean("".join(traceback.format_exception(ei.value)), f"the traceback for {what}")
    assert_clean(caplog.text, "the log records of the loader")


def test_dropped_rows_counted_in_one_private_line_only(tmp_path, caplog):
    """How many rows were dropped is a private count (issue 12, item 6): since issue 44 it is in
    private/data_diagnostics.json and in ONE console line marked PRIVATE for the data holder;
    no other record quotes it."""
    df = table(60)
    df.loc[[1, 2], "a"] = np.nan
    df.loc[3, "b"] = -np.inf
    p = tmp_path / "t.parquet"
    df.to_parquet(p)
    with caplog.at_level(logging.DEBUG):
        ds = load_dataset(data_cfg(p, nonfinite="drop"), seed=0)
    assert ds.n_train + ds.n_test == 57
    private = [r.getMessage() for r in caplog.records if "PRIVATE counts" in r.getMessage()]
    assert len(private) == 1 and "60 rows read, 57 used, 3 left out" in private[0]
    assert "a 2 missing" in private[0] and "b 1 infinite" in private[0]
    logged = " ".join(r.getMessage() for r in caplog.records if "PRIVATE counts" not in r.getMessage())
    assert not re.search(r"\b(1|2|3|57|60)\b", logged), logged
    assert_clean(caplog.text, "the drop warning")


# ---------------------------------------------------------------------------------------------
# Full runs: logs, console, run folder, TensorBoard
# ---------------------------------------------------------------------------------------------


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _train_overrides(path: Path) -> list[str]:
    return ["experiment=logit", "data=table", f"data.path={path}", "data.target=y",
            "++data.numeric={a: {lower: 0, upper: 1}, b: {lower: 0, upper: 50, transform: log1p}}",
            "++data.categorical={c: [u, v]}", "data.nonfinite=drop",
            "trainer.batch_size=40", "trainer.epochs=2", "trainer.eval_every=5", "trainer.log_every=2",
            "trainer.progress=true", "trainer.baseline=true", "privacy.noise_multiplier=1.0"]


def _tensorboard_content(tb: Path) -> tuple[str, list[float]]:
    """All text the event files hold (tags, text summaries, hparams) and every scalar value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    texts = [json.dumps(tags)]
    values: list[float] = []
    for tag in tags["scalars"]:
        values += [e.value for e in acc.Scalars(tag)]
    for tag in tags["tensors"]:
        for e in acc.Tensors(tag):
            texts += [v.decode("utf-8", "replace") for v in e.tensor_proto.string_val]
            values += list(e.tensor_proto.float_val) + list(e.tensor_proto.double_val)
    for content in acc.PluginTagToContent("hparams").values():
        texts.append(str(plugin_data_pb2.HParamsPluginData.FromString(content)))
    return "\n".join(texts), values


def test_train_run_logs_console_and_tensorboard_hold_no_private_value(tmp_path, caplog, capfd):
    df = table(400)
    df.loc[[20, 21], "a"] = np.nan  # a bad row, dropped (data.nonfinite=drop)
    p = tmp_path / "people.csv"
    df.to_csv(p, index=False)
    run = tmp_path / "run"
    caplog.set_level(logging.DEBUG)
    acc = cli.run(_compose(_train_overrides(p)), run_dir=run)
    assert 0 <= acc <= 1
    out, err = capfd.readouterr()
    # the run did see the planted rows and counted them in the one PRIVATE line for the data holder (console
    # and private/dptrain.log), never in a publishable file
    assert "400 rows read, 398 used, 2 left out" in caplog.text
    public = [f for f in run.rglob("*") if f.is_file() and "private" not in f.parts and f.suffix != ".pt"]
    assert public and not any(b"398 used" in f.read_bytes() or b"left_out" in f.read_bytes() for f in public)
    diagnostics = json.loads((run / "private" / "data_diagnostics.json").read_text())
    assert diagnostics["rows"]["left_out_by"]["numeric"]["a"]["missing"] == 2
    for text, where in ((caplog.text, "the log records"), (out, "stdout"), (err, "stderr (progress bar)")):
        assert_clean(text, where)
    privacy = json.loads((run / "privacy.json").read_text())
    # the 398 kept rows minus the test rows of the per-row hash split: the sentinel rows were used
    assert privacy["dataset_size"] == load_dataset(data_cfg(p, nonfinite="drop"), seed=0).n_train
    assert 250 < privacy["dataset_size"] < 350
    assert_run_folder_clean(run)
    text, values = _tensorboard_content(run / "private" / "tb")
    assert "privacy/report" in text and "test/acc" in text  # the reader did find the content
    assert_clean(text, "TensorBoard text / tags / hparams")
    assert not any(abs(abs(v) - NUM) < 1.0 for v in values), "a sentinel value was logged as a TensorBoard scalar"


def test_refused_run_logs_no_private_value(tmp_path, caplog, capfd):
    df = table(100)
    df["a"] = df["a"].astype(object)
    df.loc[[3, 4, 5], "a"] = CAT
    p = tmp_path / "bad.csv"
    df.to_csv(p, index=False)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(SystemExit) as exc:  # data.nonfinite=error: the user's choice of a refusal
        cli.run(_compose([*_train_overrides(p), "data.nonfinite=error"]), run_dir=tmp_path / "run")
    assert exc.value.code == 2
    out, err = capfd.readouterr()
    assert "column 'a' has non-numeric entries" in err and "3 non-numeric" not in err  # data.nonfinite=error
    for text, where in ((caplog.text, "the log records"), (out, "stdout"), (err, "stderr")):
        assert_clean(text, where)
    for name in ("privacy.json", "privacy.txt", "metrics.json"):
        assert not (tmp_path / "run" / name).exists()


def test_release_run_logs_and_outputs_hold_no_private_value(tmp_path, caplog, capfd):
    """task=release on a user table: the planted values are in x (outside the public domain:
    clipped) and in a column the release does not use; cell labels are public by design. Even the
    private evaluation (exact values, figures) holds no planted value."""
    rng = np.random.default_rng(1)
    n = 300
    df = pd.DataFrame({"cell": rng.choice([f"c{i}" for i in range(6)], n), "x": rng.uniform(0, 1, n),
                       "note": rng.choice([CAT, LABEL], n)})
    df["y"] = np.clip(0.2 + 0.5 * df.x + 0.1 * rng.standard_normal(n), 0, 1)
    df.loc[3, "x"] = NUM
    df.loc[4, "y"] = -NUM
    p = tmp_path / "micro.csv"
    df.to_csv(p, index=False)
    caplog.set_level(logging.DEBUG)
    cells = "release.cell_values={cell: [c0, c1, c2, c3, c4, c5, c6]}"  # c6: declared, no rows
    cli.run(_compose(["task=release", "data=table", f"data.path={p}", "release.x=x", "release.y=y",
                      "release.cells=[cell]", "release.statistic=slope", cells,
                      "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}",
                      "release.private_evaluation=true", "release.tail_epsilons=[1]"]), run_dir=tmp_path / "run")
    out, err = capfd.readouterr()
    assert (tmp_path / "run" / "release.csv").exists()
    for text, where in ((caplog.text, "the log records"), (out, "stdout"), (err, "stderr")):
        assert_clean(text, where)
    assert_run_folder_clean(tmp_path / "run")


@pytest.mark.slow  # a whole run in a subprocess (10 s); the in-process run's logs are checked in the fast suite
def test_subprocess_run_log_file_holds_no_private_value(tmp_path):
    """The real entry point: Hydra's job log (dptrain.log), .hydra/, tb/ and the console."""
    df = table(300)
    p = tmp_path / "people.csv"
    df.to_csv(p, index=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    res = subprocess.run([sys.executable, "-m", "dptrain", *_train_overrides(p), "trainer.epochs=1",
                          "trainer.baseline=false", f"hydra.run.dir={tmp_path}/run"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    logs = list((tmp_path / "run" / "private").glob("*.log"))
    assert logs and "test accuracy" in logs[0].read_text()
    assert_clean(res.stdout, "stdout")
    assert_clean(res.stderr, "stderr")
    assert_run_folder_clean(tmp_path / "run")
