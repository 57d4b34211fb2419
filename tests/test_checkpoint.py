"""Crash-safe checkpoints, resume and the privacy budget.

The kill test is real: a training subprocess is SIGKILLed at a point that depends on timing
(after its first checkpoint appears, plus a random delay), resumed, killed again, resumed to
the end, and compared with an uninterrupted run: same epsilon, and, with reproducible noise
(a secret seed file, opt-in), the same parameters. Default runs keep their sampler and noise
streams out of the checkpoint: a resumed default run has the same epsilon and fresh noise.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dp_invariants import curve_steps, reference_epsilons
from hydra import compose, initialize_config_module

import dptrain.training.checkpoint as ckpt
from dptrain.tasks import cli

REPO = Path(__file__).resolve().parents[1]
# the MLP on synthetic rows: long enough (~1,000 steps) to be killed mid-run, small enough for CI
KILL = ["experiment=mlp", "data=synthetic", "data.n_rows=20000", "data.n_features=20",
        "trainer.batch_size=150", "trainer.epochs=10", "trainer.checkpoint_every=25",
        "trainer.progress=false", "trainer.baseline=false", "trainer.threads=1",
        "trainer.eval_every=100000", "logger.tensorboard=true"]
SMALL = ["experiment=logit", "estimator.interval_share=0", "data=synthetic", "data.n_rows=3000", "trainer.epochs=3",
         "trainer.batch_size=100", "trainer.progress=false", "trainer.baseline=false",
         "trainer.checkpoint_every=10"]


def _cmd(run_dir: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "dptrain", *overrides, f"hydra.run.dir={run_dir}"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _run(run_dir: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(run_dir, overrides), cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300)


def _run_inprocess(run_dir: Path, overrides: list[str]) -> float:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return cli.run(cfg, run_dir=run_dir)


def _kill_after_checkpoint(run_dir: Path, overrides: list[str], rng: random.Random) -> int | None:
    """Start a run, SIGKILL it at a random moment after a checkpoint exists; return the step of
    the checkpoint it left, or None if the run finished before it could be killed."""
    proc = subprocess.Popen(_cmd(run_dir, overrides), cwd=REPO, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = ckpt.checkpoint_path_in(run_dir)
    start_mtime = path.stat().st_mtime_ns if path.exists() else None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.stat().st_mtime_ns != start_mtime:
            break
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.4))
    if proc.poll() is not None:
        return None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return int(ckpt.load_checkpoint(path)["step"])  # never truncated: it must load


def _run_epsilon(rep: dict, steps: int, *, sigma: float | None = None, sigma_c: float | None = None) -> float:
    """RDP epsilon (dp-accounting) of the first ``steps`` steps of a run with the report's q and
    delta, when ``steps`` is its last: every 10th step and that last one also released the dp/
    curve (sigma_c: the report's)."""
    curve = rep["dp_curves"]
    return reference_epsilons(
        noise_multiplier=rep["noise_multiplier"] if sigma is None else sigma, sample_rate=rep["sample_rate"],
        steps=steps, delta=rep["delta"], accountants=("rdp",),
        curve_noise_multiplier=curve["noise_multiplier"] if sigma_c is None else sigma_c,
        curve_releases=curve_steps(steps, curve["log_every"]))["rdp"]


def _key(tmp_path: Path) -> Path:
    from dptrain.privacy.randomness import new_seed_file

    return new_seed_file(tmp_path / "noise.key")


@pytest.mark.slow  # several whole runs in subprocesses (25-45 s): CI runs it with -m slow
def test_sigkill_and_resume_gives_the_uninterrupted_run(tmp_path):
    """With a secret seed file (reproducible noise), a run killed twice and resumed ends with
    the uninterrupted run's parameters; the checkpoint then holds the streams' states."""
    ref_dir, crash_dir = tmp_path / "ref", tmp_path / "crash"
    KILL_KEYED = [*KILL, f"privacy.noise_seed_file={_key(tmp_path)}"]
    ref = _run(ref_dir, KILL_KEYED)
    assert ref.returncode == 0, ref.stderr[-2000:]
    ref_report = json.loads((ref_dir / "privacy.json").read_text())
    planned = ref_report["steps"]
    assert planned > 500

    rng = random.Random(1234)
    killed_at = []
    for _ in range(2):
        step = _kill_after_checkpoint(crash_dir, [*KILL_KEYED, "trainer.resume=auto"], rng)
        if step is None:
            break
        killed_at.append(step)
        assert not (crash_dir / "privacy.json").exists()  # a killed run claims nothing
    assert killed_at, "the run finished before it could be killed: make it longer"
    assert 0 < killed_at[0] < planned
    done = _run(crash_dir, [*KILL_KEYED, "trainer.resume=auto"])
    assert done.returncode == 0, done.stderr[-2000:]

    report = json.loads((crash_dir / "privacy.json").read_text())
    assert report["resumed_from_step"] == killed_at[-1]
    assert report["steps"] == planned
    assert report["epsilon"] == pytest.approx(ref_report["epsilon"], rel=1e-12)
    assert report["epsilons"]["pld"] == pytest.approx(ref_report["epsilons"]["pld"], rel=1e-9)
    ref_state = ckpt.load_checkpoint(ckpt.checkpoint_path_in(ref_dir))
    state = ckpt.load_checkpoint(ckpt.checkpoint_path_in(crash_dir))
    assert state["rng"]["noise"] is not None  # opted in: the streams are in the (private) checkpoint
    assert state["step"] == ref_state["step"] == planned
    assert state["accountant"] == ref_state["accountant"]
    for name, tensor in ref_state["model"].items():
        torch.testing.assert_close(state["model"][name], tensor, rtol=1e-6, atol=1e-7)
    ref_metrics = json.loads((ref_dir / "private" / "metrics.json").read_text())
    metrics = json.loads((crash_dir / "private" / "metrics.json").read_text())
    assert metrics["test/acc"] == pytest.approx(ref_metrics["test/acc"], abs=1e-6)
    # no temporary checkpoint files are left behind by the kills
    assert not list(crash_dir.rglob(".checkpoint.pt.*"))


class _Crash(RuntimeError):
    pass


def _crash_after_checkpoint(monkeypatch, run_dir: Path, overrides: list[str], at_step: int) -> list[int]:
    """Run in-process and crash right after the checkpoint of ``at_step`` is written (the
    real save runs first, as a kill just after it would leave it). Returns the saved steps."""
    real_save = ckpt.save_checkpoint
    saves: list[int] = []

    def save_then_crash(path, checkpoint):
        real_save(path, checkpoint)
        saves.append(checkpoint.step)
        if checkpoint.step >= at_step:
            raise _Crash()

    monkeypatch.setattr(ckpt, "save_checkpoint", save_then_crash)
    with pytest.raises(_Crash):
        _run_inprocess(run_dir, overrides)
    monkeypatch.setattr(ckpt, "save_checkpoint", real_save)
    return saves


def test_resume_inprocess_equals_uninterrupted(tmp_path, monkeypatch):
    """With reproducible noise (opt-in), a run crashed after its third checkpoint and resumed
    ends bit-identical to an uninterrupted run in the same process."""
    keyed = [*SMALL, "trainer.checkpoint_every=7", f"privacy.noise_seed_file={_key(tmp_path)}"]
    ref_dir = tmp_path / "ref"
    _run_inprocess(ref_dir, keyed)
    ref = json.loads((ref_dir / "privacy.json").read_text())
    mid_dir = tmp_path / "mid"
    saves = _crash_after_checkpoint(monkeypatch, mid_dir, keyed, at_step=21)
    assert saves == [7, 14, 21]
    _run_inprocess(mid_dir, [*keyed, "trainer.resume=auto"])
    got = json.loads((mid_dir / "privacy.json").read_text())
    assert got["resumed_from_step"] == 21 and got["steps"] == ref["steps"]
    assert got["epsilon"] == ref["epsilon"]
    assert "REPRODUCIBLE" in got["randomness"] and "REMOVE the noise" in got["randomness"]
    a = ckpt.load_checkpoint(ckpt.checkpoint_path_in(ref_dir))["model"]
    b = ckpt.load_checkpoint(ckpt.checkpoint_path_in(mid_dir))["model"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0)  # same process: bit-identical


def test_default_checkpoints_hold_no_secret_stream_and_resume_draws_fresh_ones(tmp_path, monkeypatch):
    """Found in review: checkpoint.pt held the sampler's and the noise generator's states, so
    whoever held it could regenerate every batch and noise vector. By default the checkpoint now
    holds neither; a resumed run has the same epsilon (the accountant's history is restored) and
    draws fresh streams, so it does not reproduce the uninterrupted run's noise."""
    ref_dir = tmp_path / "ref"
    _run_inprocess(ref_dir, [*SMALL, "trainer.checkpoint_every=7"])
    ref = json.loads((ref_dir / "privacy.json").read_text())
    state = ckpt.load_checkpoint(ckpt.checkpoint_path_in(ref_dir))
    assert state["rng"]["noise"] is None and state["rng"]["sampler"] is None and state["rng"]["samplers"] is None
    assert set(state["rng"]) == {"sampler", "samplers", "noise", "torch_global", "streams_device"}
    assert state["rng"]["streams_device"] is None  # no stream state stored, none to tie to a device
    mid_dir = tmp_path / "mid"
    _crash_after_checkpoint(monkeypatch, mid_dir, [*SMALL, "trainer.checkpoint_every=7"], at_step=21)
    _run_inprocess(mid_dir, [*SMALL, "trainer.checkpoint_every=7", "trainer.resume=auto"])
    got = json.loads((mid_dir / "privacy.json").read_text())
    assert got["resumed_from_step"] == 21 and got["epsilon"] == ref["epsilon"] and got["steps"] == ref["steps"]
    a = ckpt.load_checkpoint(ckpt.checkpoint_path_in(ref_dir))["model"]
    b = ckpt.load_checkpoint(ckpt.checkpoint_path_in(mid_dir))["model"]
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_old_checkpoints_with_seed_derived_streams_are_refused(tmp_path, capsys):
    run_dir = tmp_path / "old"
    path = ckpt.checkpoint_path_in(run_dir)
    ckpt.atomic_torch_save({"format": "dptrain-checkpoint-v1", "step": 3}, path)
    with pytest.raises(SystemExit):
        _run_inprocess(run_dir, [*SMALL, "trainer.resume=auto"])
    assert "dptrain-checkpoint-v1" in capsys.readouterr().err
    assert not (run_dir / "privacy.json").exists()


@pytest.mark.parametrize(
    "change, field",
    [
        (["privacy.noise_multiplier=1.5"], "noise_multiplier"),
        (["privacy.max_grad_norm=0.5"], "max_grad_norm"),
        (["trainer.batch_size=120"], "sample_rate"),
        (["privacy.delta=1e-6"], "delta"),
        (["data.n_rows=3100"], "dataset_size"),
        (["trainer.epochs=4"], "planned_steps"),
        (["privacy.accountant=pld"], "accountant"),
    ],
)
def test_resume_under_other_privacy_settings_is_refused_by_name(tmp_path, change, field, capsys):
    run_dir = tmp_path / "run"
    _run_inprocess(run_dir, SMALL)
    before = {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as exc:
        _run_inprocess(run_dir, [*SMALL, "trainer.resume=auto", *change])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "other privacy settings" in err and f"{field}:" in err
    after = {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before  # nothing already written was touched


def test_resume_path_and_bad_paths(tmp_path, capsys):
    src = tmp_path / "src"
    _run_inprocess(src, SMALL)
    # resuming a finished run from a PATH into a new folder: no further step, same epsilon
    dst = tmp_path / "dst"
    _run_inprocess(dst, [*SMALL, f"trainer.resume={ckpt.checkpoint_path_in(src)}"])
    a, b = (json.loads((d / "privacy.json").read_text()) for d in (src, dst))
    assert b["epsilon"] == a["epsilon"] and b["resumed_from_step"] == a["steps"]
    with pytest.raises(SystemExit):
        _run_inprocess(tmp_path / "x", [*SMALL, f"trainer.resume={tmp_path / 'nope.pt'}"])
    assert "trainer.resume=" in capsys.readouterr().err
    bad = tmp_path / "bad"
    ckpt.checkpoint_path_in(bad).parent.mkdir(parents=True)
    ckpt.checkpoint_path_in(bad).write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit):
        _run_inprocess(bad, [*SMALL, "trainer.resume=auto"])
    assert "cannot be read" in capsys.readouterr().err
    assert not (bad / "privacy.json").exists()
    # auto with no checkpoint: a fresh run
    _run_inprocess(tmp_path / "fresh", [*SMALL, "trainer.resume=auto"])
    assert json.loads((tmp_path / "fresh" / "privacy.json").read_text())["resumed_from_step"] == 0


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / ckpt.FILENAME
    ckpt.atomic_torch_save({"format": ckpt.FORMAT, "step": 1}, path)
    good = path.read_bytes()

    def torn_save(obj, fh):
        fh.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(OSError):
        ckpt.atomic_torch_save({"format": ckpt.FORMAT, "step": 2}, path)
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == [ckpt.FILENAME]  # temporary file removed


def test_leftover_of_a_killed_write_is_removed_by_the_next_write(tmp_path):
    """SIGKILL between mkstemp and the rename leaves ``.checkpoint.pt.XXXX.tmp``; the next save
    removes it (and nothing else)."""
    path = tmp_path / ckpt.FILENAME
    ckpt.atomic_torch_save({"format": ckpt.FORMAT, "step": 1}, path)
    stale = tmp_path / f".{ckpt.FILENAME}.k1ll3d.tmp"
    stale.write_bytes(b"PK\x03\x04 torn")
    other = tmp_path / ".other.pt.abc.tmp"
    other.write_bytes(b"not ours")
    ckpt.atomic_torch_save({"format": ckpt.FORMAT, "step": 2}, path)
    assert not stale.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ckpt.FILENAME, other.name])
    assert ckpt.load_checkpoint(path)["step"] == 2


