"""A sharded read (dptrain.data.shards): with trainer.distributed=true on a partitioned Parquet
data set, each process reads only its own whole row groups, encodes them with the public schema
(the same encoding and split as the whole table's), and N is the sum over the processes.

The multi-process cases without torchrun run the ranks as threads that meet in a barrier-based
all_gather (no timing involved); one real 2-process run (torchrun, gloo) goes through the
command line."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from dptrain.core.validation import ConfigError
from dptrain.data import DataError, data_source, load_dataset
from dptrain.data import shards as shards_mod
from dptrain.data.shards import (
    assign_pieces,
    load_shard,
    load_training_data,
    open_parquet_set,
    shard_pieces,
    sharding_plan,
)
from dptrain.tasks import cli  # registers the config schemas

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
NUMERIC = {"x0": {"lower": -1, "upper": 1}, "x1": {"lower": -1, "upper": 1}, "x2": {"lower": 0, "upper": 10}}
CATEGORICAL = {"cat": ["a", "b", "c"]}
SCHEMA_ARGS = ["data=table", "data.target=y", "data.positive=yes", "data.negative=no",
               "++data.numeric={x0: {lower: -1, upper: 1}, x1: {lower: -1, upper: 1}, x2: {lower: 0, upper: 10}}",
               "++data.categorical={cat: [a, b, c]}"]
# file name -> row-group sizes (several files, several row groups, unequal sizes)
LAYOUT = {"part-0.parquet": [300, 300, 120], "part-1.parquet": [500], "sub/part-2.parquet": [200, 200, 200, 80],
          "part-3.pq": [150, 150]}


def _frame(n: int, seed: int = 0, *, start: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.2, 1.2, size=(n, 2))  # some values outside the declared bounds: clipped
    cat = rng.choice(["a", "b", "c", "zzz"], size=n)
    logit = 2 * x[:, 0] - 1.5 * x[:, 1] + (cat == "a")
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-logit)), "yes", "no")
    return pd.DataFrame({"rid": np.arange(start, start + n), "x0": x[:, 0], "x1": x[:, 1],
                         "x2": rng.integers(0, 12, size=n).astype(float), "cat": cat, "y": y,
                         "unused": rng.normal(size=n)})


def write_set(root: Path, layout: dict[str, list[int]] = LAYOUT, seed: int = 0) -> pd.DataFrame:
    """A partitioned Parquet set under ``root`` (plus ``root``.whole.parquet, the same rows in one
    file); returns every row."""
    start, frames = 0, []
    for i, (name, groups) in enumerate(layout.items()):
        df = _frame(sum(groups), seed + i, start=start)
        start += len(df)
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(path, pa.Table.from_pandas(df, preserve_index=False).schema) as w:
            at = 0
            for g in groups:
                w.write_table(pa.Table.from_pandas(df.iloc[at:at + g], preserve_index=False))
                at += g
        frames.append(df)
    whole = pd.concat(frames, ignore_index=True)
    pq.write_table(pa.Table.from_pandas(whole, preserve_index=False), root.parent / f"{root.name}.whole.parquet")
    return whole


def data_cfg(path: Path, **extra) -> dict:
    return {"name": "table", "path": str(path), "target": "y", "positive": "yes", "negative": "no", "numeric": NUMERIC,
            "categorical": CATEGORICAL, **extra}


class Threads:
    """W ranks as threads; all_gather_objects meets in a barrier (pickled copies, as gloo's)."""

    def __init__(self, world: int) -> None:
        self.world, self.slots, self.barrier = world, [None] * world, threading.Barrier(world)

    def rank(self, r: int) -> _Rank:
        return _Rank(self, r)

    def run(self, fn) -> list:
        """fn(rank context) on every rank; the results (or the exceptions raised), by rank."""
        def call(r):
            try:
                return fn(self.rank(r))
            except Exception as exc:  # noqa: BLE001
                return exc
        with ThreadPoolExecutor(max_workers=self.world) as pool:
            return list(pool.map(call, range(self.world)))


class _Rank:
    def __init__(self, group: Threads, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world

    def all_gather_objects(self, obj) -> list:
        g = self.group
        g.slots[self.rank] = pickle.dumps(obj)
        g.barrier.wait()
        out = [pickle.loads(b) for b in g.slots]
        g.barrier.wait()
        return out

    def gather_rows(self, *tensors):
        parts = self.all_gather_objects(tensors)
        return tuple(torch.cat([p[i] for p in parts]) for i in range(len(tensors)))


def _sorted_rows(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    a = np.column_stack([x.numpy().astype(np.float64), y.numpy().astype(np.float64)])
    return a[np.lexsort(a.T[::-1])]


# ------------------------------------------------------------------------------ (a) the assignment


@pytest.mark.parametrize("world", [1, 2, 3])
def test_shards_are_disjoint_whole_row_groups_covering_every_row_once(tmp_path, world):
    whole = write_set(tmp_path / "set")
    pset = open_parquet_set(tmp_path / "set")
    assert [f.relative_to(tmp_path / "set").as_posix() for f in pset.files] == sorted(LAYOUT)  # path order
    assert sorted(p.rows for p in pset.pieces) == sorted(n for g in LAYOUT.values() for n in g)
    seen, loads = [], []
    for rank in range(world):
        mine = shard_pieces(pset, rank, world)
        assert mine, "every rank gets at least one row group"
        assert mine == shard_pieces(pset, rank, world)  # deterministic
        ids = [pq.ParquetFile(pset.files[p.file]).read_row_group(p.row_group, columns=["rid"])["rid"].to_numpy()
               for p in mine]
        seen.append(np.concatenate(ids))
        loads.append(sum(p.rows for p in mine))
    every = np.concatenate(seen)
    assert len(every) == len(whole) and np.array_equal(np.sort(every), np.sort(whole["rid"].to_numpy()))
    assert max(loads) - min(loads) <= max(p.rows for p in pset.pieces)  # balanced by rows (LPT)
    # the same on every rank: a function of the metadata only
    assert assign_pieces([p.rows for p in pset.pieces], world) == assign_pieces([p.rows for p in pset.pieces], world)


def test_one_file_with_row_groups_and_the_greedy_balance(tmp_path):
    p = tmp_path / "one.parquet"
    df = _frame(1000)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), p, row_group_size=250)
    pset = open_parquet_set(p)
    assert [x.rows for x in pset.pieces] == [250] * 4 and pset.origin(0) == f"data.path={str(p)!r}"
    assert [x.rows for x in shard_pieces(pset, 0, 2)] == [250, 250]
    assert assign_pieces([5, 1, 4, 3, 3], 2) == [0, 1, 1, 1, 0]  # 5+3 | 4+3+1
    assert assign_pieces([2, 2, 2], 3) == [0, 1, 2]


# ------------------------------------------------------------------------------ (b) encoding = whole table's


@pytest.mark.parametrize("world", [1, 2, 3])
def test_shard_encoding_and_split_equal_the_whole_tables(tmp_path, world):
    write_set(tmp_path / "set")
    whole = load_dataset(data_cfg(tmp_path / "set.whole.parquet"), seed=7)  # one file, read whole
    folder = load_dataset(data_cfg(tmp_path / "set"), seed=7)  # the folder, read whole
    pset = open_parquet_set(tmp_path / "set")
    parts = Threads(world).run(lambda d: load_shard(data_source(data_cfg(tmp_path / "set")), pset, seed=7, dist=d))
    for r, part in enumerate(parts):
        assert part.shard == (r, world)
        assert part.n_train == whole.n_train and part.n_test == whole.n_test  # the job's counts
        assert part.diagnostics == whole.diagnostics  # summed over the ranks
        assert part.feature_names == whole.feature_names
        if world > 1:
            assert part.x_train.shape[0] < whole.n_train  # only its own rows
    for name in ("train", "test"):
        x = torch.cat([getattr(p, f"x_{name}") for p in parts])
        y = torch.cat([getattr(p, f"y_{name}") for p in parts])
        expected = _sorted_rows(getattr(whole, f"x_{name}"), getattr(whole, f"y_{name}"))
        assert np.array_equal(_sorted_rows(x, y), expected)
        assert np.array_equal(_sorted_rows(getattr(folder, f"x_{name}"), getattr(folder, f"y_{name}")), expected)
    assert whole.diagnostics["clipped"]["x0"]["above_upper"] > 0  # the set exercises the clipping count


def test_checks_over_every_row_use_every_shard(tmp_path):
    """A positive label, both classes, both split sides and kept rows may each be on one shard
    only: the whole data set passes, as a whole-table read would. Dropped rows (nonfinite=drop)
    are dropped per row."""
    root = tmp_path / "set"
    root.mkdir()
    a, b = _frame(300, 1), _frame(300, 2, start=300)
    a["y"] = "no"  # the positive label only in the second file
    a.loc[:9, "x1"] = np.nan
    for name, df in (("a.parquet", a), ("b.parquet", b)):
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), root / name)
    cfg = data_cfg(root, nonfinite="drop")
    whole = load_dataset(cfg, seed=0)
    parts = Threads(2).run(lambda d: load_shard(data_source(cfg), open_parquet_set(root), seed=0, dist=d))
    assert not any(isinstance(p, Exception) for p in parts), parts
    assert {float(p.y_train.max()) for p in parts} == {0.0, 1.0}
    assert parts[0].n_train == whole.n_train == sum(int(p.x_train.shape[0]) for p in parts)


