"""The block-wise data path (issue 36): the split's hash, the encoded matrices and the private
facts are bit for bit those of the plain whole-array computation they replaced (kept here as the
reference), for every kind of column, with dropped rows, over several blocks, on 1 or 3 threads;
the baseline's bounded subsample; evaluations during training on the first test rows."""

from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from dptrain.data import blocks, encoding, schema_from_config, split
from dptrain.data.labels import cell_label, label_codes
from dptrain.inference.subsample import row_uniform
from dptrain.models import baselines, objectives
from dptrain.training.fit import evaluate

ROWS = 40_000  # three encoding blocks of 16,384 rows, one hash block


# ---------------------------------------------------------------- the reference (the code before issue 36)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(h):
    h = h ^ (h >> np.uint64(30))
    h = h * _M1
    h = h ^ (h >> np.uint64(27))
    h = h * _M2
    return h ^ (h >> np.uint64(31))


def _word(salt, data):
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=salt).digest(), "little")


def _reference_words(col, rows, salt):
    if pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype):
        v = col.to_numpy(dtype=np.float64, na_value=np.nan)[rows] + 0.0
        v[np.isnan(v)] = np.nan
        return v.view(np.uint64)
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    labels = [cell_label(u) for u in uniques]
    words = [_word(salt, b"\xff" if s is None else s.encode("utf-8", "surrogatepass")) for s in labels]
    return np.array(words + [_word(salt, b"\xff")], dtype=np.uint64)[codes[rows]]


def reference_scores(df, seed, rows):
    salt = split.split_salt(seed)
    words = [_reference_words(df[c], rows, salt) for c in sorted(df.columns)]

    def keyed(x, name):
        return _mix(_mix(x ^ np.uint64(_word(salt, name + b"/1"))) ^ np.uint64(_word(salt, name + b"/2")))

    h = np.full(len(rows), _word(salt, b"start"), dtype=np.uint64)
    for j, w in enumerate(words):
        h = _mix(h ^ keyed(w, b"column %d" % j))
    return (keyed(h, b"end") >> np.uint64(11)).astype(np.float64) * 2.0**-53


def reference_features(df, schema, rows):
    x = np.zeros((len(rows), len(schema.feature_names)), dtype=np.float32)
    for j, spec in enumerate(schema.numeric):
        v = np.clip(df[spec.name].to_numpy(dtype=np.float64, na_value=np.nan)[rows], spec.lower, spec.upper)
        lo, hi = spec.lower, spec.upper
        if spec.transform == "log1p":
            v, lo, hi = np.log1p(v), math.log1p(lo), math.log1p(hi)
        x[:, j] = (v - lo) / (hi - lo)
    j = len(schema.numeric)
    for col, cats in schema.categorical:
        codes = label_codes(df[col], cats)[rows]
        codes[codes < 0] = len(cats)
        x[np.arange(len(rows)), j + codes] = 1.0
        j += len(cats) + 1
    return x


# ---------------------------------------------------------------- the data
def _frame(n: int = ROWS, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "f32": rng.normal(0.5, 0.4, n).astype(np.float32),  # clipped at both ends
        "f64": rng.random(n) * 3 - 1,
        "count": rng.integers(0, 60, n),  # int64, log1p
        "nullable": pd.array(rng.integers(0, 9, n), dtype="Int64"),
        "flag": rng.random(n) < 0.3,
        "region": pd.Categorical(rng.choice(["north", "south", "east", "west"], n)),
        "sector": rng.choice([" a", "b ", "c", "d"], n).astype(object),
        "y": rng.integers(0, 2, n).astype(np.int8),
    })
    df.loc[::7, "f32"] = -0.0
    df.loc[::97, "f64"] = np.nan  # dropped with data.nonfinite=drop
    df.loc[::13, "nullable"] = pd.NA
    df.loc[::11, "region"] = np.nan
    df.loc[::17, "sector"] = None
    return df


def _schema(nonfinite: str = "drop"):
    return schema_from_config(OmegaConf.create({
        "name": "table", "target": "y", "positive": None, "split_column": None, "test_fraction": 0.25,
        "nonfinite": nonfinite,
        "numeric": {"f32": {"lower": 0, "upper": 1}, "f64": {"lower": -0.5, "upper": 1.5},
                    "count": {"lower": 0, "upper": 40, "transform": "log1p"}},
        "categorical": {"region": ["north", "south", "east"], "sector": ["a", "b", "c"]}}))


# ---------------------------------------------------------------- the tests
@pytest.mark.parametrize("threads", [1, 3])
def test_split_scores_are_the_whole_array_hash_bit_for_bit(threads):
    df = _frame(70_000)  # two hash blocks
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        schema = SimpleNamespace(split_key=None, privacy_unit=None)
        kept = np.flatnonzero(np.random.default_rng(1).random(len(df)) < 0.9)
        for rows in (np.arange(len(df)), kept):
            assert np.array_equal(split.split_scores(df, schema, seed=4, rows=rows), reference_scores(df, 4, rows))
        assert not np.array_equal(split.split_scores(df, schema, seed=5), reference_scores(df, 4, np.arange(len(df))))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 3])
