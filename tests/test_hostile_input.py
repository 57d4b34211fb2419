"""Hostile input: absurd settings and malformed tables are refused BY NAME.

Every refusal must be a ConfigError / DataError (exit code 2 from the CLI) whose message names
the setting or column, the offending value (settings) or what was found in words (data: never a
value read from the file, never a count of bad rows or a line number: those change with one
row) and what is allowed; never a raw pandas / numpy / torch exception, never a hang, and
nothing written that claims a guarantee.

Most properties call ``validate`` / ``load_dataset`` / ``read_table`` directly on small files;
a handful of in-process CLI runs check the exit code and the run folder.
"""

from __future__ import annotations

import copy
import gzip
import math
import os
import re
import signal
import string
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from dptrain.core.validation import ConfigError
from dptrain.data import DataError, load_dataset, read_table
from dptrain.privacy.accounting import SIGMA_RANGE
from dptrain.settings.data import DataConfig, NumericColumn
from dptrain.settings.train import GRAD_NORM_RANGE, MAX_STEPS, MAX_TARGET_EPSILON, Config, validate_against_size
from dptrain.tasks import cli
from dptrain.tasks.registry import validate

SENTINELS = ("SECRET_CANARY_XYZ", "987654.321", "987654")
FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
GUARANTEE_FILES = ("privacy.json", "privacy.txt", "metrics.json")
#: examples per fuzz property; DPTRAIN_FUZZ_EXAMPLES=2000 for a longer hunt (then also DPTRAIN_FUZZ_TIMEOUT)
FUZZ = int(os.environ.get("DPTRAIN_FUZZ_EXAMPLES", "80"))


@pytest.fixture(autouse=True)
def no_hang():
    """Every test here must finish in 60 s: a hang is a failure, not a stuck CI job."""
    def _timeout(*_):
        raise TimeoutError("hostile-input test ran for more than 60 s (a hang?)")

    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(int(os.environ.get("DPTRAIN_FUZZ_TIMEOUT", "60")))
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def refused(exc_type, fn, *needles):
    """fn() must raise exactly ``exc_type`` (a ConfigError / DataError, no other exception),
    whose message contains every needle, says what is allowed and quotes no private value."""
    try:
        fn()
    except (ConfigError, DataError) as exc:
        assert type(exc) is exc_type, f"{type(exc).__name__} instead of {exc_type.__name__}: {exc}"
        msg = str(exc)
    else:
        raise AssertionError(f"not refused (expected {exc_type.__name__} with {needles})")
    for s in needles:
        assert s in msg, f"{s!r} not in {msg!r}"
    assert "allowed" in msg or "must" in msg, f"the message does not say what is allowed: {msg!r}"
    for s in SENTINELS:
        assert s not in msg, f"private value {s!r} leaked into {msg!r}"
    return msg


# ==============================================================================================
# Settings: validate() on a Config whose fields may hold anything
# ==============================================================================================


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture(scope="module")
def base_conf() -> Config:
    conf = OmegaConf.to_object(_compose(["experiment=logit", "data=synthetic"]))
    validate(conf)  # the positive control: the preset itself is fine
    return conf


def _with(conf: Config, setting: str, value) -> Config:
    new = copy.deepcopy(conf)
    *path, last = setting.split(".")
    obj = new
    for part in path:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    if isinstance(obj, dict):
        obj[last] = value
    else:
        setattr(obj, last, value)
    return new


NAN, INF = float("nan"), float("inf")
JUNK = st.sampled_from(["abc", "", "1e3x", [1.0], {"v": 1}, (), b"1", object()])
NONFINITE = st.sampled_from([NAN, INF, -INF])
HUGE = st.sampled_from([1e300, 1.7976931348623157e308, 10**400])
NEGATIVE = st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False)
BOOLS = st.booleans()


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v) -> bool:
    try:
        return _real(v) and math.isfinite(v)
    except OverflowError:  # 10**400
        return False