def test_a_refused_shard_is_refused_on_every_rank_with_the_whole_tables_error(tmp_path):
    root = tmp_path / "set"
    root.mkdir()
    good, bad = _frame(200, 1), _frame(200, 2)
    bad["x0"] = bad["x0"].astype(str)
    bad.loc[5, "x0"] = "SECRETVALUE"
    for name, df in (("a.parquet", good), ("b.parquet", bad)):
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), root / name)
    strict = data_cfg(root, nonfinite="error")  # the user's choice of a refusal that depends on the rows
    with pytest.raises(DataError) as whole:
        load_dataset(strict, seed=0)
    errors = Threads(2).run(lambda d: load_shard(data_source(strict), open_parquet_set(root), seed=0, dist=d))
    assert all(isinstance(e, DataError) for e in errors), errors
    assert str(errors[0]) == str(errors[1]) == str(whole.value)
    assert "data.numeric.x0" in str(whole.value) and "SECRETVALUE" not in str(whole.value)
    # with data.nonfinite=drop (the default) the row is left out on its shard, and counted over every shard
    parts = Threads(2).run(lambda d: load_shard(data_source(data_cfg(root)), open_parquet_set(root), seed=0, dist=d))
    assert {p.diagnostics["rows"]["left_out_by"]["numeric"]["x0"]["not_a_number"] for p in parts} == {1}
    # no row anywhere with the positive label: every shard loads (issue 44: a refusal would tell it)
    for name, df in (("a.parquet", good), ("b.parquet", _frame(200, 2))):
        df = df.assign(y="no")
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), root / name)
    parts = Threads(2).run(lambda d: load_shard(data_source(data_cfg(root)), open_parquet_set(root), seed=0, dist=d))
    assert all(not isinstance(p, Exception) and float(p.y_train.max()) == 0.0 for p in parts), parts
    # a declared column missing from one file: from the metadata, naming that file
    pq.write_table(pa.Table.from_pandas(good.drop(columns=["cat"]), preserve_index=False), root / "b.parquet")
    with pytest.raises(DataError, match="data.categorical.cat: column 'cat' is not in .*the folder's file 'b.parquet'"):
        load_dataset(data_cfg(root), seed=0)
    errors = Threads(2).run(lambda d: load_shard(data_source(data_cfg(root)), open_parquet_set(root), seed=0, dist=d))
    assert all(isinstance(e, DataError) and "'b.parquet'" in str(e) for e in errors), errors


