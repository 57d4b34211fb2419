"""A user's first hour (issue 14): no silent defaults, settings refused by name when they would do
nothing or the wrong thing, errors that help (printed once), a settings reference that cannot
drift. Each test names the item of the issue it covers."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError
from dptrain.data import DataError, load_dataset, read_table, write_data_diagnostics
from dptrain.inference.run import warn_large_epsilon
from dptrain.privacy.budget import INTERVALS
from dptrain.privacy.report import summary_lines
from dptrain.release.api import fit_cells
from dptrain.settings.data import DataConfig, NumericColumn
from dptrain.settings.train import Config
from dptrain.tasks import cli
from dptrain.tasks.plan import training_plan
from dptrain.tasks.registry import validate
from dptrain.training.fit import mechanism_for

REPO = Path(__file__).resolve().parents[1]
SMALL = ["data=synthetic", "data.n_rows=600", "trainer.epochs=1", "trainer.batch_size=100",
         "trainer.progress=false", "trainer.baseline=false"]


def _compose(overrides: list[str], *, hydra: bool = False):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


def _refused(overrides: list[str], *needles: str, multirun: bool = False) -> str:
    """The message of the refusal the command line gives before anything is written
    (cli.precheck: what the Hydra callback runs after composition)."""
    with pytest.raises(DPTrainError) as err:
        cli.precheck(_compose(overrides, hydra=True), multirun=multirun)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def _cli(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, "-m", "dptrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


# ------------------------------------------------------------------------------ 1. unknown keys


@pytest.mark.parametrize("override,needle,suggestion", [
    ("+privacy.target_epsilonn=0.5", "privacy.target_epsilonn", "did you mean privacy.target_epsilon?"),
    ("++trainer.epoch=3", "trainer.epoch", "did you mean trainer.epochs?"),
    ("+trainer.noise_multiplier=1", "trainer.noise_multiplier", "did you mean privacy.noise_multiplier?"),
    ("++data.n_rows=5", "data.n_rows", "a key of data=synthetic"),
    ("+bogus=1", "bogus", ""),
])
def test_item1_keys_added_with_plus_are_refused_with_the_closest_key(override, needle, suggestion):
    msg = _refused(["experiment=logit", override], needle, suggestion, "not a setting of task=train")
    assert "docs/settings.md" in msg
    # the in-process entry point refuses them too (callers that compose without the command line)
    with pytest.raises(SystemExit) as exc:
        cli.run(_compose(["experiment=logit", override]), run_dir=Path("/nonexistent/never-written"))
    assert exc.value.code == 2


def test_item1_following_hydras_advice_for_a_typo_gets_our_suggestion():
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["experiment=logit", "privacy.noise_multipler=1"])
    assert "+privacy.noise_multipler=1" in str(err.value)  # Hydra's own advice ...
    _refused(["experiment=logit", "+privacy.noise_multipler=1"],  # ... is refused by name, with the fix
             "privacy.noise_multipler", "did you mean privacy.noise_multiplier?")


def test_item1_nested_and_release_keys_are_walked(tmp_path):
    _refused(["data=table", "data.path=x.csv", "data.target=y", "++data.numeric={age: {lower: 0, upper: 1}}",
              "+data.numeric.age.lowr=3"], "data.numeric.age.lowr", "did you mean data.numeric.age.lower?")
    _refused(["experiment=mos_atlas", "++release.domain.x_low=0"], "release.domain.x_low",
             "did you mean release.domain.x_lo?")
    cli.precheck(_compose(["experiment=logit", "+optim.momentum=0.9"], hydra=True), multirun=False)  # free-form


# ------------------------------------------------------------------------------ 2. no silent bounds


def test_item2_numeric_bounds_are_required():
    conf: Config = OmegaConf.to_object(_compose(["experiment=logit", "data=table", "data.path=x.csv",
                                                 "data.target=y", "++data.numeric={age: {}}"]))
    with pytest.raises(ConfigError, match=r"data\.numeric\.age\.lower is missing"):
        validate(conf)
    conf.data.numeric["age"].lower = 0.0
    with pytest.raises(ConfigError, match=r"data\.numeric\.age\.upper is missing"):
        validate(conf)


def test_item2_clipped_values_are_counted_privately_and_logged_without_counts(tmp_path, caplog):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"age": np.r_[rng.uniform(20, 60, 90), [150.0] * 7, [-3.0] * 4], "y": rng.integers(0, 2, 101)})
    df.to_csv(tmp_path / "t.csv", index=False)
    cfg = DataConfig(name="table", path=str(tmp_path / "t.csv"), target="y",
                     numeric={"age": NumericColumn(lower=0, upper=100)})
    with caplog.at_level(logging.WARNING, logger="dptrain.data"):
        ds = load_dataset(cfg, seed=0)
    assert ds.diagnostics["clipped"] == {"age": {"below_lower": 4, "above_upper": 7}}
    # issue 44: the count is in ONE console line marked PRIVATE for the data holder, in no other record
    private = [r.getMessage() for r in caplog.records if "PRIVATE counts" in r.getMessage()]
    assert len(private) == 1 and "clipped into the declared bounds: age 11" in private[0]
    others = " ".join(r.getMessage() for r in caplog.records if "PRIVATE counts" not in r.getMessage())
    assert not re.search(r"\b(4|7|11)\b", others)
    files = write_data_diagnostics(tmp_path / "run", ds)
    assert files == {"private/data_diagnostics.json": files["private/data_diagnostics.json"]}
    saved = json.loads((tmp_path / "run" / "private" / "data_diagnostics.json").read_text())
    assert saved["clipped"]["age"]["above_upper"] == 7
    # a training run writes the same file into its private folder and lists it as PRIVATE
    run = tmp_path / "train"
    cli.run(_compose(["experiment=logit", "data=table", f"data.path={tmp_path / 't.csv'}", "data.target=y",
                      "++data.numeric={age: {lower: 0, upper: 100}}", "trainer.epochs=1", "trainer.batch_size=20",
                      "trainer.progress=false", "trainer.baseline=false"]), run_dir=run)
    assert json.loads((run / "private" / "data_diagnostics.json").read_text()) == saved
    listing = (run / "FILES.txt").read_text()
    assert "private/data_diagnostics.json" in listing.split("PRIVATE")[1]
    assert not (run / "data_diagnostics.json").exists()


def _release_table(path: Path, *, x_scale: float = 1.0, per_cell: int = 30, cells: int = 12) -> Path:
    rng = np.random.default_rng(1)
    n = per_cell * cells
    df = pd.DataFrame({"cell": np.repeat(np.arange(cells), per_cell), "x": rng.random(n) * x_scale})
    df["y"] = np.clip(0.2 + 0.5 * df.x / x_scale + 0.1 * rng.standard_normal(n), 0, 1)
    df.to_csv(path, index=False)
    return path


def _release(path: Path, *extra: str) -> list[str]:
    cells = int(pd.read_csv(path).cell.max()) + 1
    return ["task=release", "data=table", f"data.path={path}", f"release.cell_values={{cell: {list(range(cells))}}}",
            *extra]


def test_item2_release_domain_is_required_for_a_table_and_explained(tmp_path):
    path = _release_table(tmp_path / "r.csv")
    with pytest.raises(SystemExit) as exc:
        cli.run(_compose(_release(path)), run_dir=tmp_path / "run")
    assert exc.value.code == 2 and not (tmp_path / "run").exists()
    conf = OmegaConf.to_object(_compose(_release(path)))
    with pytest.raises(ConfigError) as err:
        validate(conf)
    assert "release.domain.x_lo" in str(err.value) and "noise" in str(err.value) and "never from the rows" in str(
        err.value)
    validate(OmegaConf.to_object(_compose(["experiment=mos_atlas"])))  # the simulator keeps its public [0, 1]


# ------------------------------------------------------------------------------ 3. nothing releasable


def test_item3_a_release_outside_its_domain_finishes_and_says_so(tmp_path, caplog):
    """x in dollars against a domain of ranks: every x is clipped onto the edge, no cell can be
    released; with the private evaluation's figures on, the run still finishes cleanly."""
    path = _release_table(tmp_path / "dollars.csv", x_scale=200_000.0)
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        cli.run(_compose(_release(path, "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}",
                                  "release.private_evaluation=true", "release.tail_epsilons=[1.0]")), run_dir=run)
    rel = pd.read_csv(run / "release.csv")
    assert not rel.released.any()
    assert "released no cell" in caplog.text and "release.domain" in caplog.text
    # the count is in the one PRIVATE line for the data holder (issue 44), in no other record
    assert all("360" not in r.getMessage() for r in caplog.records if "PRIVATE counts" not in r.getMessage())
    assert "clipped into release.domain: x 360" in caplog.text
    assert (run / "private" / "evaluation" / "fig2_ls_vs_n.png").is_file()
    diag = json.loads((run / "private" / "data_diagnostics.json").read_text())
    assert diag["clipped"]["x"]["above_upper"] == 360
    assert "private/data_diagnostics.json" in (run / "FILES.txt").read_text().split("PRIVATE")[1]