# setting -> (strategy of values to try, predicate "this value is allowed", needle of the rule)
SIG_LO, SIG_HI = SIGMA_RANGE
C_LO, C_HI = GRAD_NORM_RANGE
BAD_SETTINGS = {
    "privacy.noise_multiplier": (
        st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.floats(1e-300, SIG_LO * 0.999),
                  st.floats(SIG_HI * 1.001, 1e300)),
        lambda v: _finite(v) and (v == 0 or SIG_LO <= v <= SIG_HI), f"[{SIG_LO:g}, {SIG_HI:g}]"),
    "privacy.max_grad_norm": (
        st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.just(0), st.just(None), st.floats(C_HI * 1.001, 1e300)),
        lambda v: _finite(v) and C_LO <= v <= C_HI, f"[{C_LO:g}, {C_HI:g}]"),
    "privacy.delta": (
        st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.just(0.0), st.just(1.0), st.floats(1.0, 1e300)),
        lambda v: v is None or (_finite(v) and 0 < v < 1), "(0, 1/N)"),
    "privacy.calibration_rtol": (
        st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.just(0.0), st.just(None)),
        lambda v: _finite(v) and 0 < v < 0.1, "(0, 0.1)"),
    "privacy.enabled": (st.one_of(JUNK, st.just(None), st.just(1), st.just("true")),
                        lambda v: isinstance(v, bool), "true or false"),
    "trainer.epochs": (
        st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.just(0), st.just(None)),
        lambda v: _finite(v) and v > 0, "> 0"),
    "trainer.batch_size": (
        st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.just(0), st.just(2.5), st.integers(max_value=0),
                  st.just(None)),
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "integer > 0"),
    "trainer.eval_every": (st.one_of(JUNK, NONFINITE, BOOLS, st.integers(max_value=0), st.just(1.5)),
                           lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "integer > 0"),
    "trainer.log_every": (st.one_of(JUNK, NONFINITE, BOOLS, st.integers(max_value=0), st.just(1.5)),
                          lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "integer > 0"),
    "trainer.curve_budget_share": (
        st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.just(0.0), st.just(None), st.floats(0.5001, 1e300)),
        lambda v: _finite(v) and 0 < v <= 0.5, "(0, 0.5]"),
    "trainer.curve_loss_bound": (st.one_of(JUNK, NONFINITE, NEGATIVE, BOOLS, st.just(0.0)),
                                 lambda v: v is None or (_finite(v) and v > 0), "> 0"),
    "trainer.dp_curves": (st.one_of(JUNK, st.just(None), st.just(1), st.just("true")),
                          lambda v: isinstance(v, bool), "true or false"),
    "trainer.threads": (st.one_of(JUNK, NONFINITE, BOOLS, st.integers(max_value=-1), st.just(1.5)),
                        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, ">= 0"),
    "seed": (st.one_of(JUNK, NONFINITE, BOOLS, st.integers(max_value=-1), st.just(1.5), st.just(None)),
             lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "integer >= 0"),
    "data.test_fraction": (st.one_of(JUNK, NONFINITE, HUGE, NEGATIVE, BOOLS, st.just(0.0), st.just(1.0)),
                           lambda v: _finite(v) and 0 < v < 1, "(0, 1)"),
    "optim.lr": (st.one_of(JUNK, NONFINITE, NEGATIVE, BOOLS, st.just(0.0), st.just(None)),
                 lambda v: _finite(v) and v > 0, "> 0"),
}


@FAST
@given(data=st.data(), setting=st.sampled_from(sorted(BAD_SETTINGS)))
def test_absurd_setting_refused_by_name(base_conf, data, setting):
    strategy, allowed, rule = BAD_SETTINGS[setting]
    value = data.draw(strategy, label=setting)
    assume(not allowed(value))
    msg = refused(ConfigError, lambda: validate(_with(base_conf, setting, value)), f"{setting}=", rule)
    assert f"{setting}={value!r}" in msg  # the offending value, as given


def test_absurd_target_epsilon_refused_by_name(base_conf):
    conf = _with(base_conf, "privacy.noise_multiplier", None)
    for v in (0, -1.0, NAN, INF, 1e300, MAX_TARGET_EPSILON * 1.01, "1", True, [1.0]):
        refused(ConfigError, lambda v=v: validate(_with(conf, "privacy.target_epsilon", v)),
                f"privacy.target_epsilon={v!r}", f"(0, {MAX_TARGET_EPSILON:g}]")
    validate(_with(conf, "privacy.target_epsilon", 0.05))  # the sweep's smallest target is fine


