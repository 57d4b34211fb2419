"""data.cache (issue 36): the encoded rows of a table are written once and memory-mapped by later
runs with the same file, schema and seed; any change of those is a different entry; refused data
is never cached and is refused alike; a damaged entry or an unwritable folder is a clear error; a
run folder never holds the entry's key (a digest of the private file); a sharded read refuses the
cache by name."""

from __future__ import annotations

import json
import logging
import os
import stat

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
from dptrain.data.cache import CacheError
from dptrain.data.shards import sharding_plan
from dptrain.settings.data import DataConfig
from dptrain.tasks import cli


def _frame(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.random(n).astype(np.float32)
    return pd.DataFrame({"x": x, "z": rng.normal(size=n), "g": rng.choice(["a", "b", "c"], n),
                         "y": (rng.random(n) < x).astype(np.int8)})


def _config(path, folder, **over) -> DataConfig:
    base = dict(name="table", path=str(path), target="y", positive=None, cache=str(folder),
                numeric={"x": {"lower": 0, "upper": 1}, "z": {"lower": -2, "upper": 2}}, categorical={"g": ["a", "b"]})
    base.update(over)
    if folder is None:
        base["cache"] = None
    return DataConfig(**base)


def _mapped_from(address: int) -> str | None:
    """The file mapped at ``address`` in this process (/proc/self/maps), or None (anonymous memory)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 and fields[5].startswith("/") else None
    return None


def _same(a, b) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("x_train", "y_train", "x_test", "y_test"))


def test_the_second_load_reads_the_cache_and_gets_the_same_rows(tmp_path, caplog):
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    _frame().to_parquet(path)
    plain = load_dataset(_config(path, None), seed=1)
    with caplog.at_level(logging.INFO, logger="dptrain.data"):
        first = load_dataset(_config(path, cache), seed=1)
        second = load_dataset(_config(path, cache), seed=1)
    assert "written to data.cache" in caplog.text and "read from data.cache" in caplog.text
    assert _same(plain, first) and _same(first, second) and first.diagnostics == second.diagnostics
    assert len(list(cache.iterdir())) == 1
    # the cached matrices are memory-mapped from the entry's files, not read into memory
    entry = next(cache.iterdir())
    for name in ("x_train", "x_test"):
        assert _mapped_from(getattr(second, name).data_ptr()) == str(entry / f"{name}.npy")
        assert _mapped_from(getattr(first, name).data_ptr()) is None  # the first run's: in memory


@pytest.mark.parametrize("change", ["row", "seed", "schema", "split"])
def test_a_changed_file_schema_or_seed_is_another_entry(tmp_path, change):
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    df = _frame()
    df.to_parquet(path)
    load_dataset(_config(path, cache), seed=1)
    seed, over = 1, {}
    if change == "row":
        df.loc[5, "z"] += 1e-9  # one value of one row
        df.to_parquet(path)
    elif change == "seed":
        seed = 2
    elif change == "schema":
        over = {"numeric": {"x": {"lower": 0, "upper": 0.9}, "z": {"lower": -2, "upper": 2}}}
    else:
        over = {"test_fraction": 0.3}
    again = load_dataset(_config(path, cache, **over), seed=seed)
    assert len(list(cache.iterdir())) == 2
    assert _same(again, load_dataset(_config(path, None, **over), seed=seed))


def test_refused_data_is_not_cached_and_is_refused_alike(tmp_path):
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    _frame().assign(x=np.nan).to_parquet(path)  # every row left out by data.nonfinite=drop: no training row
    for _ in range(2):
        with pytest.raises(DataError, match="no training rows"):
            load_dataset(_config(path, cache), seed=1)
    assert not cache.exists() or not any(cache.iterdir())


def test_warnings_are_repeated_from_the_cached_facts(tmp_path, caplog):
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    _frame().to_parquet(path)  # z is clipped into [-2, 2]
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dptrain.data"):
            data = load_dataset(_config(path, cache), seed=1)
        clipped = data.diagnostics["clipped"]["z"]
        assert clipped["below_lower"] > 0
        assert f"clipped into the declared bounds: z {clipped['below_lower'] + clipped['above_upper']}" in caplog.text


def test_a_damaged_entry_and_an_unwritable_folder_are_named(tmp_path):
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    _frame().to_parquet(path)
    load_dataset(_config(path, cache), seed=1)
    entry = next(cache.iterdir())
    (entry / "x_train.npy").write_bytes(b"not an array")
    with pytest.raises(CacheError, match=r"data.cache=.*damaged.*remove the cache folder's entries"):
        load_dataset(_config(path, cache), seed=1)
    blocked = tmp_path / "file"
    blocked.write_text("a file, not a folder")
    with pytest.raises(CacheError, match=r"data.cache=.*cannot create the folder"):
        load_dataset(_config(path, blocked / "sub"), seed=1)  # refused before the file is read


def test_cache_entries_are_private_whatever_the_umask(tmp_path):
    """Issue 43, finding 5: at umask 022 the cache folder, the entry and its files were world-readable
    (7/7 paths). Now the folder the run creates and each entry are 0700, every file 0600."""
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    _frame().to_parquet(path)
    old = os.umask(0o022)
    try:
        load_dataset(_config(path, cache), seed=1)
    finally:
        os.umask(old)
    paths = [cache, *cache.rglob("*")]
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in paths}
    assert all(mode == (0o700 if (tmp_path / name).is_dir() else 0o600) for name, mode in modes.items()), modes
    assert len(modes) == 8, modes  # the folder, the entry, 4 arrays, facts.json, sha256.json


@pytest.mark.parametrize("name", ["y_train.npy", "facts.json", "x_test.npy"])
def test_a_changed_entry_is_refused_by_name_before_any_row_is_used(tmp_path, name):
    """Issue 43, finding 5: an entry with flipped labels in y_train.npy was trained on silently while
    the log said "the same file, schema and seed". Now each file is checked against the digest
    written with it and a changed one is refused by name."""
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    _frame().to_parquet(path)
    first = load_dataset(_config(path, cache), seed=1)
    entry = next(p for p in cache.iterdir() if p.is_dir())
    if name == "facts.json":
        facts = json.loads((entry / name).read_text())
        facts["clipped"] = {}
        (entry / name).write_text(json.dumps(facts, sort_keys=True))
    else:
        array = np.load(entry / name)
        np.save(entry / name, (1 - array) if name.startswith("y") else array[::-1].copy(), allow_pickle=False)
    with pytest.raises(CacheError, match=f"{name} of the entry for this data set differs from the digest"):
        load_dataset(_config(path, cache), seed=1)
    assert first.y_train.numel() > 0


def test_a_run_folder_never_holds_the_key(tmp_path):
    path, cache = tmp_path / "t.parquet", tmp_path / "cache"
    _frame(4000).to_parquet(path)
    overrides = ["experiment=logit", "data=table", f"data.path={path}", "data.target=y", "data.positive=null",
                 "++data.numeric={x: {lower: 0, upper: 1}, z: {lower: -2, upper: 2}}", "++data.categorical={g: [a, b]}",
                 f"data.cache={cache}", "trainer.epochs=1", "trainer.progress=false", "estimator.interval_share=0"]
    for name in ("one", "two"):
        with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        cli.run(cfg, run_dir=tmp_path / name)
    key = next(cache.iterdir()).name
    for name in ("one", "two"):
        for f in (tmp_path / name).rglob("*"):
            if f.is_file():
                assert key not in f.read_bytes().decode("latin-1"), f
    facts = json.loads((cache / key / "facts.json").read_text())
    assert set(facts) == {"clipped", "rows", "any_train", "any_test"} and facts["rows"]["read"] == 4000


def test_a_sharded_read_refuses_the_cache_by_name(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    for i in range(2):
        pq.write_table(pa.Table.from_pandas(_frame(500, seed=i), preserve_index=False), folder / f"p{i}.parquet")
    overrides = ["experiment=logit", "data=table", f"data.path={folder}", "data.target=y", "data.positive=null",
                 "++data.numeric={x: {lower: 0, upper: 1}}", f"data.cache={tmp_path / 'c'}",
                 "trainer.distributed=true"]
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        conf = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
    with pytest.raises(ConfigError, match=r"data.cache=.*sharded read.*data.cache=null, or data.sharding=off"):
        sharding_plan(data_source(conf.data), world=2, baseline=conf.trainer.baseline,
                      estimator=conf.estimator.name)
