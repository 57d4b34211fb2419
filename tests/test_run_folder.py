"""One writer per run folder, a report that names the files it covers, and a graceful stop
(issue 35). Unit tests of the lock and the digests here; whole runs at the end of the file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dptrain.runfolder import runlock, verify
from dptrain.runfolder.stopping import EXIT_STOPPED

# ------------------------------------------------------------------------------ the lock


def _hold_in_child(folder: Path) -> subprocess.Popen:
    """A second process that takes the folder's lock and waits for a line on stdin."""
    code = textwrap.dedent(f"""
        import sys
        from dptrain.runfolder import runlock
        runlock.acquire({str(folder)!r})
        print("held", flush=True)
        sys.stdin.readline()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_process_is_refused_naming_the_folder_and_owner(tmp_path):
    folder = tmp_path / "run"
    child = _hold_in_child(folder)
    try:
        with pytest.raises(runlock.RunFolderBusy) as err:
            runlock.acquire(folder)
        msg = str(err.value)
        assert str(folder.resolve()) in msg and f"pid {child.pid}" in msg and "nothing was written" in msg
    finally:
        child.communicate("\n")
    lock = runlock.acquire(folder)  # the owner ended: free again
    try:
        assert lock.took_over is None  # it ended cleanly: its lock file was removed
    finally:
        lock.release()


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_message(tmp_path):
    folder = tmp_path / "run"
    child = _hold_in_child(folder)
    child.kill()
    child.wait()
    lock = runlock.acquire(folder)
    try:
        assert lock.took_over and f"pid {child.pid}" in lock.took_over
        assert "took over the lock left by" in runlock.took_over_message(lock)
    finally:
        lock.release()
    assert not (folder / runlock.LOCK_NAME).exists()  # released: removed


def test_the_same_process_may_take_its_own_lock_again(tmp_path):
    a = runlock.acquire(tmp_path)
    try:
        assert runlock.acquire(tmp_path) is a
    finally:
        a.release()


# ------------------------------------------------------------------------------ digests


def test_verify_reports_ok_changed_and_missing(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"weights")
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("a: 1\n")
    files = verify.expand_publishable(tmp_path, ["model.pt", ".hydra/", "FILES.txt", "absent.csv"])
    assert files == [".hydra/config.yaml", "model.pt"]
    (tmp_path / "privacy.json").write_text(json.dumps({"sha256": verify.digests(tmp_path, files)}))
    rows, ok = verify.verify_run(tmp_path)
    assert ok and {r[0] for r in rows} == set(files)
    (tmp_path / "model.pt").write_bytes(b"weightS")
    rows, ok = verify.verify_run(tmp_path)
    assert not ok and dict((r[0], r[1]) for r in rows)["model.pt"] == "CHANGED"
    (tmp_path / "model.pt").unlink()
    assert dict((r[0], r[1]) for r in verify.verify_run(tmp_path)[0])["model.pt"] == "MISSING"


def test_verify_without_digests_fails(tmp_path):
    rows, ok = verify.verify_run(tmp_path)
    assert not ok and rows[0][1] == "NO DIGESTS"
    assert verify.main([str(tmp_path)]) == verify.EXIT_MISMATCH
    assert verify.main([str(tmp_path / "absent")]) == 2


def test_manifest_digest_lines_round_trip(tmp_path):
    digests = {"model.pt": "a" * 64, "privacy.json": "b" * 64}
    (tmp_path / "FILES.txt").write_text("Files\n" + "\n".join(verify.manifest_lines(digests)) + "\n")
    assert verify.read_manifest_digests(tmp_path) == digests


def test_no_lock_module_state_leaks_between_tests():
    assert not runlock._HELD, runlock._HELD
    assert os.environ.get("DPTRAIN_TEST_NEVER_SET") is None


# ------------------------------------------------------------------------------ whole runs

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["experiment=logit", "data=synthetic", "data.n_rows=3000", "trainer.batch_size=100", "trainer.progress=false",
         "trainer.baseline=false", "logger.tensorboard=false"]


def _launch(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.Popen([sys.executable, "-m", "dptrain", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _wait_for_line(proc: subprocess.Popen, needle: str) -> list[str]:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} never printed; stdout: {''.join(seen)}; stderr: {proc.stderr.read()}")


def test_two_runs_into_one_folder_one_refuses_and_verify_holds(tmp_path):
    """Issue 35: two runs with the same hydra.run.dir used to interleave (overrides saying sigma
    2.6, privacy.json saying 0.8). Now the second refuses before writing anything; the folder
    holds the first run's files only; `dptrain verify` passes on it and fails once model.pt is
    edited by hand. (The first run is paused with SIGSTOP while the second starts, so the test
    does not depend on how long either takes.)"""
    folder = tmp_path / "run"
    first = _launch([*QUICK, "trainer.epochs=3", "privacy.noise_multiplier=2.6", f"hydra.run.dir={folder}"])
    _wait_for_line(first, "engine=")  # it holds the lock and is training
    first.send_signal(signal.SIGSTOP)
    try:
        second = _launch([*QUICK, "trainer.epochs=9", "privacy.noise_multiplier=0.8", f"hydra.run.dir={folder}"])
        out, err = second.communicate()
        assert second.returncode == 2, (out, err)
        assert "is in use by pid" in err and str(folder.resolve()) in err and f"pid {first.pid}" in err
    finally:
        first.send_signal(signal.SIGCONT)
    first.communicate()
    assert first.returncode == 0
    report = json.loads((folder / "privacy.json").read_text())
    assert report["noise_multiplier"] == 2.6
    overrides = (folder / ".hydra" / "overrides.yaml").read_text()
    assert "noise_multiplier=2.6" in overrides and "0.8" not in overrides
    assert {"model.pt", "metrics.json", ".hydra/overrides.yaml", "privacy.txt"} <= set(report["sha256"])
    check = subprocess.run([sys.executable, "-m", "dptrain", "verify", str(folder)], cwd=ROOT, text=True,
                           capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok         model.pt" in check.stdout
    model = folder / "model.pt"
    model.write_bytes(model.read_bytes()[:-1] + bytes([model.read_bytes()[-1] ^ 1]))
    rows, ok = verify.verify_run(folder)
    assert not ok and dict((r[0], r[1]) for r in rows)["model.pt"] == "CHANGED"
    assert dict((r[0], r[1]) for r in rows)["privacy.json"] == "ok"  # FILES.txt vouches for the report


def test_sigterm_mid_run_checkpoints_and_resume_reaches_the_same_epsilon(tmp_path):
    """Issue 35: SIGTERM ended a run with exit 143 and at most the last periodic checkpoint. Now
    the step in progress finishes, a checkpoint of it is written, the message names the resume
    command, nothing publishable is written, and resuming ends with the epsilon of an
    uninterrupted run."""

    folder = tmp_path / "run"
    args = [*QUICK, "trainer.epochs=20", "trainer.checkpoint_every=0", "privacy.noise_multiplier=1.0"]
    proc = _launch([*args, f"hydra.run.dir={folder}"])
    _wait_for_line(proc, "engine=")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate()
    assert proc.returncode == EXIT_STOPPED, (out, err)
    state = torch.load(folder / "private" / "checkpoint.pt", weights_only=False)
    planned = int(err.split(f"after step {state['step']} of ")[1].split(";")[0])
    assert 1 <= state["step"] < planned
    assert f"stopped by SIGTERM after step {state['step']} of {planned}; checkpoint written" in err
    resume = [line for line in err.splitlines() if "resume with:" in line]
    assert resume and "trainer.resume=auto" in resume[0] and f"hydra.run.dir={folder}" in resume[0]
    assert not (folder / "privacy.json").exists() and not (folder / "model.pt").exists()
    done = _launch([*args, "trainer.resume=auto", f"hydra.run.dir={folder}"])
    whole = _launch([*args, f"hydra.run.dir={tmp_path / 'whole'}"])
    for proc in (done, whole):
        out, err = proc.communicate()
        assert proc.returncode == 0, err
    resumed, uninterrupted = (json.loads((d / "privacy.json").read_text()) for d in (folder, tmp_path / "whole"))
    assert resumed["steps"] == uninterrupted["steps"] == planned
    assert resumed["epsilons"] == uninterrupted["epsilons"]