@FAST
@given(sigma=st.one_of(st.just(0.0), st.floats(SIG_LO, SIG_HI)), c=st.floats(C_LO, C_HI),
       lr=st.floats(1e-8, 1e3), epochs=st.floats(1e-3, 1e3), batch=st.integers(1, 10**6),
       delta=st.one_of(st.none(), st.floats(1e-300, 0.999)))
def test_values_in_range_are_accepted(base_conf, sigma, c, lr, epochs, batch, delta):
    conf = _with(base_conf, "privacy.noise_multiplier", sigma)
    for setting, v in (("privacy.max_grad_norm", c), ("optim.lr", lr), ("trainer.epochs", epochs),
                       ("trainer.batch_size", batch), ("privacy.delta", delta)):
        conf = _with(conf, setting, v)
    validate(conf)


@FAST
@given(n=st.integers(10, 10**6), batch=st.integers(1, 10**4),
       epochs=st.one_of(st.floats(1e3, 1e300), st.just(1e308)))
def test_too_many_steps_refused_before_training(base_conf, n, batch, epochs):
    """epochs * N / B steps beyond MAX_STEPS (or an overflow) would run for hours or forever."""
    assume(batch <= n and epochs * n / batch > MAX_STEPS)
    conf = _with(_with(base_conf, "trainer.epochs", epochs), "trainer.batch_size", batch)
    validate(conf)  # needs N: refused by the size check, which runs once N is known
    refused(ConfigError, lambda: validate_against_size(conf, n), f"trainer.epochs={epochs!r}",
            f"at most {MAX_STEPS:,} steps")


def test_model_and_optimiser_arguments_refused_by_name(base_conf):
    mlp = OmegaConf.to_object(_compose(["experiment=mlp", "data=synthetic"]))
    for hidden in ([-3], [0, 4], [True], ["64"], "64", [2.5]):
        refused(ConfigError, lambda h=hidden: validate(_with(mlp, "model.hidden", h)), "model.hidden", "> 0")
    refused(ConfigError, lambda: validate(_with(mlp, "model.activation", "sigmoidal")), "model.activation='sigmoidal'",
            "relu, tanh")
    for model in (None, "logit", {"hidden": [3]}):
        refused(ConfigError, lambda m=model: validate(_with(base_conf, "model", m)), "model=", "model=logit")
    refused(ConfigError, lambda: validate(_with(base_conf, "optim.momentum", -1.0)), "optim=", "momentum")
    refused(ConfigError, lambda: validate(_with(base_conf, "optim._partial_", False)), "optim._partial_")
    for optim in (None, "sgd", {"lr": 1.0}):
        refused(ConfigError, lambda o=optim: validate(_with(base_conf, "optim", o)), "optim=", "optim=sgd")


def test_schema_values_of_wrong_type_refused_by_name(base_conf):
    table = _with(base_conf, "data", DataConfig(name="table", path="x.csv", target="y",
                                                numeric={"x0": NumericColumn(-1, 1)}))
    cases = [
        ("data.numeric", {"age": {"lower": "a", "upper": 3}}, "data.numeric.age.lower"),
        ("data.numeric", {"age": {"lower": 0, "upper": NAN}}, "data.numeric.age.upper"),
        ("data.numeric", {"age": 5}, "data.numeric.age"),
        ("data.categorical", {"c": "abc"}, "data.categorical.c"),
        ("data.categorical", {"c": [["a"], "b"]}, "data.categorical.c"),
        ("data.categorical", ["a", "b"], "data.categorical"),
        ("data.target", 3, "data.target"),
        ("data.path", 3.5, "data.path"),
    ]
    for setting, value, needle in cases:
        refused(ConfigError, lambda s=setting, v=value: validate(_with(table, s, v)), needle)


