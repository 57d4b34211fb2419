"""Person-level training end to end (issue 47): experiment=panel_sim's report epsilon equals
dp-accounting's for the same unit-level events, the split by unit, the private counts, the
refusals by name, and the example-level report's group-privacy levels."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from dp_accounting import dp_event, rdp
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from dptrain.core.validation import ConfigError
from dptrain.data import data_source, load_dataset
from dptrain.data.split import split_scores
from dptrain.data.synthetic import make_panel
from dptrain.inference.run import check_estimator
from dptrain.privacy.accounting import RDP_ORDERS, rdp_curve, rdp_to_epsilon
from dptrain.privacy.dpsgd.units import UnitBound
from dptrain.privacy.events import poisson_gaussian
from dptrain.privacy.group import approx_dp_group, group_level, rdp_group_epsilon
from dptrain.privacy.randomness import Randomness, new_seed_file
from dptrain.settings.data import PanelDataConfig
from dptrain.settings.train import Config, check_person_level
from dptrain.tasks import cli
from dptrain.tasks.plan import training_plan
from dptrain.tasks.registry import validate
from dptrain.training.units import unit_rows

SMALL_PANEL = ["experiment=panel_sim", "data.n_units=3000", "trainer.epochs=1", "trainer.batch_size=200",
               "trainer.progress=false"]


def _compose(overrides):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _dp_accounting_epsilon(report: dict) -> float:
    """RdpAccountant of dp-accounting (its default orders) on the run's unit-level events:
    PoissonSampled(q = B / N units, Gaussian(sigma)) for the steps without a dp/ curve value and
    PoissonSampled(q, Gaussian(joint sigma)) for the steps that release one."""
    q = report["expected_batch_size"] / report["dataset_size"]
    curves = report["dp_curves"]
    releases = 0 if curves is None else curves["releases"]
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(report["noise_multiplier"])),
                report["steps"] - releases)
    if releases:
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(curves["joint_noise_multiplier"])),
                    releases)
    return acc.get_epsilon(report["delta"])


def test_panel_sim_report_epsilon_equals_dp_accounting_in_units(tmp_path):
    cfg = _compose(SMALL_PANEL)
    cli.run(cfg, run_dir=tmp_path)
    report = json.loads((tmp_path / "privacy.json").read_text())
    data = load_dataset(data_source(PanelDataConfig(n_units=3000, privacy_unit="person_id")), seed=0)
    n_units = int(np.unique(data.unit_train.numpy()).size)
    assert report["dataset_size"] == n_units < data.n_train  # N counts persons, not rows
    assert report["expected_batch_size"] == 200
    assert report["epsilon"] == pytest.approx(_dp_accounting_epsilon(report), rel=1e-9)
    assert report["unit_column"] == "person_id" and report["max_rows_per_unit"] == 5
    assert "per person_id (all rows of one person_id, at most 5 counted)" in report["guarantee"]
    assert report["group_privacy"] is None
    text = (tmp_path / "privacy.txt").read_text()
    assert f"N = {n_units} person_ids" in text
    diag = json.loads((tmp_path / "private" / "data_diagnostics.json").read_text())["units"]
    assert diag["units"] == n_units and diag["training_rows"] == data.n_train
    assert diag["rows_dropped_by_cap"] == data.n_train - diag["rows_kept"] > 0
    # the private counts appear in no publishable file
    public = [p for p in tmp_path.rglob("*") if p.is_file() and "private" not in p.parts and p.suffix != ".pt"]
    for p in public:
        body = p.read_text(errors="replace")
        for key in ("rows_dropped_by_cap", "training_rows", "rows_per_unit_histogram"):
            assert key not in body, p


def test_the_split_puts_all_rows_of_a_person_on_one_side():
    """The hash split keyed on the unit: every row of a person gets the same u (one side), and the
    training rows are exactly the rows of the persons whose u >= test_fraction; per row (no
    unit) the rows of one person get different u."""
    src = data_source(PanelDataConfig(n_units=2000, n_features=3, privacy_unit="person_id"))
    df = make_panel(2000, 20, 3, seed=4)
    u = pd.Series(split_scores(df, src.schema, seed=4))
    per_person = u.groupby(df["person_id"]).nunique()
    assert (per_person == 1).all()
    train_persons = u.groupby(df["person_id"]).first() >= src.schema.test_fraction
    sizes = df.groupby("person_id").size()
    data = load_dataset(src, seed=4)
    assert data.n_train == int(sizes[train_persons].sum()) and data.n_units == int(train_persons.sum())
    assert sorted(np.bincount(data.unit_train.numpy()).tolist()) == sorted(sizes[train_persons].tolist())
    by_row = data_source(PanelDataConfig(n_units=2000, n_features=3))
    u_row = pd.Series(split_scores(df, dataclasses.replace(by_row.schema, split_key=("person_id",)), seed=4))
    assert (u_row.groupby(df["person_id"]).nunique() > 1).sum() > 100  # per row: persons are cut


@pytest.mark.parametrize("override, words", [
    (["privacy.max_rows_per_unit=null"], "privacy.max_rows_per_unit"),
    (["privacy.unit_combine=median"], "privacy.unit_combine"),
    (["data.privacy_unit=x0"], "data.privacy_unit"),
    (["data.privacy_unit=null"], "privacy.max_rows_per_unit=5 is not allowed: needs data.privacy_unit"),
])
def test_settings_refused_by_name(override, words):
    cfg = _compose(["experiment=panel_sim", *override])
    with pytest.raises(ConfigError, match=re.escape(words)):
        conf: Config = OmegaConf.to_object(cfg)
        validate(conf)
        training_plan(conf)


@pytest.mark.parametrize("override, words", [
    ("estimator.interval_share=0.25", "estimator.interval_share=0.25 is not allowed: with data.privacy_unit"),
    ("estimator=subsample_aggregate", "estimator='subsample_aggregate' is not allowed: with data.privacy_unit"),
])
def test_the_interval_release_and_other_estimators_are_refused_with_a_unit(override, words):
    conf: Config = OmegaConf.to_object(_compose(SMALL_PANEL + [override]))
    validate(conf)
    with pytest.raises(ConfigError, match=re.escape(words)):
        check_estimator(training_plan(conf))


def test_example_level_report_gives_group_privacy_levels(tmp_path):
    cfg = _compose(["experiment=panel_sim", "data.privacy_unit=null", "privacy.max_rows_per_unit=null",
                    "data.n_units=1500", "trainer.epochs=1", "trainer.batch_size=200", "trainer.progress=false"])
    cli.run(cfg, run_dir=tmp_path)
    report = json.loads((tmp_path / "privacy.json").read_text())
    assert "example-level" in report["guarantee"] and "unit_column" not in report
    levels = {lv["k"]: lv for lv in report["group_privacy"]["levels"]}
    assert set(levels) == {2, 5, 10, 20}
    eps, delta = report["epsilon"], report["delta"]
    for k, lv in levels.items():
        _, delta_k = approx_dp_group(eps, delta, k)
        assert lv["delta"] == pytest.approx(delta_k)
        assert lv["epsilon"] <= k * eps * (1 + 1e-12)
    assert "protected only at the group-privacy level" in (tmp_path / "privacy.txt").read_text()


def test_group_privacy_rules_are_exact_and_the_tighter_is_kept():
    assert approx_dp_group(0.5, 1e-6, 4) == pytest.approx((2.0, 4 * math.exp(1.5) * 1e-6))
    assert approx_dp_group(3.0, 1e-6, 20)[1] == 1.0  # delta capped at 1: no guarantee
    history = ((poisson_gaussian(sample_rate=0.01, noise_multiplier=2.0), 1000),)
    curve = rdp_curve(history)
    # k = 1: the RDP rule is the plain RDP conversion
    assert rdp_group_epsilon(curve, 1e-5, 1) == pytest.approx(rdp_to_epsilon(curve, 1e-5))
    # k = 4 = 2^2: orders alpha >= 8 give order alpha / 4 with 9 r(alpha)
    orders = np.asarray(RDP_ORDERS)
    ok = orders >= 8
    a, r = orders[ok] / 4, 9 * curve[ok]
    by_hand = np.min(r + np.log1p(-1 / a) - np.log(1e-5 * a) / (a - 1))
    assert rdp_group_epsilon(curve, 1e-5, 4) == pytest.approx(by_hand)
    lv = group_level(0.3, 1e-6, 5, history)
    eps_a, delta_5 = approx_dp_group(0.3, 1e-6, 5)
    assert lv["epsilon"] == pytest.approx(min(eps_a, rdp_group_epsilon(curve, delta_5, 5)))


@pytest.mark.parametrize("changes, words", [
    ({"task": "tune"}, "data.privacy_unit='person_id' is not allowed: with task=tune"),
    ({"task": "audit"}, "data.privacy_unit='person_id' is not allowed: with task=audit"),
    ({"engine": "nonprivate"}, "trainer.engine='nonprivate' is not allowed: with data.privacy_unit"),
    ({"sharding": "auto"}, "data.sharding='auto' is not allowed: with data.privacy_unit='person_id' and "
     "trainer.distributed=true"),
])
def test_tasks_and_engines_without_a_unit_step_are_refused(changes, words):
    from types import SimpleNamespace


    cfg = SimpleNamespace(task=changes.get("task", "train"),
                          data=SimpleNamespace(privacy_unit="person_id", sharding=changes.get("sharding", "off")),
                          privacy=SimpleNamespace(max_rows_per_unit=3, unit_combine="mean"),
                          trainer=SimpleNamespace(distributed="sharding" in changes,
                                                  engine=changes.get("engine", "auto")))
    with pytest.raises(ConfigError, match=re.escape(words)):
        check_person_level(cfg)
    check_person_level(SimpleNamespace(**{**vars(cfg), "task": "train", "data": SimpleNamespace(
        privacy_unit="person_id", sharding="off"), "trainer": SimpleNamespace(distributed=True, engine="fast")}))


def test_the_cap_is_drawn_from_the_secret_streams(tmp_path):
    """The choice of k rows per unit: fresh OS entropy gives another choice each run (nothing in the
    run's settings or seed regenerates it); a noise seed file reproduces it, as it does the noise."""

    data = load_dataset(data_source(PanelDataConfig(n_units=400, n_features=2, privacy_unit="person_id")), seed=0)
    unit = UnitBound("person_id", 2)

    def rows(randomness):
        x, _, sampler = unit_rows(data, unit, sample_rate=0.1, randomness=randomness)
        assert int(sampler.counts.max()) == 2 and x.shape[0] == int(np.minimum(
            np.bincount(data.unit_train.numpy()), 2).sum())
        return x

    assert not torch.equal(rows(Randomness.fresh()), rows(Randomness.fresh()))
    key = new_seed_file(tmp_path / "key")
    keyed = Randomness.from_seed_file(key, run_label="r").for_data("d")
    assert torch.equal(rows(keyed), rows(Randomness.from_seed_file(key, run_label="r").for_data("d")))
    assert data.diagnostics["units"]["rows_kept"] == int(rows(keyed).shape[0])


def test_processes_take_disjoint_units_and_together_the_single_process_rows(tmp_path):
    """trainer.distributed=true: process r takes the units u = r mod W, every row of each; with a
    seed file the union over the processes is the single process' capped rows."""

    data = load_dataset(data_source(PanelDataConfig(n_units=300, n_features=2, privacy_unit="person_id")), seed=1)
    key = new_seed_file(tmp_path / "key")

    def part(rank, world):
        rnd = Randomness.from_seed_file(key, run_label="r").for_data("d")
        x, _, sampler = unit_rows(data, UnitBound("person_id", 3), sample_rate=0.1, randomness=rnd, rank=rank,
                                  world=world)
        return x, sampler

    (x0, s0), (x1, s1), (xa, sa) = part(0, 2), part(1, 2), part(0, 1)
    assert len(s0.counts) + len(s1.counts) == len(sa.counts) == data.n_units
    assert sorted(map(tuple, torch.cat([x0, x1]).tolist())) == sorted(map(tuple, xa.tolist()))
    assert sorted(s0.counts.tolist() + s1.counts.tolist()) == sorted(sa.counts.tolist())


@pytest.mark.slow  # two whole runs, one across 2 processes (torchrun, gloo): CI runs it with -m slow
def test_two_process_person_level_run_matches_single_process(tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
           "OMP_NUM_THREADS": "1"}
    run = [*SMALL_PANEL, "trainer.threads=1", "data.n_units=6000"]
    one, two = tmp_path / "one", tmp_path / "two"
    res1 = subprocess.run([sys.executable, "-m", "dptrain", *run, f"hydra.run.dir={one}"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert res1.returncode == 0, res1.stderr[-3000:]
    res2 = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "dptrain", *run, "trainer.distributed=true", f"hydra.run.dir={two}"], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=300)
    assert res2.returncode == 0, res2.stderr[-3000:]
    p1, p2 = (json.loads((d / "privacy.json").read_text()) for d in (one, two))
    for key in ("epsilon", "dataset_size", "sample_rate", "steps", "expected_batch_size", "unit_column", "guarantee"):
        assert p2[key] == p1[key], key
    assert "rank u mod W" in p2["distributed"]["sharding"]
    d1, d2 = (json.loads((d / "private" / "data_diagnostics.json").read_text())["units"] for d in (one, two))
    assert d2["units"] == d1["units"] and d2["training_rows"] == d1["training_rows"]
    m1, m2 = (json.loads((d / "private" / "metrics.json").read_text()) for d in (one, two))
    assert m2["test/acc"] == pytest.approx(m1["test/acc"], abs=0.03) and m2["test/acc"] > 0.7