# ------------------------------------------------------------------------------ (d) refusals


def _sharding(conf, world):
    """dptrain.data.shards.sharding_plan with a run's data source, trainer.baseline and estimator."""
    return sharding_plan(data_source(conf.data), world=world, baseline=conf.trainer.baseline,
                         estimator=conf.estimator.name)


def _training_data(conf, dist):
    """dptrain.data.shards.load_training_data as task=train calls it."""
    return load_training_data(data_source(conf.data), seed=conf.seed, dist=dist, baseline=conf.trainer.baseline,
                              estimator=conf.estimator.name)


def _conf(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=overrides))


def test_what_cannot_be_sharded_is_refused_before_any_row_is_read(tmp_path, monkeypatch):
    write_set(tmp_path / "set")
    base = ["experiment=logit", *SCHEMA_ARGS, f"data.path={tmp_path / 'set'}", "trainer.distributed=true"]

    def no_read(*a, **k):
        raise AssertionError("a row was read")

    monkeypatch.setattr(shards_mod, "read_rows", no_read)
    conf = _conf([*base, "trainer.baseline=true"])  # the baseline asked for
    errors = Threads(2).run(lambda d: _training_data(conf, d))
    assert all(isinstance(e, ConfigError) and re.search(r"trainer.baseline=True is not allowed.*trainer.baseline="
                                                        "false", str(e)) for e in errors), errors
    ok = _conf([*base, "trainer.baseline=false"])
    # processes that see different data sets at data.path (machines without a shared path) are refused
    write_set(tmp_path / "other", {"a.parquet": [100, 100]})
    other = _conf([*base, "trainer.baseline=false", f"data.path={tmp_path / 'other'}"])
    errors = Threads(2).run(lambda d: _training_data(ok if d.rank == 0 else other, d))
    assert all(isinstance(e, DataError) and "the processes see different Parquet files" in str(e)
               for e in errors), errors
    assert _sharding(ok, world=2) is not None
    with pytest.raises(ConfigError, match=r"with 11 processes.*has 10 row group\(s\).*at least 11 row groups"):
        _sharding(ok, world=11)
    one = tmp_path / "one.parquet"
    pq.write_table(pa.Table.from_pandas(_frame(100), preserve_index=False), one)
    single = [*base, "trainer.baseline=false", f"data.path={one}"]
    assert _sharding(_conf(single), world=2) is None  # one row group, auto: the whole table, as before
    with pytest.raises(ConfigError, match=r"with 2 processes.*data.sharding=row_groups.*has 1 row group"):
        _sharding(_conf([*single, "data.sharding=row_groups"]), world=2)
    assert _sharding(_conf([*base, "data.sharding=off"]), world=2) is None
    with pytest.raises(ConfigError, match=r"data.sharding='row_groups' is not allowed: needs trainer.distributed"):
        _sharding(_conf([*base, "trainer.distributed=false", "data.sharding=row_groups"]), world=None)
    csv = tmp_path / "t.csv"
    _frame(50).to_csv(csv, index=False)
    with pytest.raises(ConfigError, match=r"data.sharding='row_groups' is not allowed: reads Parquet row groups"):
        _sharding(_conf([*base, f"data.path={csv}", "data.sharding=row_groups"]), world=2)
    with pytest.raises(ConfigError, match=r"data.sharding='bogus' is not allowed"):
        from dptrain.tasks.registry import validate

        validate(_conf([*base, "data.sharding=bogus"]))
    from dptrain.tasks.tune import check_tune

    tune = _conf(["experiment=logit", "task=tune", "tune=lr_clip", "privacy.noise_multiplier=null",
                  "privacy.target_epsilon=2", "trainer.distributed=true"])
    with pytest.raises(ConfigError, match=r"trainer.distributed=True is not allowed: must be false for task=tune"):
        check_tune(tune)