@pytest.mark.parametrize("extra,needle", [
    (["privacy.noise_multiplier=1e300"], "privacy.noise_multiplier=1e+300"),
    (["privacy.noise_multiplier=1e-300"], "privacy.noise_multiplier=1e-300"),
    (["privacy.max_grad_norm=inf"], "privacy.max_grad_norm=inf"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=1e6"], "privacy.target_epsilon=1000000.0"),
    (["trainer.epochs=1e300"], "trainer.epochs=1e+300"),
    (["optim.lr=-1"], "optim.lr=-1"),
    (["optim.lr=nan"], "optim.lr=nan"),
    (["optim.lr=abc"], "optim.lr='abc'"),
    (["+optim.momentum=-0.5"], "momentum"),  # SGD's own option: conf/optim/sgd.yaml has no momentum key
])
def test_cli_refuses_absurd_settings_and_writes_no_guarantee(extra, needle, tmp_path, capsys):
    """These crashed deep in torch / dp-accounting (overflow, ZeroDivisionError, 'Input contains
    NaN'), or ran for hours, before they were refused by name."""
    cfg = _compose(["experiment=logit", "data=synthetic", "data.n_rows=400", "trainer.progress=false",
                    "trainer.batch_size=50", "trainer.baseline=false", *extra])
    with pytest.raises(SystemExit) as exc:
        cli.run(cfg, run_dir=tmp_path)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "is not allowed" in err and "Traceback" not in err
    for name in GUARANTEE_FILES:
        assert not (tmp_path / name).exists(), name


# ==============================================================================================
# Tables: malformed CSV / Parquet files
# ==============================================================================================

N_MIN, N_MAX = 6, 25


def frame(n: int, seed: int = 0) -> pd.DataFrame:
    """A valid small table: both classes in every split, categories incl. unknown ones."""
    rng = np.random.default_rng(seed)
    y = np.array([0, 1] * n)[:n]
    rng.shuffle(y)
    return pd.DataFrame({
        "a": rng.uniform(0, 1, n).round(4),
        "c": rng.choice(["u", "v", "w"], n),
        "y": y,
    })


def with_part(df: pd.DataFrame) -> pd.DataFrame:
    """The table with a declared split column (row 0 test, the rest train), for properties that
    need a table to load: the per-row hash split of a table of 6-25 rows may leave a side empty
    (each row is a test row with probability test_fraction, whatever the other rows)."""
    return df.assign(part=["test"] + ["train"] * (len(df) - 1))


def cfg(path, **over) -> dict:
    c = {"name": "table", "path": str(path), "format": "auto", "target": "y", "positive": None,
         "numeric": {"a": {"lower": 0, "upper": 1}}, "categorical": {"c": ["u", "v"]},
         "nonfinite": "error", "split_column": None, "test_fraction": 0.25}
    c.update(over)
    return c


def write(df: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".parquet":
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)
    return path


def load(path, **over):
    return load_dataset(cfg(path, **over), seed=0)


def _bad_rows(draw_data, n: int, label: str) -> list[int]:
    return sorted(draw_data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n), label=label))


@FAST
@given(data=st.data(), n=st.integers(N_MIN, N_MAX), suffix=st.sampled_from([".csv", ".parquet"]))
def test_non_numeric_entries_neither_counted_nor_quoted(tmp_path_factory, data, n, suffix):
    rows = _bad_rows(data, n, "rows")
    junk = st.sampled_from(["SECRET_CANARY_XYZ", "987654.321abc", "1,5", "--3", "x987654", "true-ish", "N/A?"])
    df = frame(n)
    df["a"] = df["a"].astype(object)
    for r in rows:
        df.loc[r, "a"] = data.draw(junk, label="junk")
    if suffix == ".parquet":
        df["a"] = df["a"].astype(str)  # a text column, as a Parquet file would hold it
    p = write(df, tmp_path_factory.mktemp("nn") / f"t{suffix}")
    msg = refused(DataError, lambda: load(p), "data.numeric.a", "column 'a' has non-numeric entries",
                  "allowed with data.nonfinite=error")
    assert "entries of" not in msg and f"{n} rows" not in msg
    try:  # the declared rule: the rows are left out and counted
        ds = load(p, nonfinite="drop")
    except DataError as exc:
        assert "no training rows" in str(exc)
        return
    assert ds.diagnostics["rows"]["left_out_by"]["numeric"]["a"]["not_a_number"] == len(rows)


