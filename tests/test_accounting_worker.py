"""dptrain.privacy.worker: the run's accounting computed in a forked process beside it. The worker
may only save time: every epsilon, sigma and report must be what the run computes alone, a
worker that fails or dies changes nothing, and the run's process then really does use the
worker's values (else the test of speed would be hollow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from sklearn.metrics import roc_auc_score

from dptrain import baselines
from dptrain.config import PrivacyConfig
from dptrain.objectives import BinaryLogistic, LinearRegression, Multinomial
from dptrain.privacy import accounting, worker
from dptrain.privacy.curves import CurveConfig
from dptrain.privacy.mechanism import DPSGDMechanism

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the worker forks (Linux only)")


def _cfg(**privacy) -> object:
    return OmegaConf.create({"task": "train", "estimator": {"name": "dpsgd"},
                             "privacy": {"enabled": True, **privacy},
                             "trainer": {"distributed": False, "resume": None}})


def _inputs(**privacy) -> dict:
    settings = {"noise_multiplier": None, "target_epsilon": 1.5, **privacy}
    return dict(privacy=PrivacyConfig(**settings), epochs=3, expected_batch_size=64, dataset_size=3_000,
                delta=1e-5, curves=CurveConfig(log_every=7, budget_share=0.1, loss_bound=2.0))


def _forget() -> None:
    accounting._rdp_per_step.cache_clear()
    accounting._pld_composed.cache_clear()


def _accounting(inputs: dict) -> dict:
    """What a run computes from the mechanism's inputs: sigma, sigma_c, the planned history's
    epsilon by each accountant, and epsilon at a logged step."""
    mech = DPSGDMechanism.from_settings(**inputs)
    acc = accounting.PrivacyAccountant()
    for event, count in mech.history_between(0, mech.planned_steps):
        acc.record(event, count)
    part = accounting.PrivacyAccountant()
    for event, count in mech.history_between(0, 70):
        part.record(event, count)
    return {"sigma": mech.noise_multiplier, "sigma_c": mech.curve.noise_multiplier,
            "rdp": acc.get_epsilon(delta=mech.delta, accountant="rdp"),
            "pld": acc.get_epsilon(delta=mech.delta, accountant="pld"),
            "rdp_at_70": part.get_epsilon(delta=mech.delta, accountant="rdp")}


@pytest.fixture
def no_worker_left(monkeypatch):
    monkeypatch.setenv(worker.ENV, "1")  # whatever the machine's load while the tests run
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # pytest's own threads: the worker only computes
    monkeypatch.setattr(worker, "WAIT_SECONDS", 3600.0)  # a busy machine may slow the worker: never time out here
    _forget()
    yield
    worker.stop()
    _forget()


class _Refuse:
    """Stands in for dp-accounting's accountants in the RUN's process (after the fork): a value
    the run computed itself instead of taking the worker's fails the test."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("the run computed an accounting value itself")


def test_the_run_uses_the_workers_values_and_they_are_its_own(no_worker_left, monkeypatch):
    inputs = _inputs()
    alone = _accounting(inputs)
    _forget()
    worker.start(_cfg())
    assert worker._worker is not None
    import dp_accounting.pld
    import dp_accounting.rdp

    monkeypatch.setattr(dp_accounting.rdp, "RdpAccountant", _Refuse)  # the forked worker keeps the real ones
    monkeypatch.setattr(dp_accounting.pld, "PLDAccountant", _Refuse)
    worker.submit(**inputs)
    assert _accounting(inputs) == alone  # bit for bit: sigma, sigma_c, every epsilon
    assert {k[0] for k in worker._worker.answers} == {"rdp", "pld"}
    # a key the worker never computed is the run's to compute (here: refused, so it must ask)
    from dptrain.privacy.events import poisson_gaussian

    assert worker.lookup(("rdp", poisson_gaussian(sample_rate=0.5, noise_multiplier=3.0))) is None


def test_a_worker_that_dies_or_fails_changes_nothing(no_worker_left):
    inputs = _inputs()
    alone = _accounting(inputs)
    _forget()
    worker.start(_cfg())
    worker._worker.process.kill()  # dies before it answers
    worker.submit(**inputs)
    assert _accounting(inputs) == alone
    worker.stop()
    _forget()
    worker.start(_cfg())
    bad = dict(inputs, dataset_size="three thousand")  # the worker's from_settings raises
    worker.submit(**bad)
    assert _accounting(inputs) == alone  # the run's own inputs: nothing from the worker matches or it failed
    assert worker._worker.accounting_done and not worker._worker.finished  # it still answers jobs:
    labels, scores = np.array([0, 1, 1, 0]), np.array([0.2, 0.9, 0.4, 0.5])
    assert worker.job_value("roc_auc", (labels, scores), {}) == (roc_auc_score(labels, scores),)


def test_an_unreachable_target_is_refused_by_the_run_as_without_a_worker(no_worker_left):
    inputs = _inputs(target_epsilon=1e-9)
    with pytest.raises(Exception) as alone:
        DPSGDMechanism.from_settings(**inputs)
    _forget()
    worker.start(_cfg())
    worker.submit(**inputs)
    with pytest.raises(type(alone.value)) as with_worker:
        DPSGDMechanism.from_settings(**inputs)
    assert str(with_worker.value) == str(alone.value)