# ------------------------------------------------------------------------------ 5. a shared machine


def test_item5_openmp_threads_sleep_while_waiting_unless_the_user_says_otherwise():
    """Spinning OpenMP threads made experiment=mlp 4.8x slower beside one busy process
    (experiments/performance/README.md); importing dptrain before torch makes waiting threads
    sleep, and an explicit policy in the environment is kept. Checked in fresh interpreters: the
    policy is read once, when torch loads its OpenMP runtime."""
    code = "import os, dptrain, torch; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"


# ------------------------------------------------------------------------------ 6. no silent no-ops


def test_item6_a_changed_optimiser_needs_its_own_learning_rate():
    _refused(["experiment=logit", "optim=adam"], "optim.lr=4.0", "experiment=logit", "optim=adam")
    _refused(["experiment=logit", "optim._target_=torch.optim.AdamW"], "optim.lr", "optim._target_")
    for ok in (["experiment=logit", "optim=adam", "optim.lr=0.01"], ["optim=adam"], ["experiment=mlp", "optim=sgd"]):
        cli.precheck(_compose(ok, hydra=True), multirun=False)


def test_item6_any_torch_optimiser_works_and_leftover_keys_are_named():
    conf = OmegaConf.to_object(_compose(["experiment=logit", "optim._target_=torch.optim.AdamW", "optim.lr=0.01"]))
    validate(conf)  # conf/optim/sgd.yaml has no SGD-only key left over
    conf = OmegaConf.to_object(_compose(["experiment=logit", "+optim.momentum=0.9", "optim._target_=torch.optim.Adam",
                                         "optim.lr=0.01"]))
    with pytest.raises(ConfigError, match=r"~optim\.momentum"):
        validate(conf)


