"""No timing channel in a run folder (issue 29, finding 3): every file and folder of a run carries
one modification time, the run's start (a multirun: the sweep's), whatever the secret number of
candidates K of a search; the console shows no line per candidate."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import dptrain.tasks.cli as cli
import dptrain.tasks.train
import dptrain.tasks.tune
from dptrain.tasks.registry import TASKS
from dptrain.tasks.tune import CandidateLaw

TUNE = ["task=tune", "data=synthetic", "data.n_rows=4000", "trainer.epochs=2", "trainer.batch_size=256",
        "trainer.progress=false", "logger.tensorboard=false", "privacy.target_epsilon=1", "tune=lr_clip"]
TRAIN = ["experiment=logit", "data=synthetic", "data.n_rows=3000", "trainer.epochs=1", "trainer.batch_size=100",
         "trainer.progress=false", "trainer.baseline=false"]


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _mtimes(folder: Path) -> dict[str, int]:
    """Every path under ``folder`` (itself: '.') -> its modification time in ns."""
    out = {".": folder.stat().st_mtime_ns}
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(root) / name
            out[str(path.relative_to(folder))] = path.lstat().st_mtime_ns
    return out


@pytest.fixture
def console():
    """An INFO stream handler on the root logger, as the command line's console handler is."""
    stream, root = io.StringIO(), logging.getLogger()
    handler, level = logging.StreamHandler(stream), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def _launch(overrides: list[str], run: Path, monkeypatch, task_module) -> tuple[int, int]:
    """cli.run as the command line calls it, .hydra/config.yaml written a minute before (as Hydra
    writes it at launch, before a long data read); returns (ns before the call, ns the task began)."""
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("task: x\n")
    before = time.time_ns()
    os.utime(run / ".hydra" / "config.yaml", ns=(before - 60 * 10**9,) * 2)
    task = TASKS.get(task_module.__name__.rsplit(".", 1)[1])
    began, original = [], task.run

    def run_task(cfg, **kwargs):
        began.append(time.time_ns())
        return original(cfg, **kwargs)

    monkeypatch.setattr(task, "run", run_task)
    cli.run(_compose(overrides), run_dir=run)
    return before, began[0]


def _assert_one_start_time(run: Path, before: int, began: int) -> None:
    times = _mtimes(run)
    assert {"model.pt", "privacy.json", "FILES.txt", ".hydra/config.yaml", "private"} <= set(times)
    assert len(set(times.values())) == 1, sorted(times.items(), key=lambda kv: kv[1])
    stamp = times["."]
    assert before - 2 * 10**9 <= stamp <= began  # the start, to the filesystem's resolution (at most 2 s)


@pytest.mark.parametrize("k", [1, 4])
def test_tune_folder_has_one_time_and_the_console_no_line_per_candidate(k, tmp_path, monkeypatch, console):
    """Replays finding 3: .hydra/config.yaml (written at launch) and .hydra/resolved_config.yaml,
    model.pt (written at the end) had times whose difference was the search's duration; now
    every file and folder has the start time, for K = 1 and K = 4 alike, and no 'engine=' line
    per candidate reaches the console (K = 4 printed 4)."""
    monkeypatch.setattr(CandidateLaw, "sample", lambda self, rng: k)
    run = tmp_path / "run"
    before, began = _launch(TUNE, run, monkeypatch, dptrain.tasks.tune)
    assert len((run / "private" / "candidates.jsonl").read_text().splitlines()) == k
    assert (run / ".hydra" / "resolved_config.yaml").is_file() and (run / "private" / "metrics.json").is_file()
    _assert_one_start_time(run, before, began)
    text = console.getvalue()
    assert sum("engine=" in line for line in text.splitlines()) <= 1, text
    assert "tune: selected" in text  # the console still shows the search's own lines


def test_train_folder_has_one_time(tmp_path, monkeypatch, console):
    """task=train through the same entry: every file and folder (.hydra/, private/, private/tb/)
    has the start time; a single fit still prints its set-up line."""
    run = tmp_path / "run"
    before, began = _launch(TRAIN, run, monkeypatch, dptrain.tasks.train)
    assert (run / "private" / "tb").is_dir() and (run / "metrics.json").is_file()
    _assert_one_start_time(run, before, began)
    assert sum("engine=" in line for line in console.getvalue().splitlines()) == 1


def test_stamp_times_reaches_every_file_folder_and_link(tmp_path):
    from dptrain.runfolder.tracking import stamp_times

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.txt").write_text("x")
    (tmp_path / "g.txt").write_text("y")
    (tmp_path / "link").symlink_to(tmp_path / "outside.txt")  # dangling: its target is never touched
    stamp_times(tmp_path, 1_234_567_890 * 10**9)
    assert set(_mtimes(tmp_path).values()) == {1_234_567_890 * 10**9}
    assert not (tmp_path / "outside.txt").exists()


@pytest.mark.slow  # two Python start-ups and three small runs: ~20 s on a loaded 2-core machine
def test_multirun_jobs_and_sweep_folder_carry_the_sweeps_start(tmp_path):
    """python -m dptrain -m: every job folder, and the sweep folder itself, carry the time Hydra
    wrote multirun.yaml (a job's own start would publish the durations of the jobs before it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    args = [sys.executable, "-m", "dptrain", "-m", *TRAIN, "privacy.noise_multiplier=1,2",
            f"hydra.sweep.dir={tmp_path}/sweep"]
    res = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    times = _mtimes(tmp_path / "sweep")
    start = times["multirun.yaml"]
    logs = {name for name in times if name.endswith("dptrain.log")}  # the private log is written after
    assert len(logs) == 2 and {t for name, t in times.items() if name not in logs} == {start}
    single = subprocess.run([sys.executable, "-m", "dptrain", "task=tune", *TUNE[1:], "tune.mean=3",
                             f"hydra.run.dir={tmp_path}/tune"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    times = _mtimes(tmp_path / "tune")
    assert len({t for name, t in times.items() if name != "private/dptrain.log"}) == 1, times
    assert "engine=" not in single.stdout and "tune: selected" in single.stdout