@FAST
@given(data=st.data(), n=st.integers(N_MIN, N_MAX))
def test_nonfinite_entries_named_and_drop_policy(tmp_path_factory, data, n, caplog):
    rows = _bad_rows(data, n, "rows")
    assume(len(rows) < n - 2)
    tokens = {"": "nan", "nan": "nan", "NaN": "nan", "inf": "inf", "-inf": "inf", "1e400": "inf", "-1e999": "inf"}
    chosen = [data.draw(st.sampled_from(sorted(tokens)), label="token") for _ in rows]
    df = frame(n)
    df["a"] = df["a"].astype(object)
    for r, tok in zip(rows, chosen):
        df.loc[r, "a"] = tok
    p = write(df, tmp_path_factory.mktemp("nf") / "t.csv")
    n_nan = sum(tokens[t] == "nan" for t in chosen)
    kinds = {0: "infinite", len(rows): "missing/NaN"}.get(n_nan, "missing/NaN and infinite")
    refused(DataError, lambda: load(p), "data.numeric.a", f"column 'a' has non-finite entries ({kinds})",
            "data.nonfinite=drop")
    caplog.clear()
    try:
        ds = load(p, nonfinite="drop")
    except DataError as exc:  # the hash split of a small table may leave no training row
        assert "no training rows" in str(exc)
        return
    assert ds.n_train + ds.n_test == n - len(rows)
    counted = ds.diagnostics["rows"]["left_out_by"]["numeric"]["a"]
    assert counted == {"missing": n_nan, "infinite": len(rows) - n_nan}
    private = [r.getMessage() for r in caplog.records if "PRIVATE counts" in r.getMessage()]
    assert len(private) == 1 and f"{n} rows read, {n - len(rows)} used, {len(rows)} left out" in private[0]
    logged = " ".join(r.getMessage() for r in caplog.records if "PRIVATE counts" not in r.getMessage())
    assert not re.search(rf"\b({len(rows)}|{n}|{n - len(rows)})\b", logged), logged  # no count elsewhere


@FAST
@given(n=st.integers(N_MIN, N_MAX), v=st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 5e-324, -0.0]),
       suffix=st.sampled_from([".csv", ".parquet"]), transform=st.sampled_from(["none", "log1p"]))
def test_huge_finite_values_are_clipped_not_overflowed(tmp_path_factory, n, v, suffix, transform):
    df = with_part(frame(n))
    df.loc[0, "a"] = v
    p = write(df, tmp_path_factory.mktemp("hv") / f"t{suffix}")
    ds = load(p, numeric={"a": {"lower": 0, "upper": 1, "transform": transform}}, split_column="part")
    for x in (ds.x_train, ds.x_test):
        assert bool(x.isfinite().all()) and float(x.min()) >= 0 and float(x.max()) <= 1


@FAST
@given(data=st.data(), n=st.integers(N_MIN, N_MAX), extra=st.booleans())
def test_ragged_rows_refused_without_count(tmp_path_factory, data, n, extra):
    """pandas pads short rows with NaN, drops the extra fields of long ones (usecols) and, when
    every row has one field too many, silently shifts all columns; all are refused."""
    rows = _bad_rows(data, n, "rows")
    lines = frame(n).to_csv(index=False).splitlines()
    for r in rows:
        fields = lines[r + 1].split(",")
        fields = fields + ["SECRET_CANARY_XYZ"] if extra else fields[:-1]
        lines[r + 1] = ",".join(fields)
    p = tmp_path_factory.mktemp("rg") / "t.csv"
    p.write_text("\n".join(lines) + "\n")
    msg = refused(DataError, lambda: load(p), "data.path", "some data rows have a different number of fields",
                  "(3 columns)", "exactly 3 comma-separated fields")
    rest = msg.replace(str(p), "PATH").replace("(3 columns)", "").replace("exactly 3 comma", "")
    assert not re.search(r"\d", rest), rest  # neither where (a line number) nor how many rows (private)
    refused(DataError, lambda: read_table(p), "different number of fields")