def test_item6_privacy_settings_without_privacy_are_refused():
    _refused(["experiment=logit_nonprivate", "privacy.target_epsilon=1"], "privacy.target_epsilon",
             "privacy.enabled=false")
    _refused(["experiment=logit_nonprivate", "privacy.max_grad_norm=2"], "privacy.max_grad_norm")
    conf = OmegaConf.to_object(_compose(["experiment=logit_nonprivate", "privacy.target_epsilon=1"]))
    with pytest.raises(ConfigError, match="privacy.target_epsilon"):
        validate(conf)  # the Python path too
    validate(OmegaConf.to_object(_compose(["experiment=logit", "privacy.enabled=false"])))  # the preset's sigma: fine


def test_item6_a_sweep_preset_needs_multirun():
    _refused(["experiment=logit", "sweep=eps_grid"], "sweep='eps_grid'", "-m")
    cli.precheck(_compose(["experiment=logit", "sweep=eps_grid"], hydra=True), multirun=True)


def test_item6_a_finished_run_folder_is_not_overwritten(tmp_path):
    run = tmp_path / "done"
    (run / ".hydra").mkdir(parents=True)
    (run / "privacy.json").write_text("{}")
    (run / ".hydra" / "config.yaml").write_text("the finished run's settings\n")
    _refused(["experiment=logit", f"hydra.run.dir={run}"], "already holds a finished run", "overwrite=true",
             "trainer.resume=auto")
    cli.precheck(_compose(["experiment=logit", f"hydra.run.dir={run}", "overwrite=true"], hydra=True), multirun=False)
    # trainer.resume: only a run of the same settings (issue 43: a run owns its folder)
    _refused(["experiment=logit", f"hydra.run.dir={run}", "trainer.resume=auto"], "another configuration")
    same = tmp_path / "same"
    (same / ".hydra").mkdir(parents=True)
    (same / "privacy.json").write_text("{}")
    (same / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(_compose(["experiment=logit"])))
    cli.precheck(_compose(["experiment=logit", f"hydra.run.dir={same}", "trainer.resume=auto"], hydra=True),
                 multirun=False)
    _refused(["experiment=logit", f"hydra.sweep.dir={tmp_path}"], "hydra.sweep.dir", multirun=True)
    # through the command line: refused before Hydra writes anything into the folder
    res = _cli(["experiment=logit", f"hydra.run.dir={run}"], tmp_path)
    assert res.returncode == 2 and res.stderr.count("already holds a finished run") == 1, res.stderr[-2000:]
    assert (run / ".hydra" / "config.yaml").read_text() == "the finished run's settings\n"
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "privacy.json"]


# ------------------------------------------------------------------------------ 7. errors that help


