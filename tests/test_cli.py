"""Config composition, bad input refused by name, and end-to-end runs read back from disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dptrain.settings.train import Config
from dptrain.tasks import cli
from dptrain.tasks.registry import validate

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
SMALL = ["data=synthetic", "data.n_rows=3000", "trainer.epochs=2", "trainer.batch_size=100",
         "trainer.progress=false", "trainer.baseline=true", "trainer.eval_every=20"]


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_preset_composes_and_validates(name):
    cfg = _compose([f"experiment={name}"])
    conf: Config = OmegaConf.to_object(cfg)
    validate(conf)
    if conf.task in ("train", "audit", "tune"):
        assert conf.model["_target_"].startswith("dptrain.models.networks.")
    elif conf.task == "release":
        assert conf.data.name in ("atlas", "table")
    else:  # the one-shot releases
        assert conf.task in ("tabulate", "synthesize", "topdown", "lodes")


def test_presets_exist():
    assert {"logit", "mlp", "logit_nonprivate"} <= set(EXPERIMENTS)
    cfg = _compose(["experiment=mlp"])
    assert cfg.model.hidden and cfg.model.activation
    assert _compose(["experiment=logit_nonprivate"]).privacy.enabled is False


@pytest.mark.parametrize(
    "override",
    ["privacy.nois_multiplier=1", "trainer.epochs=abc", "trainer.batch_size=1.5", "bogus=1",
     "data.numeric.age.lowr=3", "privacy.enabled=maybe"],
)
def test_unknown_keys_and_wrong_types_fail_at_compose(override):
    with pytest.raises(ConfigCompositionException):
        _compose(["experiment=logit", override])


def _run_inprocess(overrides: list[str], run_dir: Path) -> float:
    cfg = _compose(overrides)
    return cli.run(cfg, run_dir=run_dir)


BAD = [
    (["privacy.noise_multiplier=-1"], "privacy.noise_multiplier"),
    (["privacy.noise_multiplier=nan"], "privacy.noise_multiplier"),
    (["privacy.max_grad_norm=0"], "privacy.max_grad_norm"),
    (["privacy.max_grad_norm=-2"], "privacy.max_grad_norm"),
    (["privacy.delta=0"], "privacy.delta"),
    (["privacy.delta=0.001"], "privacy.delta"),  # >= 1/N for N = 2250
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=0"], "privacy.target_epsilon"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=-1"], "privacy.target_epsilon"),
    (["privacy.target_epsilon=1", "privacy.noise_multiplier=1"], "set exactly one"),
    (["privacy.noise_multiplier=null"], "set exactly one"),
    (["trainer.batch_size=0"], "trainer.batch_size"),
    (["trainer.batch_size=100000"], "trainer.batch_size"),
    (["trainer.epochs=0"], "trainer.epochs"),
    (["trainer.epochs=-1"], "trainer.epochs"),
    (["++data.categorical={c: []}"], "data.categorical"),  # data=synthetic has no categorical columns
    (["privacy.accountant=moments"], "privacy.accountant"),
]


@pytest.mark.parametrize("extra,needle", BAD)
def test_bad_input_refused_by_name(extra, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _run_inprocess(["experiment=logit", *SMALL, *extra], tmp_path)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert not (tmp_path / "privacy.json").exists()
    assert not (tmp_path / "metrics.json").exists()


def test_bad_table_inputs_refused(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    with pytest.raises(SystemExit):
        _run_inprocess(["experiment=logit", "data=table", f"data.path={missing}", "data.target=y",
                        "++data.numeric={a: {lower: 0, upper: 1}}"], tmp_path)
    err = capsys.readouterr().err
    assert "data.path" in err and "nope.csv" in err
    table = tmp_path / "t.csv"
    table.write_text("a,b,y\n0.5,x,1\n0.25,y,0\n" * 50)
    with pytest.raises(SystemExit):
        _run_inprocess(["experiment=logit", "data=table", f"data.path={table}", "data.target=income",
                        "++data.numeric={a: {lower: 0, upper: 1}}"], tmp_path)
    assert "income" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run_inprocess(["experiment=logit", "data=table", f"data.path={table}", "data.target=y",
                        "++data.numeric={b: {lower: 0, upper: 1}}"], tmp_path)
    assert "b" in capsys.readouterr().err
    assert not (tmp_path / "privacy.json").exists()


def _read_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_end_to_end_private_run(tmp_path):
    import dp_accounting

    acc = _run_inprocess(["experiment=logit", *SMALL, "privacy.noise_multiplier=1.1", "trainer.baseline=true",
                          "estimator.interval_share=0"],
                         tmp_path)
    metrics = json.loads((tmp_path / "private" / "metrics.json").read_text())
    published = json.loads((tmp_path / "metrics.json").read_text())
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert metrics["test/acc"] == acc
    for key in ("test/acc", "test/loss", "baseline/nonprivate_acc", "train/steps", "time/train_seconds"):
        assert key in metrics
    # the publishable metrics: never the baseline fitted without privacy, never timings
    assert "baseline/nonprivate_acc" not in published and "time/train_seconds" not in published
    assert published["privacy/epsilon"] == privacy["epsilon"] and published["train/steps"] == metrics["train/steps"]
    n = privacy["dataset_size"]
    assert 2100 < n < 2400  # about 75 % of 3000 synthetic rows (per-row split)
    assert privacy["sample_rate"] == pytest.approx(100 / n)
    assert privacy["steps"] == metrics["train/steps"] == round(2 / (100 / n))
    assert privacy["neighbours"] == "add/remove" and privacy["sampling"] == "poisson"
    assert privacy["accountant"] == "rdp" and privacy["noise_multiplier"] == 1.1
    assert privacy["delta"] == 1e-5 and privacy["seed"] == 0 and privacy["not_covered"]
    # headline epsilon agrees with an independent dp-accounting RDP computation: the T steps, K of
    # which (every 10th and the last) also released the dp/ curve on their batch (one Gaussian of
    # noise multiplier (sigma^-2 + sigma_c^-2)^(-1/2): docs/privacy.md, "DP curves")
    q, sigma, T = privacy["sample_rate"], privacy["noise_multiplier"], privacy["steps"]
    K = sum(1 for s in range(1, T + 1) if s % 10 == 0 or s == T)
    sigma_c = privacy["dp_curves"]["noise_multiplier"]
    assert privacy["dp_curves"]["releases"] == K
    ref = dp_accounting.rdp.RdpAccountant()
    ref.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), T - K)
    ref.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(
        1 / np.sqrt(sigma**-2 + sigma_c**-2))), K)
    assert privacy["epsilon"] == pytest.approx(ref.get_epsilon(privacy["delta"]), rel=1e-3)
    assert privacy["epsilons"]["pld"] < privacy["epsilons"]["rdp"] == privacy["epsilon"]
    assert metrics["test/acc"] > metrics["baseline/majority_acc"] + 0.1  # learns the synthetic model
    text = (tmp_path / "privacy.txt").read_text()
    assert "add/remove" in text and "NOT covered" in text and "rdp" in text
    scalars = _read_scalars(tmp_path / "private" / "tb")
    assert "test/acc" in scalars and scalars["test/acc"][-1][1] == pytest.approx(metrics["test/acc"])
    eps_curve = scalars["privacy/epsilon"]
    assert [v for _, v in eps_curve] == sorted(v for _, v in eps_curve)
    assert eps_curve[-1][1] == pytest.approx(privacy["epsilons"]["rdp"], rel=1e-5)
    assert "diagnostics_nonprivate/train_loss" in scalars
    assert [s for s, _ in scalars["dp/train_loss"]] == [s for s in range(1, T + 1) if s % 10 == 0 or s == T]
    assert not any(t.startswith("train/") for t in scalars)  # private-data metrics are marked


def test_target_epsilon_calibrates_sigma(tmp_path, caplog):
    caplog.set_level("INFO")
    _run_inprocess(["experiment=logit", *SMALL, "privacy.target_epsilon=2.0"], tmp_path)
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["noise_multiplier_source"] == "calibrated"
    assert privacy["target_epsilon"] == 2.0
    assert 2.0 * (1 - 5e-3) <= privacy["epsilon"] <= 2.0
    assert f"calibrated noise_multiplier={privacy['noise_multiplier']:.6g}" in caplog.text


def test_nonprivate_run_says_so(tmp_path):
    _run_inprocess(["experiment=logit_nonprivate", *SMALL], tmp_path)
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["private"] is False and "epsilon" not in privacy
    assert "NOT differentially private" in privacy["guarantee"]
    assert "privacy/epsilon" not in _read_scalars(tmp_path / "private" / "tb")


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "dptrain", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # 30 s of the fast suite; CI runs it with -m slow
def test_cli_subprocess_run_and_sweep(tmp_path):
    res = _cli(["experiment=logit", *SMALL, f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "test accuracy" in res.stdout and "epsilon" in res.stdout
    run = tmp_path / "run"
    for name in ("metrics.json", "privacy.json", "privacy.txt", "model.pt", "FILES.txt", ".hydra/config.yaml",
                 "private/tb", "private/metrics.json", "private/checkpoint.pt", "private/dptrain.log"):
        assert (run / name).exists(), name
    assert not list(run.glob("*.log"))  # the log is private
    sweep = _cli(["-m", "experiment=logit", *SMALL, "trainer.epochs=0.5", "trainer.baseline=false",
                  "privacy.noise_multiplier=0.5,2", f"hydra.sweep.dir={tmp_path}/sweep"], tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    folders = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert len(folders) == 2 and all("privacy.noise_multiplier=" in f for f in folders)
    eps = [json.loads((tmp_path / "sweep" / f / "privacy.json").read_text())["epsilon"] for f in folders]
    assert eps[0] > eps[1]  # sigma 0.5 spends more than sigma 2
    bad = _cli(["experiment=logit", *SMALL, "privacy.max_grad_norm=0", f"hydra.run.dir={tmp_path}/bad"], tmp_path)
    assert bad.returncode != 0 and "privacy.max_grad_norm" in bad.stderr
    assert not (tmp_path / "bad" / "privacy.json").exists()
    typo = _cli(["experiment=logit", "privacy.nois_multiplier=1", f"hydra.run.dir={tmp_path}/typo"], tmp_path)
    assert typo.returncode != 0 and "nois_multiplier" in typo.stderr


def test_readme_main_command_meets_its_promise(tmp_path):
    """`python -m dptrain experiment=logit` (the README's command): acc >= 0.84 at eps <= 1."""
    res = _cli(["experiment=logit", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "private" / "metrics.json").read_text())
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert metrics["test/acc"] >= 0.84
    assert privacy["epsilon"] <= 1.0 and privacy["delta"] <= 1e-5
    assert privacy["epsilons"]["pld"] < privacy["epsilon"]
    assert "baseline/nonprivate_acc" not in metrics  # opt-in (trainer.baseline=true): the README says so
    assert metrics["test/acc"] > metrics["baseline/majority_acc"] + 0.05
    assert metrics["time/train_seconds"] < 60


def test_readme_own_data_example(tmp_path):
    """The README's `data=table` example, on a generated Parquet file with those columns."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 3000
    df = pd.DataFrame({
        "age": rng.integers(17, 91, n), "hours": rng.integers(1, 100, n),
        "sex": rng.choice(["Female", "Male"], n), "region": rng.choice(["North", "South", "East", "West", "?"], n),
    })
    df["income"] = np.where(df.age + 10 * (df.sex == "Male") + rng.normal(0, 10, n) > 55, ">50K", "<=50K")
    df.to_parquet(tmp_path / "people.parquet")
    res = _cli(["experiment=logit", "data=table", "data.path=people.parquet", "data.target=income",
                'data.positive=">50K"', 'data.negative="<=50K"',
                "++data.numeric={age: {lower: 17, upper: 90}, hours: {lower: 1, upper: 99}}",
                "++data.categorical={sex: [Female, Male], region: [North, South, East, West]}",
                "trainer.batch_size=100", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    metrics = json.loads((tmp_path / "run" / "private" / "metrics.json").read_text())
    assert 2100 < privacy["dataset_size"] < 2400 and "people.parquet" in privacy["data"]
    assert metrics["test/acc"] > metrics["baseline/majority_acc"]


def test_hparams_trial_is_logged(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    _run_inprocess(["experiment=logit", *SMALL, "privacy.noise_multiplier=1.3", "seed=4"], tmp_path)
    acc = EventAccumulator(str(tmp_path / "private" / "tb"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = [plugin_data_pb2.HParamsPluginData.FromString(v).session_start_info
             for v in content.values()
             if plugin_data_pb2.HParamsPluginData.FromString(v).HasField("session_start_info")]
    assert len(start) == 1
    hp = start[0].hparams
    assert hp["noise_multiplier"].number_value == 1.3 and hp["seed"].number_value == 4
    assert hp["model"].string_value == "logit" and hp["target_epsilon"].string_value == "none"
    metrics = json.loads((tmp_path / "private" / "metrics.json").read_text())
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    scalars = _read_scalars(tmp_path / "private" / "tb")
    assert scalars["hparams/test_acc"][-1][1] == pytest.approx(metrics["test/acc"])
    assert scalars["hparams/epsilon"][-1][1] == pytest.approx(privacy["epsilon"])


@pytest.mark.slow  # several whole runs in subprocesses (25-45 s): CI runs it with -m slow
def test_joblib_launched_sweep_preset(tmp_path):
    """sweep=eps_grid with the joblib launcher: one folder per job, one thread each."""
    res = _cli(["-m", "experiment=logit", "sweep=eps_grid", *SMALL, "trainer.epochs=0.5", "trainer.baseline=false",
                "hydra/launcher=joblib_1thread", "privacy.target_epsilon=1,4", "seed=0",
                f"hydra.sweep.dir={tmp_path}/sweep"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert len(runs) == 2
    eps = sorted(json.loads((r / "privacy.json").read_text())["epsilon"] for r in runs)
    assert eps[0] <= 1.0 and 3.9 < eps[1] <= 4.0
    cfg = (runs[0] / ".hydra" / "config.yaml").read_text()
    assert "threads: 1" in cfg
    # the one-command privacy-utility report, with diffprivlib at the same epsilons
    summ = subprocess.run([sys.executable, str(REPO / "scripts" / "summarize_sweep.py"), str(tmp_path / "sweep"),
                           "--out", str(tmp_path / "report")], capture_output=True, text=True, timeout=300)
    assert summ.returncode == 0, summ.stderr[-3000:]
    import pandas as pd

    table = pd.read_csv(tmp_path / "report" / "private" / "summary.csv")
    assert set(table.model) == {"logit", "diffprivlib LogisticRegression"}
    dpl = table[table.model == "diffprivlib LogisticRegression"].sort_values("epsilon")
    assert np.allclose(dpl.epsilon, sorted(eps), rtol=1e-5) and dpl["test/acc_mean"].between(0, 1).all()
    assert "no single run's epsilon covers that choice" in (tmp_path / "report" / "summary.md").read_text()


def _doc_section(page: str, title: str) -> str:
    text = (REPO / page).read_text()
    start = text.index(title)
    end = text.find("\n## ", start)
    return text[start:end if end > 0 else None]


@pytest.mark.slow  # four whole runs in subprocesses (16 s); test_readme_own_data_example stays fast
def test_readme_first_own_data_walkthrough_runs_as_written(tmp_path):
    """The step-by-step walk-through (issue 14; docs/quickstart.md): its bash blocks, run as written in one
    shell, train on a user CSV with a declared schema, report epsilon <= 1, list the files, and
    score new rows; the command line's predictions equal the Python API's."""
    import re

    import pandas as pd

    from dptrain.tasks.predict import load_model

    section = _doc_section("docs/quickstart.md", "## Step by step: your first own-data run")
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 6, "the walk-through's bash blocks changed: update this test"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(blocks)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    work = tmp_path / "first-run"
    run, scored = work / "runs" / "people", work / "runs" / "people_scored"
    # the check came first (issue 44): its report is private, the folder holds nothing else
    check = json.loads((work / "checks" / "people" / "private" / "check.json").read_text())
    assert check["rows"] == 32561 and check["categorical"]["marital_status"]["undeclared_rows"] > 0
    assert sorted(p.name for p in (work / "checks" / "people").rglob("*") if p.is_file()) == ["check.json",
                                                                                            "check.txt"]
    assert "Settings that read or merge" in res.stdout or "No setting to add" in res.stdout
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["epsilon"] <= 1.0 and privacy["noise_multiplier_source"] == "calibrated"
    assert "people.csv" in privacy["data"]
    assert f"({privacy['epsilon']:.4g}, " in res.stdout and "-DP, example-level" in res.stdout  # privacy.txt printed
    assert "PRIVATE" in res.stdout and "model.pt" in res.stdout  # FILES.txt was printed
    metrics = json.loads((run / "private" / "metrics.json").read_text())
    assert metrics["test/acc"] > metrics["baseline/majority_acc"] + 0.03
    preds = pd.read_csv(scored / "private" / "predictions.csv")
    assert len(preds) == 50 and set(preds.label_01) <= {0, 1} and set(preds.label) <= {">50K", "<=50K"}
    assert not (scored / "predictions.csv").exists()  # the scored rows are private by default
    api = load_model(run).predict_proba(pd.read_csv(work / "new_people.csv"))[:, 1]
    np.testing.assert_allclose(preds.probability.to_numpy(), api, rtol=1e-6, atol=1e-6)
