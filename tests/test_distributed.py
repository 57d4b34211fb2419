"""One DP-SGD job across 2 processes (torchrun, gloo on CPU): the mechanism and the accounting
are the single-process ones (issue 7: noise once across all workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
RUN = ["experiment=logit", "estimator.interval_share=0", "trainer.epochs=5", "trainer.progress=false",
       "trainer.threads=1"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1"}


def test_noise_once_per_job_and_ranks_agree(tmp_path):
    out = tmp_path / "dist.json"
    res = subprocess.run([*TORCHRUN, str(REPO / "tests" / "_dist_worker.py"), str(out)], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["world_size"] == 2
    # noise sd on zero-gradient steps equals sigma*C/B (chi-square interval for the variance);
    # noise added on every rank would give sqrt(2) times that
    n, sd, expected = r["noise_n"], r["noise_std"], r["expected_std"]
    lo, hi = (stats.chi2.ppf([0.0005, 0.9995], n - 1) / (n - 1)) ** 0.5 * expected
    assert lo < sd < hi, (sd, expected)
    assert sd < expected * 2**0.5 * 0.9  # far from the per-rank-noise value
    assert abs(r["noise_mean"]) < 5 * expected / n**0.5
    assert r["noise_same_on_all_ranks"] and r["grads_equal"]
    # rank-specific Poisson streams, each shard sampled at q
    assert r["first_batches_differ"]
    for rate in r["inclusion_rates"]:
        assert rate == pytest.approx(0.02, rel=0.03)


@pytest.mark.slow  # 23 s of the fast suite; CI runs it with -m slow
def test_two_process_run_matches_single_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    res1 = subprocess.run([sys.executable, "-m", "dptrain", *RUN, f"hydra.run.dir={one}"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert res1.returncode == 0, res1.stderr[-3000:]
    res2 = subprocess.run([*TORCHRUN, "-m", "dptrain", *RUN, "trainer.distributed=true", f"hydra.run.dir={two}"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert res2.returncode == 0, res2.stderr[-3000:]
    p1, p2 = (json.loads((d / "privacy.json").read_text()) for d in (one, two))
    m1, m2 = (json.loads((d / "private" / "metrics.json").read_text()) for d in (one, two))
    assert p2["epsilon"] == p1["epsilon"] and p2["epsilons"] == p1["epsilons"]
    for key in ("sample_rate", "noise_multiplier", "steps", "dataset_size", "expected_batch_size"):
        assert p2[key] == p1[key]
    assert p2["distributed"]["world_size"] == 2 and "once per step" in p2["distributed"]["reduction"]
    assert p1["distributed"] is None
    assert m2["test/acc"] == pytest.approx(m1["test/acc"], abs=0.01)
    assert m2["test/acc"] > 0.83
    # only rank 0 wrote: one log, one event file, one checkpoint
    assert len(list((two / "private" / "tb").glob("events.out.tfevents.*"))) == 1
    assert (two / "private" / "checkpoint.pt").is_file()
    assert "rank 1 of 2" in res2.stdout + res2.stderr


def test_distributed_without_torchrun_is_refused(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dptrain", *RUN, "trainer.distributed=true",
                          f"hydra.run.dir={tmp_path}"], cwd=REPO, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2
    assert "trainer.distributed=true is not allowed" in res.stderr and "torchrun" in res.stderr
    assert not (tmp_path / "privacy.json").exists()


@pytest.mark.slow  # several whole runs in subprocesses (25-45 s): CI runs it with -m slow
def test_two_process_resume_continues_every_ranks_stream(tmp_path):
    """With reproducible noise (a secret seed file), a budget stops a 2-process run early;
    resuming it without the budget must end exactly where an uninterrupted 2-process run ends
    (every rank's sampler state is checkpointed). Default runs store no stream state."""
    import torch

    from dptrain.privacy.randomness import new_seed_file
    from dptrain.training.checkpoint import checkpoint_path_in, load_checkpoint

    full, part = tmp_path / "full", tmp_path / "part"
    key = new_seed_file(tmp_path / "noise.key")
    base = [*TORCHRUN, "-m", "dptrain", *RUN, "trainer.distributed=true", "trainer.baseline=false",
            f"privacy.noise_seed_file={key}"]
    for args in ([f"hydra.run.dir={full}"], [f"hydra.run.dir={part}", "privacy.max_epsilon=0.5"],
                 [f"hydra.run.dir={part}", "trainer.resume=auto"]):
        res = subprocess.run([*base, *args], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
    a, b = load_checkpoint(checkpoint_path_in(full)), load_checkpoint(checkpoint_path_in(part))
    rep = json.loads((part / "privacy.json").read_text())
    assert 0 < rep["resumed_from_step"] < rep["steps"] == a["step"] == b["step"]
    assert len(b["rng"]["samplers"]) == 2
    for name, t in a["model"].items():
        torch.testing.assert_close(b["model"][name], t, rtol=1e-6, atol=1e-7)