def test_item7_an_error_is_printed_once_and_leaves_no_run_folder(tmp_path):
    res = _cli([*SMALL, "privacy.noise_multiplier=-1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert res.returncode == 2
    out = res.stdout + res.stderr
    assert out.count("privacy.noise_multiplier=-1.0 is not allowed") == 1, out[-3000:]
    # the folder this launch created is removed with the refusal (issue 32, item 9): no log is left
    assert not (tmp_path / "run").exists()


def test_item7_no_cell_with_three_rows_releases_nothing_and_says_which_setting_helps(tmp_path, caplog):
    """Refused before issue 44 ('no listed cell has at least 3 rows'): the table with one row more
    in one cell ran, so the refusal told them apart. Now the run finishes, every cell marked not
    released, and the log names the settings that would help."""
    path = _release_table(tmp_path / "tiny.csv", per_cell=2, cells=30)
    conf = _release(path, "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}", "release.private_evaluation=true")
    from dptrain.tasks.release import run_task

    with caplog.at_level(logging.WARNING):
        run_task(_compose(conf), run_dir=tmp_path / "run")
    released = pd.read_csv(tmp_path / "run" / "release.csv")
    assert len(released) == 30 and not released.released.any()
    assert "released no cell" in caplog.text and "release.min_n" in caplog.text


def _table(tmp_path: Path, df: pd.DataFrame, name: str = "t.csv", **kw) -> Path:
    path = tmp_path / name
    df.to_csv(path, index=False, **kw)
    return path


def test_item7_a_text_target_says_how_to_pick_the_positive_class(tmp_path):
    df = pd.DataFrame({"age": np.arange(40.0), "income": ["low", "high"] * 20})
    cfg = DataConfig(name="table", path=str(_table(tmp_path, df)), target="income",
                     numeric={"age": NumericColumn(0, 100)})
    with pytest.raises(DataError) as err:
        load_dataset(cfg, seed=0)
    assert "data.positive" in str(err.value) and "data.categorical" not in str(err.value)
    cfg.positive, cfg.negative = "high", "low"
    assert load_dataset(cfg, seed=0).n_features == 1


def test_item7_a_missing_column_suggests_the_closest_names(tmp_path):
    df = pd.DataFrame({"Age": np.arange(40.0), "ages": 1.0, "zzz": 2.0, "y": [0, 1] * 20})
    cfg = DataConfig(name="table", path=str(_table(tmp_path, df)), target="y",
                     numeric={"age": NumericColumn(0, 100)})
    with pytest.raises(DataError) as err:
        load_dataset(cfg, seed=0)
    assert "closest column names: 'Age', 'ages'" in str(err.value) and "'zzz'" not in str(err.value)


def test_item7_a_semicolon_csv_says_to_set_the_delimiter(tmp_path):
    df = pd.DataFrame({"age": np.arange(40.0), "y": [0, 1] * 20})
    path = _table(tmp_path, df, sep=";")
    cfg = DataConfig(name="table", path=str(path), target="y", numeric={"age": NumericColumn(0, 100)})
    with pytest.raises(DataError) as err:
        load_dataset(cfg, seed=0)
    assert "data.delimiter=';'" in str(err.value)
    cfg.delimiter = ";"
    assert load_dataset(cfg, seed=0).n_train > 0
    with pytest.raises(ConfigError, match="data.delimiter"):
        validate(OmegaConf.to_object(_compose(["experiment=logit", "data=table", f"data.path={path}",
                                               "data.target=y", "data.delimiter=ab",
                                               "++data.numeric={age: {lower: 0, upper: 100}}"])))
    assert list(read_table(_table(tmp_path, df, "tab.csv", sep="\t"), delimiter="\\t").columns) == ["age", "y"]


@pytest.mark.parametrize("declared", [[1, 2, 3], ["1.0", "2.0", "3.0"], ["1", "2", "3"]])
def test_item7_integer_labels_match_a_column_stored_as_floats(tmp_path, declared):
    df = pd.DataFrame({"grade": [1.0, 2.0, 3.0, np.nan] * 10, "y": [0, 1] * 20,
                       "split": ["train"] * 20 + ["test"] * 20})
    conf = OmegaConf.to_object(_compose(["experiment=logit", "data=table", f"data.path={_table(tmp_path, df)}",
                                         "data.target=y", "data.split_column=split",
                                         f"++data.categorical={{grade: {declared}}}"]))
    ds = load_dataset(conf.data, seed=0)
    x = np.concatenate([ds.x_train.numpy(), ds.x_test.numpy()])
    assert x[:, :3].sum() == 30 and x[:, 3].sum() == 10  # only the missing values go to <other>


def test_item7_the_slurm_launcher_without_its_extra_says_how_to_install_it(monkeypatch, capsys):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(SystemExit) as exc:
        cli.check_launcher(["experiment=logit", "hydra/launcher=slurm"])
    assert exc.value.code == 2 and 'pip install -e ".[slurm]"' in capsys.readouterr().err
    cli.check_launcher(["hydra/launcher=joblib_1thread"])


# ------------------------------------------------------------------------------ 9. the settings explain themselves


def test_item9_the_settings_reference_is_up_to_date():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import settings_reference
    finally:
        sys.path.remove(str(REPO / "scripts"))
    text = settings_reference.render()
    assert (REPO / "docs" / "settings.md").read_text(encoding="utf-8") == text, \
        "docs/settings.md is out of date: run python scripts/settings_reference.py"
    for key in ("privacy.target_epsilon", "trainer.epochs", "data.delimiter", "release.domain.x_lo", "overwrite",
                "audit.canaries", "experiment=logit", "model=mlp", "optim=adam"):
        assert f"`{key}" in text, key
    assert "(not described yet)" not in text.split("## task=predict")[0]


def test_item9_help_points_to_the_reference_and_lists_tasks_presets_settings(tmp_path):
    res = _cli(["--help"], tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    text = res.stdout
    assert "docs/settings.md" in text
    for word in ("train", "audit", "release", "predict", "logit_nonprivate", "mos_atlas", "eps_grid"):
        assert word in text, word
    from dptrain.settings.command_line import _all_paths
    from dptrain.tasks.registry import task_schemas as _task_schemas

    known = {p for schema in _task_schemas().values() for p in _all_paths(schema)}
    known |= {f"data.{f}" for f in ("path", "target", "positive", "negative", "numeric", "categorical", "delimiter",
                                    "split_column", "test_public")} | {"optim.lr", "release.domain", "hydra.run.dir"}
    named = set(re.findall(r"(?<![\w.+/])((?:[a-z_]+\.)+[a-z_]+)=", text.split("== Main settings ==")[1]))
    assert named and named <= known, named - known


def test_item9_the_composed_config_is_readable_and_adult_unchanged():
    cfg = _compose(["experiment=logit"])
    text = OmegaConf.to_yaml(cfg)
    assert "native_country" not in text and "n_rows" not in text and "generator" not in text
    assert len(text.splitlines()) < 66  # issue 42 added trainer.average and data.exclude, issue 44 data.negative
    conf = OmegaConf.to_object(cfg)
    ds = load_dataset(conf.data, seed=0)
    # the logit preset keeps one coding of education (issue 42: data.exclude=[education_num])
    assert ds.n_features == 111 and (ds.n_train, ds.n_test) == (32561, 16281)
    assert ds.feature_names[:2] == ("age", "capital_gain") and ds.feature_names[-1] == "native_country=<other>"
    assert int(ds.y_train.sum()) == 7841  # label 1: >50K, the UCI count


def test_item9_hparams_trials_let_tensorboard_compare_the_runs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dptrain.runfolder.tracking import Tracker

    for sigma in (1.0, 2.0):
        tracker = Tracker(tmp_path / f"sigma={sigma}", tensorboard=True)
        tracker.hparams({"noise_multiplier": sigma, "seed": 0}, {"hparams/test_acc": 0.8})
        tracker.close()
        acc = EventAccumulator(str(tmp_path / f"sigma={sigma}" / "tb"))
        acc.Reload()
        tags = set(acc.PluginTagToContent("hparams"))
        # no experiment summary: TensorBoard would take one run's as the whole sweep's (differs: false)
        assert tags == {"_hparams_/session_start_info", "_hparams_/session_end_info"}


@pytest.mark.parametrize("preset,target,needle", [
    ("linreg", "income", "objective=linear is not allowed for a 'binary' target: it needs a continuous target with "
                         "PUBLIC bounds (data.target_bounds"),
    ("multiclass", "relationship", "objective=multinomial is not allowed for a 'binary' target: it needs a multiclass "
                                   "target with its PUBLIC class list (data.classes"),
])
def test_round2_item1_a_presets_target_settings_do_not_carry_over_onto_a_table(preset, target, needle, tmp_path):
    """Issue 32, item 1: `experiment=linreg data=table ... data.target=income` ran with the preset's
    target_bounds [1, 99] (meant for hours_per_week) and clipped incomes to 99; multiclass failed on
    the preset's target. The target's settings now live with the preset's data source
    (data=adult_hours, data=adult_relationship), which data=table replaces: the table's linear
    target without declared bounds is refused by name, before any row is read."""
    rng = np.random.default_rng(0)
    pd.DataFrame({"age": rng.integers(18, 80, 500), "income": rng.integers(0, 200_000, 500),
                  "relationship": rng.choice(["a", "b", "c"], 500)}).to_csv(tmp_path / "people.csv", index=False)
    res = subprocess.run([sys.executable, "-m", "dptrain", f"experiment={preset}", "data=table",
                          f"data.path={tmp_path / 'people.csv'}", f"data.target={target}",
                          "++data.numeric={age: {lower: 18, upper: 80}}", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert res.returncode == 2, res.stderr[-2000:]
    assert needle in res.stderr
    assert not (tmp_path / "run" / "privacy.json").exists()


def test_round2_item10_a_preset_on_a_small_table_warns_of_its_epsilon_before_training(tmp_path, caplog):
    """Issue 32, item 10: experiment=logit on 3,000 rows gave epsilon ~4.5 (q = 0.46) against the
    preset's advertised ~1, silently. The run now says so before training, with the planned
    epsilon and the setting that calibrates the noise to the table."""
    caplog.set_level(logging.INFO, logger="dptrain")
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=logit", "data=synthetic", "data.n_rows=3000",
                                                         "trainer.progress=false"])
    cli.run(cfg, run_dir=tmp_path / "run")
    warning = [r.getMessage() for r in caplog.records if "epsilon will be about" in r.getMessage()]
    assert len(warning) == 1 and "privacy.target_epsilon=1" in warning[0] and "N = 2" in warning[0]
    planned = float(re.search(r"about ([0-9.]+)", warning[0]).group(1))
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert 2.0 < planned <= report["epsilon"]
    caplog.clear()
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=logit", "data=synthetic", "data.n_rows=3000",
                                                         "trainer.progress=false", "privacy.target_epsilon=1"])
    cli.run(cfg, run_dir=tmp_path / "calibrated")
    assert not any("epsilon will be about" in r.getMessage() for r in caplog.records)


def test_round2_item9_a_refused_run_leaves_no_run_folder(tmp_path):
    """Issue 32, item 9: a run refused by a value check (after Hydra wrote .hydra/ and the log)
    left a run folder behind. A folder this launch created is removed whole when the run is
    refused; a folder that existed before keeps what it held."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    new = tmp_path / "new"
    res = subprocess.run([sys.executable, "-m", "dptrain", "experiment=logit", "trainer.epochs=-1",
                          f"hydra.run.dir={new}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "trainer.epochs=-1.0 is not allowed" in res.stderr, res.stderr[-2000:]
    assert not new.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own file\n")
    res = subprocess.run([sys.executable, "-m", "dptrain", "experiment=logit", "trainer.epochs=-1",
                          f"hydra.run.dir={mine}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert (mine / "notes.txt").read_text() == "the user's own file\n"


@pytest.mark.parametrize("preset", ["logit", "multiclass"])
def test_round2_item5_the_console_shows_a_short_summary_and_the_table_goes_to_its_files(preset, tmp_path):
    """experiment=logit printed 122 lines (109 of them the coefficient table), multiclass 509:
    now at most 12, without a module or clock prefix on INFO lines; the table is in
    coefficients.csv, privacy.txt and the private log."""
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "dptrain", f"experiment={preset}", f"hydra.run.dir={run}"],
                         cwd=tmp_path, capture_output=True, timeout=300,
                         env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert out.returncode == 0, out.stderr[-2000:]
    # bytes, as a terminal shows them: a progress bar's updates (carriage returns) are one line
    lines = (out.stdout + out.stderr).decode().strip("\n").split("\n")
    assert len(lines) <= 12, "\n".join(lines)
    terms = len(pd.read_csv(run / "coefficients.csv"))
    text = "\n".join(lines)
    for needle in ("test accuracy:", "privacy: epsilon = ", f"coefficients: {terms} terms", f"outputs in {run}"):
        assert needle in text, needle
    assert not any(line.startswith("[INFO]") or re.match(r"\[\d{4}-", line) for line in lines)
    assert terms > 12 and "coefficients on the original scale" in (run / "private" / "dptrain.log").read_text()
    assert "coefficients on the original scale" in (run / "privacy.txt").read_text()


@pytest.mark.parametrize("argv,needles", [
    (["trainer.epoch=2"], ["trainer.epoch (did you mean trainer.epochs?)", "not a setting of task=train"]),
    (["privcy.delta=1e-6"], ["privcy (did you mean privacy?)"]),
    (["data.path=people.csv"], ["data.path (a key of data=table, not of data=adult"]),
    (["task=release", "trainer.epochs=3"], ["trainer: not a setting of task=release"]),
    (["trainer.epochs=three"], ["trainer.epochs=three: 'three' is not a number"]),
    (["data=tabel"], ["data=tabel (did you mean data=table?)", "allowed: adult,"]),
    (["-m", "privacy.noise_multiplier=1,2", "trainer.epoch=3"], ["did you mean trainer.epochs?"]),
])
def test_round2_item6_a_plain_misspelt_key_gets_dptrains_error_not_hydras(argv, needles, capsys):
    """Written key=value (no +), these got Hydra's raw 'Could not override ... use +trainer.epoch=2
    ... HYDRA_FULL_ERROR=1', which suggests the wrong fix; now dptrain's one style, exit 2."""
    with pytest.raises(SystemExit) as stop:
        cli.check_composition(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("dptrain: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    for hydra_words in ("To append to your config", "HYDRA_FULL_ERROR", "full_key", "object_type"):
        assert hydra_words not in err


def test_round2_item6_a_good_command_line_and_hydras_own_flags_pass_the_composition_check(capsys):
    for argv in (["experiment=logit", "trainer.epochs=2"], ["-m", "privacy.noise_multiplier=0.5,1,2,4"],
                 ["--cfg", "job", "trainer.epoch=2"], ["hydra.run.dir=/tmp/x", "data=table", "data.path=a.csv"]):
        cli.check_composition(argv)  # returns: Hydra composes (and, for --cfg, reports) as before
    assert capsys.readouterr().err == ""


def test_round2_item7_a_fixed_sigma_beyond_the_epsilon_limit_is_refused_before_training(tmp_path):
    """Issue 32, item 7: privacy.noise_multiplier=0.05 trained, then spent 144 s silently in the PLD
    pass at epsilon ~1,000, while privacy.target_epsilon=1000 is refused as protecting nothing. A
    fixed sigma whose planned epsilon (DP-SGD and the interval release) passes the same limit is
    refused the same way, in seconds, and leaves no run folder."""
    for sigma in ("0.05", "0.25"):
        run = tmp_path / f"run{sigma}"
        out = _cli([f"privacy.noise_multiplier={sigma}", f"hydra.run.dir={run}"], cwd=tmp_path)
        assert out.returncode == 2, out.stdout[-2000:]
        assert f"dptrain: error: privacy.noise_multiplier={sigma} is not allowed" in out.stderr
        assert "above 100, which protects nothing" in out.stderr and "privacy.target_epsilon=E" in out.stderr
        assert "train loop" not in out.stdout and not run.exists()
    # at sigma 0.3 DP-SGD alone is under 100 (91.2); a planned interval release's share counts (Adult's
    # own table plans none, issue 42, so the planned total is checked on the mechanism directly)
    conf = OmegaConf.to_object(_compose(["privacy.noise_multiplier=0.3"]))
    plan = training_plan(conf)
    mechanism = mechanism_for(plan, dataset_size=32561, delta=1e-6)
    shared = dataclasses.replace(plan, budget=plan.budget.with_share(INTERVALS, 0.25))
    with pytest.raises(ConfigError, match=r"would be about 121\.[0-9]+ \(91\.[0-9]+ for DP-SGD"):
        warn_large_epsilon(shared, mechanism)
    none = dataclasses.replace(plan, budget=plan.budget.with_share(INTERVALS, 0.0))
    assert warn_large_epsilon(none, mechanism) == pytest.approx(91.2, abs=0.5)


def test_round2_item7_a_slow_pld_pass_is_announced(tmp_path, caplog):
    """At a large epsilon the report's PLD pass takes seconds to a minute: a line says so first."""
    caplog.set_level(logging.INFO, logger="dptrain")
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*SMALL, "privacy.noise_multiplier=0.6", "trainer.epochs=2"])
    cli.run(cfg, run_dir=tmp_path / "run")
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    said = [r.getMessage() for r in caplog.records if "PLD accountant's pass" in r.getMessage()]
    assert report["epsilons"]["rdp"] > 10 and len(said) == 1, (report["epsilons"], said)