def test_budget_stops_at_the_last_step_within_it(tmp_path):
    run_dir = tmp_path / "b"
    budget = 2.6  # (0.8 stopped before the first step: one RDP step at sigma 1, q 0.045 costs 1.5)
    _run_inprocess(run_dir, [*SMALL, "privacy.noise_multiplier=1.0", f"privacy.max_epsilon={budget}"])
    rep = json.loads((run_dir / "privacy.json").read_text())
    k = rep["steps"]
    assert rep["stopped_early"] and k < rep["planned_steps"]
    assert k > 20 and "privacy.max_epsilon=2.6" in rep["stop_reason"]
    assert rep["epsilon"] <= budget
    # independent check of the stopping point, the dp/ curve's releases included (the last step
    # releases one too): k steps fit, k + 1 do not
    assert rep["epsilon"] == pytest.approx(_run_epsilon(rep, k), rel=1e-9)
    assert _run_epsilon(rep, k) <= budget < _run_epsilon(rep, k + 1)
    assert "privacy budget" in (run_dir / "privacy.txt").read_text() or "max_epsilon" in (
        run_dir / "privacy.txt").read_text()
    metrics = json.loads((run_dir / "metrics.json").read_text())  # publishable: steps are data-independent
    assert metrics["train/steps"] == k