# ------------------------------------------------------------------------------ (c) a real 2-process run


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    path = os.pathsep.join([str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}  # the worker script imports this checkout's dptrain


@pytest.mark.slow  # 17 s of the fast suite; CI runs it with -m slow
def test_two_process_sharded_run_matches_one_process(tmp_path):
    from dptrain.models.objectives import build_objective
    from dptrain.tasks.predict import load_model

    write_set(tmp_path / "set")
    run = ["experiment=logit", "estimator.interval_share=0", *SCHEMA_ARGS, f"data.path={tmp_path / 'set'}",
           "++data.split_key=[rid]", "trainer.epochs=2",
           "trainer.batch_size=128", "trainer.progress=false", "trainer.threads=1", "trainer.baseline=false",
           "trainer.eval_every=10"]
    one, two, spy = tmp_path / "one", tmp_path / "two", tmp_path / "spy"
    spy.mkdir()
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cli.run(compose(config_name="config", overrides=run), run_dir=one)
    res = subprocess.run([*TORCHRUN, str(REPO / "tests" / "_shard_worker.py"), str(spy), *run,
                          "trainer.distributed=true", f"hydra.run.dir={two}"],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    p1, p2 = (json.loads((d / "privacy.json").read_text()) for d in (one, two))
    for key in ("dataset_size", "sample_rate", "epsilon", "epsilons", "steps", "noise_multiplier", "delta"):
        assert p2[key] == p1[key], key
    assert p2["distributed"]["world_size"] == 2 and "Parquet row groups" in p2["distributed"]["sharding"]
    # each rank read only its own row groups (the declared columns and the split's key, data.split_key: not
    # the whole row, which is the default key); together every row once
    pset = open_parquet_set(tmp_path / "set")
    reads = [json.loads((spy / f"rank{r}.json").read_text()) for r in (0, 1)]
    total = sum(p.rows for p in pset.pieces)
    got = []
    for r, read in enumerate(reads):
        assert 0 < sum(x["rows"] for x in read) < total
        assert all(x["columns"] == ["cat", "rid", "x0", "x1", "x2", "y"] for x in read), read
        got += [(x["file"], g) for x in read for g in x["row_groups"]]
        assert sorted(got[-sum(len(x["row_groups"]) for x in read):]) == sorted(
            (pset.files[p.file].name, p.row_group) for p in shard_pieces(pset, r, 2))
    assert sorted(got) == sorted((pset.files[p.file].name, p.row_group) for p in pset.pieces)
    # the test metrics are over every test row: what one process computes with the same model
    m1, m2 = (json.loads((d / "private" / "metrics.json").read_text()) for d in (one, two))
    model = load_model(two)
    whole = load_dataset(data_cfg(tmp_path / "set", split_key=["rid"]), seed=_conf(run).seed)
    with torch.no_grad():
        expected = build_objective("binary").metrics(model.module(whole.x_test), whole.y_test)
    assert m2["test/acc"] == pytest.approx(expected["acc"], abs=1e-6)
    assert m2["test/auc"] == pytest.approx(expected["auc"], abs=1e-9)
    assert m2["baseline/majority_acc"] == m1["baseline/majority_acc"]
    # nothing about a shard's size in the run's public files or its log
    public = "".join((two / f).read_text() for f in ("privacy.json", "metrics.json", "privacy.txt", "FILES.txt"))
    for read in reads:
        n = re.compile(rf"(?<![\d.,:]){sum(x['rows'] for x in read)}(?![\d.,:])")
        assert not n.search(public) and not n.search(res.stdout + res.stderr)