def test_round2_item9_overwrite_replaces_the_old_runs_events_and_log(tmp_path):
    """Issue 32, item 9: overwrite=true kept the old run's TensorBoard events (two runs' curves in
    one folder) and appended to its log. Now the finished run's files are removed first, and
    (issue 43) so is every other file outside private/: no file the new run did not write is left
    beside its report."""
    run = tmp_path / "run"
    args = [*SMALL, f"hydra.run.dir={run}", "trainer.progress=false"]
    assert _cli(args, tmp_path).returncode == 0
    (run / "my_notes.txt").write_text("mine\n")
    first_events = sorted((run / "private" / "tb").rglob("events.out.tfevents*"))
    assert len(first_events) >= 1
    out = _cli([*args, "overwrite=true", "seed=3"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    events = sorted((run / "private" / "tb").rglob("events.out.tfevents*"))
    assert len(events) == len(first_events), (first_events, events)  # the old run's events are gone
    log = (run / "private" / "dptrain.log").read_text()
    assert log.count("engine=") == 1, log  # one run's log, not two
    assert not (run / "my_notes.txt").exists()
    assert "seed: 3" in (run / ".hydra" / "config.yaml").read_text()


def test_round2_item14_the_release_console_states_the_total_epsilon(tmp_path, caplog):
    """Issue 32, item 14: the release console said 'epsilon=1' while release.json's total was 3
    (MOS: theta, SE and N at 1 each). The first line now says per statistic, the last the total."""
    caplog.set_level(logging.INFO, logger="dptrain")
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=mos_atlas", "data.n_cells=200",
                                                         "release.private_evaluation=false"])
    cli.run(cfg, run_dir=tmp_path / "run")
    said = [r.getMessage() for r in caplog.records]
    total = json.loads((tmp_path / "run" / "release.json").read_text())["epsilon"]["total"]
    assert total == 3.0
    assert any(m.startswith("release: epsilon 3, delta 0 in all") and "release.epsilon_per_statistic=1" in m
               for m in said)
    assert any(m.startswith("release written") and "epsilon 3 in all (theta 1 + se 1 + n 1)" in m for m in said)