def test_a_worker_that_cannot_start_leaves_the_run_to_itself(no_worker_left, monkeypatch):
    """Inside a daemonic process (a multiprocessing pool's worker) a process may have no children:
    start() then gives no worker, and the run computes everything as before."""
    import multiprocessing.context

    def refuse(self):
        raise AssertionError("daemonic processes are not allowed to have children")

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", refuse)
    inputs = _inputs()
    alone = _accounting(inputs)
    _forget()
    worker.start(_cfg())
    assert worker._worker is None
    worker.submit(**inputs)
    assert _accounting(inputs) == alone


def _rows(kind: str = "binary", n: int = 900, d: int = 6, seed: int = 11) -> SimpleNamespace:
    g = np.random.default_rng(seed)
    x = g.normal(size=(n, d)).astype(np.float32)
    z = x @ g.normal(size=d) + g.normal(size=n)
    y = {"binary": (z > 0).astype(np.float32),
         "multiclass": np.digitize(z, np.quantile(z, [0.3, 0.7])).astype(np.int64),
         "continuous": (1 / (1 + np.exp(-z))).astype(np.float32)}[kind]
    cut = n * 2 // 3
    return SimpleNamespace(x_train=torch.from_numpy(x[:cut]), y_train=torch.from_numpy(y[:cut]),
                           x_test=torch.from_numpy(x[cut:]), y_test=torch.from_numpy(y[cut:]))


def _objective(kind: str) -> object:
    if kind == "binary":
        return BinaryLogistic()
    if kind == "multiclass":
        objective = Multinomial()
        objective.class_names = ("low", "mid", "high")
        return objective
    objective = LinearRegression()
    objective.target_bounds = (-1.0, 3.0)
    return objective


def _evaluation(objective: object, data: SimpleNamespace) -> tuple:
    """What a run's evaluation computes: the test metrics of some outputs and the baselines."""
    width = 3 if isinstance(objective, Multinomial) else 1
    weights = torch.linspace(-1, 1, data.x_test.shape[1] * width).reshape(-1, width)
    outputs = (data.x_test @ weights).squeeze(1) if width == 1 else data.x_test @ weights
    return objective.metrics(outputs, data.y_test), objective.baseline(data, seed=4)


def _refuse(*args, **kwargs):
    raise AssertionError("the run computed a scikit-learn value itself")


@pytest.mark.parametrize("kind", ["binary", "multiclass", "continuous"])
def test_the_runs_sklearn_work_is_the_workers_and_its_own(kind, no_worker_left, monkeypatch):
    """The baseline sent ahead and each AUC asked for come from the worker (the run's own copies of
    the functions are replaced after the fork by ones that fail), bit for bit what the run
    computes alone."""
    data, objective = _rows(kind), _objective(kind)
    alone = _evaluation(objective, data)
    assert "nonprivate_acc" in alone[1] or "nonprivate_rmse" in alone[1]
    worker.start(_cfg())
    monkeypatch.setattr(baselines, "FUNCTIONS", dict.fromkeys(baselines.FUNCTIONS, _refuse))
    name, args, kwargs = objective.baseline_job(data, seed=4)
    baselines.prefetch(name, *args, **kwargs)
    assert _evaluation(objective, data) == alone
    auc_jobs = {"binary": 1, "multiclass": 3, "continuous": 0}[kind]
    assert len(worker._worker.jobs) == 1 + auc_jobs  # the baseline's fit went once, ahead of its use


def test_rows_changed_after_they_were_sent_get_an_answer_of_their_own(no_worker_left):
    """A job's arguments are compared by a digest taken when they were sent: rows changed in place
    since then are not answered with the fit on the old rows."""
    data, objective = _rows(), BinaryLogistic()
    before = objective.baseline(data, seed=4)["nonprivate_acc"]
    flipped = SimpleNamespace(**{**vars(data), "y_train": 1 - data.y_train})
    after = objective.baseline(flipped, seed=4)["nonprivate_acc"]
    assert after != before  # the change matters
    worker.start(_cfg())
    name, args, kwargs = objective.baseline_job(data, seed=4)
    baselines.prefetch(name, *args, **kwargs)  # the original rows
    data.y_train.copy_(1 - data.y_train)  # every training label flipped, in place, after the send
    assert objective.baseline(data, seed=4)["nonprivate_acc"] == after
    assert len(worker._worker.jobs) == 2  # the changed rows went as a job of their own


def test_a_failed_or_lost_job_is_left_to_the_run(no_worker_left, monkeypatch):
    labels, scores = np.array([0, 1, 1, 0, 1]), np.array([0.1, 0.8, 0.3, 0.4, 0.9])
    worker.start(_cfg())
    assert worker.job_value("roc_auc", (labels, scores[:4]), {}) is None  # sklearn raises in the worker
    assert worker.job_value("roc_auc", (labels, scores), {}) == (roc_auc_score(labels, scores),)
    monkeypatch.setattr(worker, "MAX_JOB_BYTES", 64)  # rows too large to copy: computed by the run
    assert worker.send_job("roc_auc", (labels, np.zeros(50)), {}) is None
    assert worker.job_value("roc_auc", (labels, np.zeros(50)), {}) is None
    assert len(worker._worker.jobs) == 2
    worker._worker.process.kill()
    assert worker.job_value("roc_auc", (labels, 1 - scores), {}) is None  # dead: nothing more comes
    assert baselines.compute("roc_auc", labels, 1 - scores) == roc_auc_score(labels, 1 - scores)