def test_encoded_rows_are_the_whole_array_encoding_bit_for_bit(threads):
    df, schema = _frame(), _schema()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = encoding.encode_rows(df, schema, seed=3)
    finally:
        torch.set_num_threads(before)
    kept = np.flatnonzero(np.isfinite(df["f64"].to_numpy()))
    test = reference_scores(df, 3, kept) < 0.25
    x = reference_features(df, schema, kept)
    assert rows.x_train.dtype == np.float32 and np.array_equal(rows.x_train.view(np.uint32), x[~test].view(np.uint32))
    assert np.array_equal(rows.x_test.view(np.uint32), x[test].view(np.uint32))
    y = df["y"].to_numpy(np.float32)[kept]
    assert np.array_equal(rows.y_train, y[~test]) and np.array_equal(rows.y_test, y[test])
    f32 = df["f32"].to_numpy(np.float64)[kept]
    assert rows.facts["clipped"]["f32"] == {"below_lower": int((f32 < 0).sum()), "above_upper": int((f32 > 1).sum())}
    assert rows.facts["clipped"]["count"]["above_upper"] == int((df["count"].to_numpy()[kept] > 40).sum())
    assert rows.facts["rows"]["left_out_by"]["numeric"] == {"f64": {"missing": len(df) - len(kept), "infinite": 0}}
    region, sector = (pd.Series(df[c].to_numpy(dtype=object)[kept]) for c in ("region", "sector"))

    def other(col, declared):  # the kept rows whose value goes to <other>: missing, or not declared (stripped)
        return {"missing": int(col.isna().sum()),
                "undeclared": int((col.notna() & ~col.astype(str).str.strip().isin(declared)).sum())}

    assert rows.facts["rows"]["lumped"] == {"region": other(region, ["north", "south", "east"]),
                                            "sector": other(sector, ["a", "b", "c"])}
    assert rows.facts["rows"]["lumped"]["sector"]["undeclared"] > 1000  # the 'd' rows
    # every row kept: the slices path, the same encoding
    full = encoding.encode_rows(df.assign(f64=df["f64"].fillna(0.25)), schema, seed=3)
    assert len(full.y_train) + len(full.y_test) == len(df)


def test_encode_features_and_unmatched_categories():
    df, schema = _frame(5000), _schema()
    rows = np.arange(0, 5000, 3)
    x = encoding.encode_features(df.assign(f64=df["f64"].fillna(0.0)), schema, rows)
    assert np.array_equal(x, reference_features(df.assign(f64=df["f64"].fillna(0.0)), schema, rows))
    none = df.assign(region=pd.Categorical(["nowhere"] * len(df)), f64=df["f64"].fillna(0.0))
    assert encoding.encode_rows(none, schema, seed=0).facts["rows"]["lumped"]["region"] == {"missing": 0,
                                                                                       "undeclared": len(df)}


def test_row_uniform_is_unchanged():
    rng = np.random.default_rng(2)
    x, y = rng.random((30_000, 5)).astype(np.float32), rng.integers(0, 2, 30_000)
    x[::5, 1] = -0.0
    words = (np.concatenate([x, y.reshape(-1, 1).astype(np.float32)], axis=1) + np.float32(0.0)).view(np.uint32)
    salt = hashlib.blake2b(b"9", digest_size=16, person=b"dptrain-valid").digest()

    def keyed(h, name):
        return _mix(_mix(h ^ np.uint64(_word(salt, name + b"/1"))) ^ np.uint64(_word(salt, name + b"/2")))

    h = np.full(len(x), _word(salt, b"start"), dtype=np.uint64)
    for j in range(words.shape[1]):
        h = _mix(h ^ keyed(words[:, j].astype(np.uint64), b"column %d" % j))
    expected = (keyed(h, b"end") >> np.uint64(11)).astype(np.float64) * 2.0**-53
    assert np.array_equal(row_uniform(torch.from_numpy(x), y, seed=9), expected)


def test_map_blocks_keeps_block_order_and_covers_every_row():
    spans = blocks.map_blocks(100_000, lambda a, b: (a, b), workers=4, size=30_000)
    assert spans == [(0, 30_000), (30_000, 60_000), (60_000, 90_000), (90_000, 100_000)]
    assert blocks.map_blocks(0, lambda a, b: (a, b), workers=2) == []


def test_auc_of_float32_scores_equals_float64_and_sklearn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(4)
    y = rng.random(200_000) < 0.3
    s = (rng.normal(size=y.size) + y).astype(np.float32)
    s[:50] = np.nan
    s[50:60] = np.inf
    auc = baselines.roc_auc(y, s)
    assert auc == baselines.roc_auc(y, s.astype(np.float64))
    finite = np.nan_to_num(s.astype(np.float64), nan=0.0, posinf=1e300)
    assert auc == pytest.approx(roc_auc_score(y, finite), abs=1e-12)


def test_the_baseline_fits_on_a_bounded_seeded_subsample(monkeypatch):
    monkeypatch.setattr(objectives, "BASELINE_ROWS", 1000)
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.random((5000, 3)).astype(np.float32))
    y = (x[:, 0] > 0.5).float()
    data = SimpleNamespace(x_train=x, y_train=y, x_test=x[:200], y_test=y[:200])
    sub = objectives._split(data, seed=1)
    assert sub[0].shape == (1000, 3) and np.array_equal(sub[0], objectives._split(data, seed=1)[0])
    assert not np.array_equal(sub[0], objectives._split(data, seed=2)[0])
    assert sub[2].shape == (200, 3)  # every test row
    assert objectives.baseline_fit_rows(5000) == 1000 and objectives.baseline_fit_rows(10) == 10


def test_evaluations_during_training_use_the_first_test_rows():
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.random((3000, 2)).astype(np.float32))
    y = (x[:, 0] + 0.3 * torch.from_numpy(rng.normal(size=3000).astype(np.float32)) > 0.5).float()
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Flatten(0))
    objective = objectives.build_objective("binary")
    run = SimpleNamespace(x_test=None, model=model, objective=objective)
    data = SimpleNamespace(x_test=x, y_test=y, shard=None)
    with torch.no_grad():
        first = objective.metrics(model(x[:700]), y[:700])
        whole = objective.metrics(model(x), y)
    assert evaluate(run, data, rows=700) == first and evaluate(run, data) == whole and first != whole