def test_round2_item14_ssp_and_a_resumed_finished_run_say_what_happened(tmp_path):
    """Issue 32, item 14: ssp printed 'q = 1, steps = 1 ... train loop: 0.0 s for 1 steps'; a
    resumed finished run re-reported the old loop time as if it had trained."""
    result = type("R", (), {"metrics": {"time/train_seconds": 8.1, "train/steps": 1, "test/rmse": 1.0},
                            "privacy": {"stopped_early": False}})()
    report = {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp", "epsilons": {"rdp": 1.0}, "noise_multiplier": 4.0,
              "max_grad_norm": 6.75, "sample_rate": 1.0, "steps": 1, "private": True, "estimator": {"name": "ssp"}}
    text = "\n".join(summary_lines(result, report, dist_ctx=None, run_dir=tmp_path))
    assert "one release of Z'Z, noise multiplier 4 x sensitivity 6.75" in text and "q = 1" not in text
    assert "ssp: 8.1 s" in text and "for 1 steps" not in text
    run = tmp_path / "run"
    args = [*SMALL, f"hydra.run.dir={run}"]
    assert _cli(args, tmp_path).returncode == 0
    out = _cli([*args, "trainer.resume=auto"], tmp_path)
    assert out.returncode == 0 and "resumed a finished run: no step taken" in out.stdout, out.stdout[-1500:]
    assert "train loop:" not in out.stdout