@pytest.mark.parametrize(("change", "env"), [
    ({}, {}),
    ({"task": "audit"}, {}),
    ({"estimator": {"name": "ssp"}}, {}),
    ({"privacy": {"enabled": False}}, {}),
    ({"trainer": {"distributed": True}}, {}),
    ({"trainer": {"resume": "auto"}}, {}),
    ({}, {"DPTRAIN_ACCOUNTING_WORKER": "0"}),
    ({}, {"RANK": "0"}),
])
def test_where_a_worker_runs(change, env, monkeypatch):
    monkeypatch.delenv(worker.ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.4, 0.4))
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    cfg = OmegaConf.merge(_cfg(), OmegaConf.create(change))
    assert worker.eligible(cfg) is (not change and not env)
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # another thread alive: no fork
    assert worker.eligible(_cfg()) is False


@pytest.mark.parametrize(("cores", "load", "choice", "expected"), [
    (2, 0.4, "", True),
    (2, 1.2, "", True),  # one core's worth to spare, less a little
    (2, 1.6, "", False),  # both cores busy: the worker would only compete with the run
    (1, 0.0, "", False),  # one usable core
    (2, 1.9, "1", True),  # asked for: whatever the load
    (1, 0.0, "1", True),
    (8, 0.0, "0", False),
])
def test_a_worker_runs_when_a_core_is_spare_or_when_asked(cores, load, choice, expected, monkeypatch):
    monkeypatch.setenv(worker.ENV, choice)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert worker.eligible(_cfg()) is expected


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("DPTRAIN_ACCOUNTING_WORKER", None)
    return {**env, **extra}


@pytest.mark.slow  # 26 s of the fast suite; CI runs it with -m slow
def test_a_run_with_the_worker_writes_what_a_run_without_it_writes(tmp_path):
    """The same run (reproducible noise from a seed file) with the worker and without it: the
    same privacy report, metrics (the baseline and the AUCs included) and log (timings aside).
    The run's process, with the worker, imports no dp-accounting, scikit-learn or scipy: the
    worker computed every value it needed."""
    key = tmp_path / "noise.key"
    made = subprocess.run([sys.executable, "-m", "dptrain.privacy.randomness", str(key)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    out = {}
    forced = {"DPTRAIN_ACCOUNTING_WORKER": "1", "DPTRAIN_ACCOUNTING_WORKER_WAIT": "3600"}  # no time-out if busy
    for mode, env in (("worker", forced), ("alone", {"DPTRAIN_ACCOUNTING_WORKER": "0"})):
        run = tmp_path / mode
        res = subprocess.run([sys.executable, "-X", "importtime", "-m", "dptrain", "experiment=logit",
                              "data=synthetic", "data.n_rows=3000", "trainer.epochs=2", "trainer.batch_size=100",
                              "trainer.progress=false", "trainer.eval_every=20", "privacy.noise_multiplier=null",
                              "privacy.target_epsilon=2", f"privacy.noise_seed_file={key}", f"hydra.run.dir={run}"],
                             cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        imported = {line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines()
                    if line.startswith("import time:")}
        out[mode] = (run, imported)
    (with_run, with_imports), (alone_run, alone_imports) = out["worker"], out["alone"]
    assert {"dp_accounting", "sklearn", "scipy"} <= alone_imports
    assert not {"dp_accounting", "sklearn", "scipy"} & with_imports and "torch" in with_imports
    assert "torch._dynamo" not in with_imports | alone_imports  # dptrain.optimizers (tests/test_optimizers.py)
    a, b = (json.loads((r / "privacy.json").read_text()) for r in (with_run, alone_run))
    a.pop("sha256"), b.pop("sha256")  # .hydra/hydra.yaml names the run folder: digests checked in test_run_folder
    assert a == b and a["noise_multiplier_source"] == "calibrated"
    drop = re.compile(r'"time/[^"]*": [0-9.e+-]+,?')
    for name in ("metrics.json", "private/metrics.json"):
        metrics = [drop.sub("", (r / name).read_text()) for r in (with_run, alone_run)]
        assert metrics[0] == metrics[1] and '"test/auc"' in metrics[0]
    assert '"baseline/nonprivate_acc"' in metrics[0]  # private/metrics.json: the non-private baseline

    def log(run: Path) -> list[str]:
        text = (run / "private" / "dptrain.log").read_text().replace(str(run), "RUN")
        text = re.sub(r"^\[[^\]]*\]", "", text, flags=re.M)
        return re.sub(r"train loop: [0-9.]+ s", "train loop: T s", text).splitlines()

    assert log(with_run) == log(alone_run)
