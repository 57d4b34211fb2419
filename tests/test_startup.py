"""Start-up and exit of the command line (docs/performance.md): what is imported when, and what
the fast exit keeps. No timing is measured here (scripts/bench_startup.py does that): the tests
check which modules a process imported and what it wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the heavy libraries only some runs need, imported at the named boundaries of tests/test_structure.py
#: (LAZY_THIRD_PARTY): a command line does not import them before its task needs them. torch, pandas
#: and numpy are imported by every command line (one import graph: every task is imported up front).
HEAVY = ("scipy", "sklearn", "dp_accounting", "opacus", "tensorboard", "matplotlib")


def _env(**extra: str) -> dict[str, str]:
    """This checkout first on the path (the subprocess must import the dptrain under test)."""
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    env.pop("DPTRAIN_FULL_EXIT", None)
    return {**env, **extra}


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(**env), capture_output=True, text=True,
                          timeout=300)


def _imported_modules(stderr: str) -> set[str]:
    """The modules a process imported, from its ``-X importtime`` lines."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "self [us]" not in line}


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


# ------------------------------------------------------------------------------ lazy imports


@pytest.mark.parametrize("module", ["dptrain.tasks.cli", "dptrain.privacy.accounting", "dptrain.runfolder.tracking",
                                    "dptrain.privacy.report", "dptrain.settings.release"])
def test_importing_the_command_line_and_its_config_pulls_in_no_heavy_library(module):
    """The command line (every task), the schemas it registers and the accounting registry import
    none of scipy, scikit-learn, dp-accounting, opacus, TensorBoard, matplotlib: the run
    that needs one imports it."""
    res = _python(f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))")
    assert res.returncode == 0, res.stderr[-2000:]
    assert _heavy(set(json.loads(res.stdout))) == []


def test_a_refused_command_line_imports_no_heavy_library_and_still_exits_2(tmp_path):
    """A key the schema does not have is refused by the light first check (dptrain.settings.launch),
    before the tasks, torch, pandas and any library a run may need (dp-accounting, opacus, scipy...)
    are imported; the exit status and the message are those of a normal exit, nothing is written."""
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "dptrain", "experiment=logit", "+bogus=1",
                          f"hydra.run.dir={run}"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert "dptrain: error: bogus: not a setting of task=train" in res.stderr
    imported = _imported_modules(res.stderr)
    assert "dptrain.settings.launch" in imported and "hydra" in imported
    assert "dptrain.tasks.cli" not in imported and not imported & {"torch", "pandas"}
    assert _heavy(imported) == []
    assert not run.exists()


def test_predict_offers_the_names_it_always_offered():
    """dptrain.tasks.predict (a task module: nothing but the command line imports it) offers the names
    it always offered, the same objects as their homes'."""
    import dptrain.data.files
    import dptrain.runfolder.tracking
    import dptrain.tasks.predict as predict

    assert predict.MODEL_FILENAME == dptrain.runfolder.tracking.MODEL_FILENAME
    assert predict.model_path_in is dptrain.runfolder.tracking.model_path_in
    assert predict.DataError is dptrain.data.files.DataError
    assert callable(predict.load_model)
    with pytest.raises(AttributeError):
        predict.no_such_name  # noqa: B018


def test_accounting_results_do_not_depend_on_what_was_imported_first():
    """dptrain.privacy.accounting imports dp-accounting, numpy and the events module when it
    first composes an event: a fresh interpreter that starts with the accounting module gives the
    same epsilons (RDP, PLD, the RDP floor, a calibration) as one that imported dp-accounting and
    the events first, and as dp-accounting's own RdpAccountant."""
    code = """
import json, sys
if sys.argv[1] == "eager":
    import dp_accounting, numpy, dptrain.privacy.events  # noqa: F401
from dptrain.privacy import accounting as a
out = {"rdp": a.rdp_epsilon(sample_rate=0.03, noise_multiplier=1.1, steps=300, delta=1e-5),
       "pld": a.pld_epsilon(sample_rate=0.03, noise_multiplier=1.1, steps=300, delta=1e-5),
       "floor": a.rdp_floor(1e-5),
       "sigma": a.calibrate_noise_multiplier(target_epsilon=1.0, sample_rate=0.03, steps=300, delta=1e-5)}
import dp_accounting
from dp_accounting import rdp
acc = rdp.RdpAccountant(list(a.RDP_ORDERS))
acc.compose(dp_accounting.PoissonSampledDpEvent(0.03, dp_accounting.GaussianDpEvent(1.1)), 300)
out["dp_accounting_rdp"] = acc.get_epsilon(1e-5)
print(json.dumps(out))
"""
    lazy = subprocess.run([sys.executable, "-c", code, "lazy"], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300)
    eager = subprocess.run([sys.executable, "-c", code, "eager"], cwd=REPO, env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert lazy.returncode == 0 and eager.returncode == 0, (lazy.stderr[-2000:], eager.stderr[-2000:])
    a, b = json.loads(lazy.stdout), json.loads(eager.stdout)
    assert a == b
    assert a["rdp"] == pytest.approx(a["dp_accounting_rdp"], rel=1e-12)


def test_rdp_floor_is_the_conversion_at_zero_divergence():
    """rdp_floor passes a list of zeros instead of np.zeros (no numpy import for the constant):
    the same value, bit for bit."""
    import numpy as np

    from dptrain.privacy.accounting import RDP_ORDERS, rdp_floor, rdp_to_epsilon

    for delta in (1e-3, 1e-5, 1e-9):
        assert rdp_floor(delta) == rdp_to_epsilon(np.zeros(len(RDP_ORDERS)), delta)


def test_openblas_threads_sleep_while_waiting_unless_the_user_says_otherwise():
    """Like OMP_WAIT_POLICY (tests/test_first_hour.py): importing dptrain sets
    OPENBLAS_THREAD_TIMEOUT=4 before numpy loads OpenBLAS, and keeps an explicit value."""
    code = "import os, dptrain, numpy; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    env = {k: v for k, v in _env().items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "OPENBLAS_THREAD_TIMEOUT": "28"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "28"


# ------------------------------------------------------------------------------ the fast exit

_EXIT = """
import atexit, os, sys, threading, time
from dptrain.tasks.cli import exit_now

class Teardown:  # prints only if the interpreter tears its objects down
    def __del__(self, write=os.write):
        write(1, b"teardown\\n")

keep = Teardown()
atexit.register(lambda: print("atexit ran", flush=True))
mode = sys.argv[1]
if mode == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished", flush=True))).start()
print("buffered output", end="")
sys.stderr.write("buffered error")
code = {"int": 3, "none": None, "text": "a message", "thread": 4}[mode]
exit_now(code)
"""


def _exit_run(mode: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _EXIT, mode], cwd=REPO, env=_env(**env), capture_output=True,
                          text=True, timeout=120)