def test_round2_item11_the_private_evaluation_shows_its_progress(tmp_path):
    """Issue 32, item 11: experiment=mos_atlas spent 141 of 149 s in a silent private evaluation.
    A progress line now names each method as it runs (dp_sgd, the slowest, last)."""
    out = subprocess.run([sys.executable, "-m", "dptrain", "experiment=mos_atlas", "data.n_cells=200",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, timeout=300,
                         env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert out.returncode == 0, out.stderr[-2000:]
    err = out.stderr.decode()
    assert "release + private evaluation: 0/11 methods" in err and "11/11 methods" in err
    for method in ("dp_mos", "theil_sen", "dp_sgd"):
        assert f"methods, {method}" in err, err[-1500:]


def test_round2_item4_dp_mos_on_small_groups_is_refused_and_predictions_stay_in_the_domain(tmp_path, capsys):
    """Issue 32, item 4: DP-MOS on 8 declared cells of ~500 rows chose chi = 189,812 and released
    every cell, theta from -918 to 413 for a statistic in [0, 1]. Now refused before any noise is
    drawn, naming the settings that would help; forced (Python, small_groups=True), the released
    predictions and intervals are clamped into the public [y_lo, y_hi]."""
    path = _release_table(tmp_path / "r.csv", per_cell=500, cells=8)
    domain = "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}"
    with pytest.raises(SystemExit) as stop:
        cli.run(_compose(_release(path, domain, "release.method=dp_mos", "release.epsilon_per_statistic=1")),
                run_dir=tmp_path / "run")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "too small for a private chi" in err and not (tmp_path / "run").exists()
    for setting in ("release.epsilon_per_statistic of at least", "release.dp_mos_split.chi", "release.chi_by",
                    "cells per group"):
        assert setting in err, err
    df = pd.read_csv(path)
    est = fit_cells(df, x="x", y="y", cells=["cell"], cell_keys=pd.DataFrame({"cell": range(8)}))
    for seed in range(5):
        f = est.release_dp_mos(statistic="p25", epsilon=1.0, seed=seed, small_groups=True).to_frame()
        released = f[f.released]
        assert ((released.theta_released >= 0) & (released.theta_released <= 1)).all()
        assert ((released.ci_low >= 0) & (released.ci_high <= 1)).all()


def test_round2_item2_declared_labels_that_match_no_row_run_and_are_counted(tmp_path, caplog):
    """Issue 32, item 2: '++data.categorical={region: [north, south, east, west]}' against a file of
    North/South/... exited 0 silently, every row in region=<other>. It was then refused, which
    told a table with a category's only row from the table without it (issue 44). Now the run
    goes on and counts the lumped rows: private/data_diagnostics.json and the one PRIVATE console
    line for the data holder, with the pointer to dptrain check (which names the case variants)."""
    rng = np.random.default_rng(2)
    n = 1200
    df = pd.DataFrame({"age": rng.integers(18, 90, n), "region": rng.choice(["North", "South", "East", "West"], n),
                       "y": rng.integers(0, 2, n)})
    path = _table(tmp_path, df)
    base = ["data=table", f"data.path={path}", "data.target=y", "++data.numeric={age: {lower: 18, upper: 90}}",
            "trainer.epochs=1", "trainer.batch_size=100", "trainer.progress=false", "privacy.target_epsilon=1"]
    caplog.set_level(logging.INFO, logger="dptrain")
    cli.run(_compose([*base, "++data.categorical={region: [north, south, east, west]}"]), run_dir=tmp_path / "r")
    diagnostics = json.loads((tmp_path / "r" / "private" / "data_diagnostics.json").read_text())
    assert diagnostics["rows"]["lumped"] == {"region": {"missing": 0, "undeclared": diagnostics["rows"]["kept"]}}
    assert diagnostics["rows"]["kept"] == n
    assert f"lumped into <other> (data.unlisted=other): region {n} undeclared" in caplog.text
    assert "dptrain check" in caplog.text
    public = [f for f in (tmp_path / "r").rglob("*") if f.is_file() and "private" not in f.parts]
    assert not any(b"undeclared" in f.read_bytes() for f in public)


def test_a_sweep_whose_folder_names_would_be_too_long_is_refused_first(capsys):
    """A schema written on the command line made each sweep folder's name longer than a file system
    allows, and Hydra stopped at the first run with an OSError; now the sweep is refused before
    anything runs, with the two ways out."""
    numeric = ",".join(f"column_{j}:{{lower:0,upper:1}}" for j in range(12))
    argv = ["-m", "experiment=logit", "data=table", "data.path=t.csv", f"++data.numeric={{{numeric}}}",
            "privacy.noise_multiplier=1,2"]
    with pytest.raises(SystemExit) as stop:
        cli.check_sweep_folders(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "characters long (at most 255)" in err and "hydra.sweep.subdir=${hydra.job.num}" in err
    cli.check_sweep_folders([*argv, "hydra.sweep.subdir=${hydra.job.num}"])  # numbered folders: fine
    cli.check_sweep_folders(argv[1:])  # not a sweep: one run folder, named by hydra.run.dir
    cli.check_sweep_folders(["-m", "--config-dir", "x" * 300, "experiment=logit", "privacy.noise_multiplier=1,2"])
    cli.check_sweep_folders(["-m", "experiment=logit", f"data.cache=/{'c' * 300}", "privacy.noise_multiplier=1,2"])
