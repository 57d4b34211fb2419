"""task=synthesize (issue 33): the preset runs with both synthesizers; the synthetic file has the
input's declared schema and domain; the report's epsilon is recomputed from its stages; the file
list and the private evaluation follow the run-folder rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dp_accounting
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.tasks import cli


def _run(tmp_path, *overrides: str):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=adult_synth", *overrides])
    run = tmp_path / "run"
    cli.run(cfg, run_dir=run)
    return run, json.loads((run / "privacy.json").read_text())


@pytest.mark.parametrize("method", ["mst", "mwem"])
def test_adult_synth_writes_a_file_with_the_declared_schema_and_its_epsilon_adds_up(tmp_path, method):
    run, report = _run(tmp_path, f"synthesize.method={method}", "synthesize.rounds=10")
    frame = pd.read_csv(run / "synthetic.csv", keep_default_na=False)
    domain = report["domain"]
    assert list(frame.columns) == list(domain) and abs(len(frame) - 48842) < 500 and len(frame) == report["rows"]
    assert set(frame["sex"]) <= set(domain["sex"]) and set(frame["income"]) <= set(domain["income"])
    assert frame["age"].between(17, 90).all() and frame["hours_per_week"].between(1, 99).all()
    rho = sum(s["rho"] for s in report["stages"])
    assert rho == pytest.approx(report["rho_budget"], rel=1e-9) and rho == pytest.approx(report["rho"])
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(rho))
    assert acc.get_epsilon(1e-6) == pytest.approx(report["epsilon"], rel=1e-9) and report["epsilon"] <= 1.0
    evaluation = json.loads((run / "private" / "evaluation.json").read_text())
    assert evaluation["mean_l1_2way"] < 0.2 and evaluation["mean_l1_3way"] < 0.35  # uniform: 1.45 / 1.68
    files = (run / "FILES.txt").read_text()
    assert "synthetic.csv" in files.split("PRIVATE")[0] and "evaluation.json" in files.split("PRIVATE")[1]


def test_bad_settings_are_refused_by_name(tmp_path, capsys):
    for override, needle in (("synthesize.method=gan", "synthesize.method"), ("privacy.delta=0.1", "privacy.delta"),
                             ("synthesize.workload=4", "synthesize.workload")):
        with pytest.raises(SystemExit) as stop:
            _run(tmp_path, override)
        assert stop.value.code == 2 and needle in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_model_trains_on_the_synthetic_file_with_the_written_data_config(tmp_path):
    """Closing the loop: RUN/conf/data/synthetic_release.yaml is data=table on synthetic.csv with the
    input's declared schema; training on it is post-processing of the synthetic release."""
    run, _ = _run(tmp_path)
    out = subprocess.run([sys.executable, "-m", "dptrain", "--config-dir", str(run / "conf"), "experiment=logit",
                          "data=synthetic_release", "privacy.enabled=false", "trainer.progress=false",
                          f"hydra.run.dir={tmp_path / 'trained'}"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = json.loads((tmp_path / "trained" / "private" / "metrics.json").read_text())
    assert metrics["test/acc"] > 0.6, metrics  # held-out SYNTHETIC rows; the study tests on real test rows
