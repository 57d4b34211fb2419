"""scripts/summarize_sweep.py on a hand-built multirun folder with known numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "summarize_sweep.py"
CAVEAT = (
    "Choosing the best run of this sweep is itself a use of the private data: "
    "no single run's epsilon covers that choice."
)


def _load_module():
    spec = importlib.util.spec_from_file_location("summarize_sweep", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_run(sweep: Path, *, target_eps, seed, eps, acc, loss, auc, model="logit",
               private=True, metrics=True, nonprivate_acc=0.85, majority=0.75):
    overrides = [f"experiment={model}"]
    if private:
        overrides.append(f"privacy.target_epsilon={target_eps}")
    else:
        overrides.append("privacy=none")
    overrides.append(f"seed={seed}")
    run = sweep / ",".join(overrides)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run / ".hydra" / "config.yaml").write_text(
        f"seed: {seed}\nmodel:\n  _target_: dptrain.models.{model}\nprivacy:\n  enabled: {str(private).lower()}\n"
    )
    if metrics:
        (run / "private").mkdir()
        (run / "private" / "metrics.json").write_text(json.dumps({
            "test/acc": acc, "test/loss": loss, "test/auc": auc,
            "baseline/nonprivate_acc": nonprivate_acc, "baseline/majority_acc": majority,
            "train/steps": 10,
        }))
    if private:
        privacy = {
            "private": True, "epsilon": eps, "delta": 1e-5, "accountant": "rdp",
            "epsilons": {"rdp": eps, "pld": eps * 0.9}, "noise_multiplier": 1.0 / target_eps,
            "target_epsilon": target_eps, "max_grad_norm": 1.0, "expected_batch_size": 100,
            "epochs": 1.0, "seed": seed, "data": "synthetic", "engine": "fast",
        }
    else:
        privacy = {"private": False, "seed": seed, "data": "synthetic", "engine": "fast",
                   "expected_batch_size": 100, "epochs": 1.0}
    (run / "privacy.json").write_text(json.dumps(privacy))
    return run


@pytest.fixture
def sweep(tmp_path):
    sw = tmp_path / "multirun"
    sw.mkdir()
    _write_run(sw, target_eps=0.5, seed=0, eps=0.49, acc=0.70, loss=0.60, auc=0.80)
    _write_run(sw, target_eps=0.5, seed=1, eps=0.51, acc=0.74, loss=0.50, auc=0.84)
    _write_run(sw, target_eps=2, seed=0, eps=1.98, acc=0.80, loss=0.40, auc=0.90)
    _write_run(sw, target_eps=2, seed=1, eps=2.00, acc=0.84, loss=0.44, auc=0.86)
    # an incomplete job folder: must be skipped with a warning naming it
    _write_run(sw, target_eps=8, seed=0, eps=8.0, acc=0.9, loss=0.3, auc=0.95, metrics=False)
    return sw


def test_summary_from_subprocess(sweep, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(sweep), "--out", str(out), "--no-diffprivlib"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "privacy.target_epsilon=8" in proc.stderr and "metrics.json" in proc.stderr

    table = pd.read_csv(out / "summary.csv")
    assert len(table) == 2
    table = table.sort_values("target_epsilon").reset_index(drop=True)
    assert list(table["n_seeds"]) == [2, 2]
    assert list(table["model"]) == ["logit", "logit"]
    assert list(table["accountant"]) == ["rdp", "rdp"]
    assert table["delta"].tolist() == [1e-5, 1e-5]
    assert table["target_epsilon"].tolist() == [0.5, 2.0]

    # hand-computed: mean, sample std (ddof=1) = |a - b| / sqrt(2), min, max
    s2 = math.sqrt(2)
    expected = [
        {"epsilon": 0.50, "test/acc": (0.72, 0.04 / s2, 0.70, 0.74),
         "test/loss": (0.55, 0.10 / s2, 0.50, 0.60), "test/auc": (0.82, 0.04 / s2, 0.80, 0.84)},
        {"epsilon": 1.99, "test/acc": (0.82, 0.04 / s2, 0.80, 0.84),
         "test/loss": (0.42, 0.04 / s2, 0.40, 0.44), "test/auc": (0.88, 0.04 / s2, 0.86, 0.90)},
    ]
    for i, exp in enumerate(expected):
        row = table.iloc[i]
        assert row["epsilon"] == pytest.approx(exp["epsilon"], abs=1e-12)
        for metric in ("test/acc", "test/loss", "test/auc"):
            mean, std, lo, hi = exp[metric]
            assert row[f"{metric}_mean"] == pytest.approx(mean, abs=1e-12)
            assert row[f"{metric}_std"] == pytest.approx(std, abs=1e-12)
            assert row[f"{metric}_min"] == pytest.approx(lo, abs=1e-12)
            assert row[f"{metric}_max"] == pytest.approx(hi, abs=1e-12)
        assert row["baseline/nonprivate_acc_mean"] == pytest.approx(0.85)
        assert row["baseline/majority_acc_mean"] == pytest.approx(0.75)

    md = (out / "summary.md").read_text()
    assert CAVEAT in md
    assert md.count("\n| logit |") == 2
    png = out / "summary.png"
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nonprivate_and_default_out(sweep, recwarn):
    mod = _load_module()
    _write_run(sweep, target_eps=None, seed=0, eps=None, acc=0.86, loss=0.35, auc=0.92,
               private=False)
    _write_run(sweep, target_eps=None, seed=1, eps=None, acc=0.88, loss=0.33, auc=0.93,
               private=False)
    assert mod.main([str(sweep), "--metric", "test/acc", "--no-diffprivlib"]) == 0
    assert any("privacy.target_epsilon=8" in str(w.message) for w in recwarn)
    table = pd.read_csv(sweep / "summary.csv")
    assert len(table) == 3
    nonpriv = table[~table["private"].astype(bool)]
    assert len(nonpriv) == 1
    assert nonpriv["epsilon"].isna().all()
    assert nonpriv["test/acc_mean"].iloc[0] == pytest.approx(0.87)
    assert int(nonpriv["n_seeds"].iloc[0]) == 2
    assert (sweep / "summary.png").stat().st_size > 1000
    # rerunning with outputs inside the sweep folder still works (files, not folders)
    assert mod.main([str(sweep), "--metric", "test/loss", "--no-diffprivlib"]) == 0