def test_budget_holds_across_resume(tmp_path, monkeypatch):
    """First run without a budget is interrupted; the resume sets a budget below what the
    whole planned run would spend: the resumed run stops within it, counting the steps done
    before the crash."""
    run_dir = tmp_path / "r"
    _crash_after_checkpoint(monkeypatch, run_dir, [*SMALL, "privacy.noise_multiplier=1.0"], at_step=10)
    fp = ckpt.load_checkpoint(ckpt.checkpoint_path_in(run_dir))["fingerprint"]
    assert fp["planned_steps"] > 25
    # a budget that allows exactly 20 steps in all: 10 before the crash, 10 after (steps 10 and
    # 20 release the dp/ curve: the run's history, the crashed part's included)
    as_report = {"sample_rate": fp["sample_rate"], "delta": fp["delta"],
                 "dp_curves": {"log_every": fp["curve_log_every"]}}
    budget = _run_epsilon(as_report, 20, sigma=1.0, sigma_c=fp["curve_noise_multiplier"]) * (1 + 1e-9)
    _run_inprocess(run_dir, [*SMALL, "privacy.noise_multiplier=1.0", f"privacy.max_epsilon={budget!r}",
                             "trainer.resume=auto"])
    rep = json.loads((run_dir / "privacy.json").read_text())
    assert rep["resumed_from_step"] == 10
    assert rep["steps"] == 20
    assert rep["epsilon"] <= budget and rep["stopped_early"]
    assert rep["dp_curves"]["releases"] == 2
    assert _run_epsilon(rep, rep["steps"] + 1) > budget