def test_exit_now_runs_atexit_flushes_output_and_keeps_the_status_but_skips_teardown():
    res = _exit_run("int")
    assert res.returncode == 3
    assert res.stdout == "buffered outputatexit ran\n"  # flushed, atexit handlers run, no teardown
    assert res.stderr == "buffered error"
    assert _exit_run("none").returncode == 0
    text = _exit_run("text")
    assert text.returncode == 1 and text.stderr == "buffered errora message\n"  # as SystemExit("a message")


def test_exit_now_falls_back_to_a_normal_exit_when_it_may_not_skip_the_teardown():
    """A thread the interpreter would wait for, or DPTRAIN_FULL_EXIT=1: a normal SystemExit
    (the thread finishes, the objects are torn down), with the same status."""
    res = _exit_run("thread")
    assert res.returncode == 4
    assert "thread finished" in res.stdout and "atexit ran" in res.stdout and "teardown" in res.stdout
    full = _exit_run("int", DPTRAIN_FULL_EXIT="1")
    assert full.returncode == 3 and "atexit ran" in full.stdout and "teardown" in full.stdout


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _without_timings(name: str, data: bytes, run: Path) -> object:
    """A file's content with the run folder's name, timings and wall-clock stamps taken out."""
    if name.endswith(".json"):  # file digests: .hydra/hydra.yaml names the run folder (tests/test_run_folder.py)
        return {k: v for k, v in json.loads(data).items() if not k.startswith("time/") and k != "sha256"}
    text = re.sub(r"\b[0-9a-f]{64}\b", "DIGEST", data.decode("utf-8", errors="replace").replace(str(run), "RUN"))
    text = re.sub(r"^\[[^\]]*\]", "", text, flags=re.M)  # log time stamps
    return re.sub(r"train loop: [0-9.]+ s", "train loop: T s", text)


@pytest.mark.slow  # several whole runs in subprocesses (25-45 s): CI runs it with -m slow
def test_a_run_ended_by_the_fast_exit_writes_what_a_full_exit_writes(tmp_path):
    """The same small run (reproducible noise: a seed file) with the fast exit and with
    DPTRAIN_FULL_EXIT=1: the same exit status, the same console output, the same files with the
    same content (timings and time stamps aside; model, checkpoint and TensorBoard files by
    size), the log complete up to its last line."""
    key = tmp_path / "noise.key"
    made = subprocess.run([sys.executable, "-m", "dptrain.privacy.randomness", str(key)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    runs = {}
    for mode, env in (("fast", {}), ("full", {"DPTRAIN_FULL_EXIT": "1"})):
        run = tmp_path / mode
        res = subprocess.run([sys.executable, "-m", "dptrain", "experiment=logit", "data=synthetic",
                              "data.n_rows=2000", "trainer.epochs=1", "trainer.batch_size=200",
                              "trainer.progress=false", f"privacy.noise_seed_file={key}", f"hydra.run.dir={run}"],
                             cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[mode] = (run, res)
    (fast, fast_res), (full, full_res) = runs["fast"], runs["full"]
    a, b = _files(fast), _files(full)
    assert [re.sub(r"tfevents\..*", "", n) for n in a] == [re.sub(r"tfevents\..*", "", n) for n in b]
    for (name, x), y in zip(a.items(), b.values()):
        if name.endswith((".pt",)) or "tfevents" in name:
            assert len(x) == len(y), name
        elif not name.endswith("hydra.yaml"):  # hydra.yaml: the run folder's own name
            assert _without_timings(name, x, fast) == _without_timings(name, y, full), name
    assert "train loop:" in (fast / "private" / "dptrain.log").read_text().splitlines()[-1]
    assert _without_timings("out", fast_res.stdout.encode(), fast) == _without_timings("out", full_res.stdout.encode(),
                                                                                       full)


@pytest.mark.slow  # one whole run in a subprocess (~10 s)
def test_a_whole_run_imports_no_compiler_and_no_second_process(tmp_path):
    """`python -m dptrain experiment=logit` without a baseline imports neither torch._dynamo
    (dptrain.models.optimizers) nor scikit-learn (the ROC AUC is numpy's): with the accounting worker
    gone, the run's process does all of its work (tests/test_structure.py: no module forks)."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "dptrain", "experiment=logit",
                          "trainer.progress=false", "trainer.baseline=false", "trainer.epochs=0.2",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    imported = _imported_modules(res.stderr)
    assert "torch" in imported and "torch._dynamo" not in imported
    assert not {m for m in imported if m == "sklearn" or m.startswith("sklearn.")}
    assert (tmp_path / "run" / "privacy.json").is_file()