def test_blank_and_whitespace_lines_are_not_ragged(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("\n" + frame(12).to_csv(index=False).replace("\n", "\n\n", 3) + "   \n\n")
    ds = load(p)
    assert ds.n_train + ds.n_test == 12


@FAST
@given(n=st.integers(N_MIN, N_MAX), dup=st.sampled_from(["a", "c", "y", " a "]),
       suffix=st.sampled_from([".csv", ".parquet"]))
def test_duplicate_column_names_refused(tmp_path_factory, n, dup, suffix):
    p = tmp_path_factory.mktemp("dup") / f"t{suffix}"
    df = frame(n)
    df.insert(1, "dup", 987654.321)
    if suffix == ".csv":
        text = df.to_csv(index=False)
        head, rest = text.split("\n", 1)
        p.write_text(head.replace("dup", dup) + "\n" + rest)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = pa.Table.from_pandas(df, preserve_index=False)
        pq.write_table(t.rename_columns([dup.strip() if c == "dup" else c for c in t.column_names]), p)
    refused(DataError, lambda: load(p), "data.path", "duplicate column names", "allowed: unique column names")


@FAST
@given(data=st.data(), n=st.integers(N_MIN, N_MAX), gz=st.booleans())
def test_non_utf8_bytes_refused_without_count(tmp_path_factory, data, n, gz):
    rows = _bad_rows(data, n, "rows")
    lines = frame(n).to_csv(index=False).encode().splitlines()
    for r in rows:
        lines[r + 1] = lines[r + 1].replace(b",", b"SECRET_CANARY_XYZ\xe9\xff,", 1)
    blob = b"\n".join(lines) + b"\n"
    p = tmp_path_factory.mktemp("u8") / ("t.csv.gz" if gz else "t.csv")
    p.write_bytes(gzip.compress(blob) if gz else blob)
    msg = refused(DataError, lambda: load(p), "data.path", "bytes that are not valid UTF-8", "allowed: UTF-8 text")
    assert not re.search(r"lines?\b", msg) and f" {len(rows)} " not in msg


@FAST
@given(n=st.integers(N_MIN, N_MAX), which=st.sampled_from(["target", "numeric", "categorical", "split_column"]),
       suffix=st.sampled_from([".csv", ".parquet"]))
def test_missing_declared_column_named(tmp_path_factory, n, which, suffix):
    p = write(frame(n), tmp_path_factory.mktemp("mc") / f"t{suffix}")
    over = {"target": {"target": "income"},
            "numeric": {"numeric": {"a": {"lower": 0, "upper": 1}, "zz": {"lower": 0, "upper": 1}}},
            "categorical": {"categorical": {"c": ["u"], "zz": ["q"]}},
            "split_column": {"split_column": "zz"}}[which]
    setting = {"target": "data.target", "numeric": "data.numeric.zz", "categorical": "data.categorical.zz",
               "split_column": "data.split_column"}[which]
    col = "income" if which == "target" else "zz"
    msg = refused(DataError, lambda: load(p, **over), setting, f"column {col!r} is not in")
    assert f"{n} rows" not in msg


@FAST
@given(n=st.integers(N_MIN, N_MAX), suffix=st.sampled_from([".csv", ".parquet"]), data=st.data())
def test_unknown_categories_go_to_the_other_slot(tmp_path_factory, n, suffix, data):
    df = with_part(frame(n))
    rows = _bad_rows(data, n, "rows")
    df.loc[rows, "c"] = data.draw(st.sampled_from(["SECRET_CANARY_XYZ", "", " ", "U", "None"]), label="cat")
    p = write(df, tmp_path_factory.mktemp("uc") / f"t{suffix}")
    ds = load(p, split_column="part")  # no declared label left runs too (issue 44): every row lumped, counted
    x = np.concatenate([ds.x_train.numpy(), ds.x_test.numpy()])
    assert ds.feature_names == ("a", "c=u", "c=v", "c=<other>")
    assert np.all(x[:, 1:].sum(1) == 1)  # exactly one slot per row
    expected_other = int((~df.c.str.strip().isin(["u", "v"])).sum())
    assert int(x[:, 3].sum()) == expected_other == sum(ds.diagnostics["rows"]["lumped"]["c"].values())


@FAST
@given(n=st.integers(N_MIN, N_MAX), label=st.sampled_from([0, 1]), positive=st.sampled_from([None, "1", "yes"]),
       suffix=st.sampled_from([".csv", ".parquet"]))
def test_one_class_target_loads(tmp_path_factory, n, label, positive, suffix):
    """Issue 44: a one-class target (or a declared positive label no row has) was refused, so the
    run told a table with one positive row from its neighbour without it; it loads now."""
    df = frame(n)
    df["y"] = label if positive != "yes" else np.where(label, "yes", "no")
    df["part"] = ["test"] + ["train"] * (n - 1)
    p = write(df, tmp_path_factory.mktemp("oc") / f"t{suffix}")
    negative = {None: None, "1": "0", "yes": "no"}[positive]
    ds = load(p, positive=positive, negative=negative, split_column="part")
    assert ds.n_train == n - 1 and set(ds.y_train.tolist()) == {float(label)}
    assert ds.diagnostics["rows"]["left_out"] == 0


def test_one_class_in_the_training_split_only_loads(tmp_path):
    df = frame(12)
    df["part"] = ["train"] * 8 + ["test"] * 4
    df.loc[:7, "y"] = 1
    df.loc[8:, "y"] = [0, 1, 0, 1]
    ds = load(write(df, tmp_path / "t.csv"), split_column="part")
    assert ds.n_train == 8 and set(ds.y_train.tolist()) == {1.0}
    df.loc[8:, "y"] = 0  # one class in the TEST part only (AUC is reported as NaN)
    df.loc[0, "y"] = 0
    ds = load(write(df, tmp_path / "u.csv"), split_column="part")
    assert ds.n_test == 4


@FAST
@given(data=st.data(), n=st.integers(N_MIN, N_MAX))
def test_target_with_more_than_two_classes(tmp_path_factory, data, n):
    """positive=null: a target of 0/1, a row with anything else is left out and counted (issue 44:
    it was refused); with data.positive=1 and data.negative=0 the same rows are left out, never
    made negatives."""
    rows = _bad_rows(data, n, "rows")
    df = frame(n)
    df["y"] = df["y"].astype(float)
    for r in rows:
        df.loc[r, "y"] = data.draw(st.sampled_from([2.0, -1.0, 0.5, 987654.321]), label="class")
    p = write(df, tmp_path_factory.mktemp("mc") / "t.csv")
    ok = df.y.isin([0.0, 1.0])
    for over in ({}, {"positive": "1", "negative": "0"}):
        try:
            ds = load(p, **over)
        except DataError as exc:  # the hash split of a small table may leave no training row
            assert "no training rows" in str(exc)
            continue
        assert ds.n_train + ds.n_test == int(ok.sum())
        assert ds.diagnostics["rows"]["left_out"] == len(rows)
        assert sorted(ds.y_train.tolist() + ds.y_test.tolist()) == sorted(df.y[ok].tolist())


@pytest.mark.parametrize("content,needles", [
    (b"", ("empty", "0 bytes")),
    (b"\n\n   \n", ("empty", "0 rows")),
    (b"\xef\xbb\xbf", ("empty", "0 rows")),
    (b"a,c,y\n", ("0 rows",)),
    (b"a,c,y\n\n\n", ("0 rows",)),
])
def test_empty_and_header_only_csv(tmp_path, content, needles):
    p = tmp_path / "t.csv"
    p.write_bytes(content)
    refused(DataError, lambda: load(p), *needles)


def test_empty_and_header_only_parquet(tmp_path):
    p = tmp_path / "e.parquet"
    p.write_bytes(b"")
    refused(DataError, lambda: load(p), "data.path", "empty")
    p = write(frame(8).iloc[:0], tmp_path / "h.parquet")
    refused(DataError, lambda: load(p), "0 rows (header only)")


def test_nested_parquet_values_refused_by_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 8
    base = {"a": [0.1] * n, "c": ["u"] * n, "y": [0, 1] * (n // 2)}
    for col, arr, setting in (
        ("c", pa.array([["SECRET_CANARY_XYZ"]] * n), "data.categorical.c"),
        ("c", pa.array([{"k": "SECRET_CANARY_XYZ"}] * n), "data.categorical.c"),
        ("y", pa.array([[987654.321]] * n), "data.target='y'"),
    ):
        p = tmp_path / f"{col}.parquet"
        pq.write_table(pa.table({**base, col: arr}), p)
        refused(DataError, lambda p=p, col=col: load(p, positive="1" if col == "y" else None,
                                                     negative="0" if col == "y" else None), setting,
                f"column {col!r} has nested entries (lists/structs/maps); allowed: one scalar label")
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({**base, "a": pa.array([[987654.321]] * n)}), p)
    refused(DataError, lambda: load(p), "data.numeric.a", "column 'a' has nested entries")


def test_wrong_typed_numeric_columns(tmp_path):
    df = frame(10)
    df["a"] = pd.date_range("2000-01-01", periods=10)
    p = write(df, tmp_path / "d.parquet")
    refused(DataError, lambda: load(p), "data.numeric.a", "holds dates/times, not numbers")
    df["a"] = [True, False] * 5  # booleans are numbers 0/1
    assert load(write(with_part(df), tmp_path / "b.parquet"), split_column="part").n_features == 4


# ---------------------------------------------------------------------------------------------
# Fuzz: whatever the bytes, the loader returns a Dataset or refuses with a DataError
# ---------------------------------------------------------------------------------------------

CELLS = st.one_of(
    st.sampled_from(["0", "1", "0.5", "u", "v", "", " ", "nan", "inf", "-inf", "1e400", "1e308", "987654.321",
                     "SECRET_CANARY_XYZ", '"q,uoted"', '"', "'", "\\", "#", "\t", "1,2", "\r", "\x00"]),
    st.text(alphabet=string.printable, max_size=5),
)


@settings(max_examples=FUZZ, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.lists(st.sampled_from(["a", "c", "y", "a", " y", "", "z"]), min_size=1, max_size=5),
       rows=st.lists(st.lists(CELLS, min_size=0, max_size=6), max_size=10),
       positive=st.sampled_from([None, "1", "u"]), nonfinite=st.sampled_from(["error", "drop"]),
       eol=st.sampled_from(["\n", "\r\n"]))
def test_fuzzed_csv_loads_or_is_refused_by_name(tmp_path_factory, header, rows, positive, nonfinite, eol):
    text = eol.join([",".join(header)] + [",".join(r) for r in rows]) + eol
    p = tmp_path_factory.mktemp("fz") / "t.csv"
    p.write_text(text, encoding="utf-8")
    try:
        ds = load(p, positive=positive, negative={"1": "0", "u": "v"}.get(positive), nonfinite=nonfinite)
    except DataError as exc:
        msg = str(exc)
        assert ("data." in msg or "the data has" in msg) and ("allowed" in msg or "left" in msg or "needs" in msg), msg
        for s in SENTINELS:
            assert s not in msg
        return
    assert ds.n_train >= 1 and ds.n_test >= 0
    assert bool(ds.x_train.isfinite().all()) and bool(ds.x_test.isfinite().all())


@settings(max_examples=max(FUZZ * 3 // 4, 1), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=400), suffix=st.sampled_from([".csv", ".csv.gz", ".parquet", ".dta"]))
def test_random_bytes_never_crash_the_reader(tmp_path_factory, blob, suffix):
    p = tmp_path_factory.mktemp("rb") / f"t{suffix}"
    p.write_bytes(blob)
    try:
        load(p)
    except DataError as exc:
        assert "data." in str(exc) or "the data has" in str(exc)


# ---------------------------------------------------------------------------------------------
# The CLI on bad tables: exit 2, the message on stderr, no artifact that claims a guarantee
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["ragged", "nested"])
def test_cli_refuses_bad_table_and_writes_no_guarantee(case, tmp_path, capsys):
    df = frame(40)
    p = tmp_path / "t.csv"
    if case == "ragged":
        p.write_text(df.to_csv(index=False) + "0.5,u,1,SECRET_CANARY_XYZ\n")
        needle = "some data rows have a different number of fields"
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = tmp_path / "t.parquet"
        pq.write_table(pa.table({"a": df.a, "c": pa.array([["SECRET_CANARY_XYZ"]] * 40), "y": df.y}), p)
        needle = "column 'c' has nested entries"
    overrides = ["experiment=logit", "data=table", f"data.path={p}", "data.target=y",
                 "++data.numeric={a: {lower: 0, upper: 1}}", "++data.categorical={c: [u, v]}",
                 "trainer.batch_size=5", "trainer.progress=false"]
    with pytest.raises(SystemExit) as exc:
        cli.run(_compose(overrides), run_dir=tmp_path / "run")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and "SECRET_CANARY_XYZ" not in err
    for name in GUARANTEE_FILES:
        assert not (tmp_path / "run" / name).exists(), name