def test_resume_with_a_budget_below_the_spent_epsilon_is_refused(tmp_path, capsys):
    """Found in review: resuming a FINISHED run (epsilon 1.33) with privacy.max_epsilon=0.1
    reported epsilon 1.33 beside max_epsilon 0.1 and stopped_early false. The model already has
    the spent epsilon, so such a resume is refused by name and nothing written is touched."""
    run_dir = tmp_path / "done"
    _run_inprocess(run_dir, [*SMALL, "privacy.noise_multiplier=1.0"])
    rep = json.loads((run_dir / "privacy.json").read_text())
    before = {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for budget in (0.01, rep["epsilon"] * 0.5):
        with pytest.raises(SystemExit):
            _run_inprocess(run_dir, [*SMALL, "privacy.noise_multiplier=1.0", f"privacy.max_epsilon={budget!r}",
                                     "trainer.resume=auto"])
        err = capsys.readouterr().err
        assert "privacy.max_epsilon=" in err and "already spent" in err and f"{rep['epsilon']:.6g}" in err
    assert {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    # a budget at or above the spent epsilon is fine: no further step, the report is unchanged in substance
    _run_inprocess(run_dir, [*SMALL, "privacy.noise_multiplier=1.0", f"privacy.max_epsilon={rep['epsilon'] * 1.01!r}",
                             "trainer.resume=auto"])
    rep2 = json.loads((run_dir / "privacy.json").read_text())
    assert rep2["epsilon"] == rep["epsilon"] <= rep2["max_epsilon"] and rep2["steps"] == rep["steps"]


def test_bad_budget_and_checkpoint_settings_are_refused(tmp_path, capsys):
    for override, name in [("privacy.max_epsilon=0", "privacy.max_epsilon"),
                           ("privacy.max_epsilon=-1", "privacy.max_epsilon"),
                           ("privacy.max_epsilon=inf", "privacy.max_epsilon"),
                           ("trainer.checkpoint_every=-5", "trainer.checkpoint_every")]:
        with pytest.raises(SystemExit):
            _run_inprocess(tmp_path / name, [*SMALL, override])
        assert name in capsys.readouterr().err
        assert not (tmp_path / name / "privacy.json").exists()


def test_resuming_a_finished_run_does_not_draw_its_interval_release_again(tmp_path):
    """A run with the default coefficient intervals (two private Newton steps after DP-SGD) that
    is resumed after it finished makes no second, unaccounted release: the resumed run takes no
    step, draws no interval noise, and its report says why there is no interval."""
    run_dir = tmp_path / "done"
    # two features, no dp/ curve: on ten features, or with the curve's released loss, the plan (issue 42)
    # finds no claimable interval at this noise and spends nothing on one
    small = [*(o for o in SMALL if not o.startswith("estimator.interval_share")), "data.n_features=2",
             "trainer.dp_curves=false"]
    _run_inprocess(run_dir, [*small, "privacy.noise_multiplier=1.0"])
    first = json.loads((run_dir / "privacy.json").read_text())
    assert first["estimator"]["intervals"].startswith("dpsgd + two private Newton steps")
    _run_inprocess(run_dir, [*small, "privacy.noise_multiplier=1.0", "trainer.resume=auto"])
    again = json.loads((run_dir / "privacy.json").read_text())
    assert again["steps"] == first["steps"] and again["resumed_from_step"] == first["steps"]
    assert again["estimator"]["intervals"].startswith("none computed (trainer.resume of a run that had finished")
    assert again["epsilon"] < first["epsilon"]  # DP-SGD's steps only: no second Gaussian release recorded
