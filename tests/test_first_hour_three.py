"""A user's first hour, round three (issue 46, items 1, 2 and 7 but the sweep summary): every
failure a user can cause ends in ONE ``dptrain: error:`` line, exit status 2, and no traceback
(an unwritable run folder, a read-only working directory, a full disk while the run writes, an
override Hydra's grammar cannot read, a scalar where a list is needed, a misspelt builder key);
``--help`` lists every task; the bare ``python -m dptrain`` says what it runs; ``experiment=tuning``
runs ``task=tune``; an MLP run logs no coefficient line. The newcomer's mistakes (the list at the
end) run through the real entry point, :func:`dptrain.tasks.cli.main`, in this process."""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from dptrain.runfolder import folder as run_folder
from dptrain.runfolder import publish, runlock, tracking
from dptrain.runfolder.write_errors import folder_error, write_error
from dptrain.settings.command_line import override_syntax_message
from dptrain.tasks import check as table_check
from dptrain.tasks import cli
from dptrain.tasks.registry import TASKS

REPO = Path(__file__).resolve().parents[1]
SMALL = ["data=synthetic", "data.n_rows=600", "trainer.epochs=1", "trainer.batch_size=100", "trainer.progress=false",
         "logger.tensorboard=false"]
#: what no output of a user's mistake may hold: a traceback, Hydra's own error report or advice
NOT_OURS = ("Traceback", "HYDRA_FULL_ERROR", "UserWarning", "Error executing job", "hydra.cc/docs", "full_key:",
            "object_type=", "raised OSError", "raised PermissionError")


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _main(argv: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, str]:
    """``python -m dptrain ARGV`` in this process (from ``cwd``): its exit status and everything it
    printed, warnings included."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["dptrain", *argv])
    handlers, level = logging.root.handlers[:], logging.root.level
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cli.main()
            code = 0
        except SystemExit as stop:
            code = stop.code
        finally:  # Hydra's job logging (the console on this test's captured stdout, the run's log file)
            for handler in [h for h in logging.root.handlers if h not in handlers]:
                handler.close()
            logging.root.handlers[:], logging.root.level = handlers, level
            logging.raiseExceptions = True
    out = capsys.readouterr()
    return code, out.out + out.err + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)


def _refused(code: int, out: str, *needles: str) -> str:
    """The one error line of a refusal (exit 2, no traceback), holding every needle."""
    assert code == 2, out[-3000:]
    for words in NOT_OURS:
        assert words not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("dptrain: error: ")]
    assert len(lines) == 1 and out.count("dptrain: error:") == 1, out[-3000:]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def _cli(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "dptrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _unwritable_folder(tmp_path: Path) -> Path | None:
    """A folder in which this process cannot create anything: a read-only copy of tmp_path for a
    normal user, /sys (read-only in containers) for root; None when neither refuses."""
    ro = tmp_path / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    for candidate in (ro, Path("/sys")):
        try:
            (candidate / "dptrain-probe").mkdir()
        except OSError:
            return candidate
        (candidate / "dptrain-probe").rmdir()
    return None


# ------------------------------------------------------------------------------ 1. unwritable folders


def test_item1_a_run_folder_behind_a_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """hydra.run.dir under a file: Hydra's callback warning and an OSError traceback, rc 1, before."""
    blocker = tmp_path / "results"
    blocker.write_text("the user's own file\n")
    code, out = _main([*SMALL, f"hydra.run.dir={blocker / 'run1'}"], tmp_path, monkeypatch, capsys)
    _refused(code, out, f"hydra.run.dir='{blocker / 'run1'}' is not allowed", f"{blocker} is a file",
             "refused before anything was written", "Allowed: a folder you can write")
    assert blocker.read_text() == "the user's own file\n"  # nothing already there is lost


def test_item1_a_read_only_run_folder_and_working_directory_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A launch from a read-only working directory (the default hydra.run.dir, outputs/..., lies
    below it) and a hydra.run.dir on a read-only mount: one line each, exit 2, through the real
    ``python -m dptrain`` (its exit path included)."""
    readonly = _unwritable_folder(tmp_path)
    if readonly is None:
        pytest.skip("no folder on this machine refuses a write by this process")
    res = _cli([*SMALL], readonly, timeout=120)
    line = _refused(res.returncode, res.stdout + res.stderr, "hydra.run.dir='outputs/", "is not allowed",
                    f"relative to the working directory {readonly}", "run from a writable folder")
    assert str(readonly / "outputs") in line
    code, out = _main([*SMALL, f"hydra.run.dir={readonly / 'run'}"], tmp_path, monkeypatch, capsys)
    _refused(code, out, f"hydra.run.dir='{readonly / 'run'}' is not allowed", "cannot be created or written")
    assert not (tmp_path / "outputs").exists() and not (readonly / "run").exists()


def test_item1_a_full_disk_while_the_run_writes_keeps_what_was_written(tmp_path, monkeypatch, capsys):
    """The disk fills while the run writes its report: one line naming the file, the reason and the
    fix; the files written before (the model, .hydra/ as Hydra wrote it) stay."""
    real = run_folder.atomic_write_text

    def full_disk(path, text):
        if Path(path).name == "privacy.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(run_folder, "atomic_write_text", full_disk)
    monkeypatch.setattr(tracking, "atomic_write_text", full_disk)
    run = tmp_path / "run"
    code, out = _main([*SMALL, f"hydra.run.dir={run}"], tmp_path, monkeypatch, capsys)
    _refused(code, out, f"cannot write {run / 'privacy.json'}: no space left on the device",
             f"every file written before stays in {run}", "free space on that disk", "overwrite=true")
    assert (run / "model.pt").is_file() and (run / ".hydra" / "config.yaml").is_file()
    assert not (run / "privacy.json").exists()
    assert "no space left" in (run / "private" / "dptrain.log").read_text()


def test_item1_a_write_hydra_makes_itself_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Hydra writes .hydra/ after dptrain's checks: a full disk there was Hydra's traceback."""
    import hydra.core.utils as hydra_utils

    def full_disk(cfg, filename, output_dir):
        raise OSError(errno.ENOSPC, "No space left on device", str(output_dir / filename))

    monkeypatch.setattr(hydra_utils, "_save_config", full_disk)
    run = tmp_path / "run"
    code, out = _main([*SMALL, f"hydra.run.dir={run}"], tmp_path, monkeypatch, capsys)
    _refused(code, out, f"cannot write {run / '.hydra' / 'config.yaml'}: no space left on the device",
             "free space on that disk")
    assert os.environ.get("HYDRA_FULL_ERROR") is None  # restored after the run
    assert not runlock._HELD  # the folder's lock, taken before Hydra's write, is released


def test_item1_publish_and_check_into_an_unwritable_folder_end_in_one_line(tmp_path, monkeypatch, capsys):
    """``dptrain publish RUN DEST`` and ``dptrain check`` wrote their traceback (PermissionError)
    when DEST or hydra.run.dir could not be written; the check now refuses before any row is read."""
    readonly = _unwritable_folder(tmp_path)
    if readonly is None:
        pytest.skip("no folder on this machine refuses a write by this process")
    monkeypatch.setattr(publish, "exported_files", lambda run_dir: {"privacy.json": b"{}\n"})
    assert publish.main([str(tmp_path), str(readonly / "export")]) == 2
    _refused(2, capsys.readouterr().err, "publish: cannot write", "nothing was published",
             "a DEST in a folder you can write")
    (tmp_path / "t.csv").write_text("y,a\n1,0.5\n0,0.2\n")
    args = ["experiment=logit", "data=table", f"data.path={tmp_path / 't.csv'}", "data.target=y", "data.positive=1",
            "data.negative=0", "++data.numeric={a: {lower: 0, upper: 1}}"]
    assert table_check.main([*args, f"hydra.run.dir={readonly / 'check'}"]) == 2
    _refused(2, capsys.readouterr().err, f"hydra.run.dir='{readonly / 'check'}' is not allowed")
    assert table_check.main([*args, f"hydra.run.dir={tmp_path / 'new' / 'check'}", "data.target=z"]) == 2
    assert not (tmp_path / "new").exists()  # the probe of the report's folder leaves nothing behind
    _refused(2, capsys.readouterr().err, "data.target: column 'z' is not in")
    assert table_check.main([*args, "data.positive=Süd"]) == 2  # dptrain check reads Hydra's grammar too
    _refused(2, capsys.readouterr().err, "as in 'data.positive=\"Süd\"'")


def test_item1_the_messages_name_the_setting_the_reason_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = OSError(errno.EROFS, "Read-only file system", "outputs")
    msg = str(folder_error(err, key="hydra.run.dir", folder=Path("outputs/2026-01-01/10-00-00")))
    assert msg.startswith("hydra.run.dir='outputs/2026-01-01/10-00-00' is not allowed")
    assert "a read-only file system" in msg and f"working directory {tmp_path}" in msg
    msg = str(folder_error(OSError(errno.EACCES, "Permission denied", "/data/x"), key="hydra.sweep.dir",
                           folder=Path("/data/x")))
    assert "permission denied" in msg and "hydra.sweep.dir=$HOME/dptrain-runs/run1" in msg
    msg = str(write_error(OSError(errno.EDQUOT, "Disk quota exceeded", "/r/model.pt"), folder=Path("/r")))
    assert msg.startswith("cannot write /r/model.pt: the disk quota is exceeded") and "nothing was removed" in msg


# ------------------------------------------------------------------------------ 2. Hydra's lexer


@pytest.mark.parametrize("override,quoted,label", [
    ("++data.categorical={region: [Nord, Süd]}", "'++data.categorical={region: [Nord, \"Süd\"]}'", "Süd"),
    pytest.param("data.positive=>50K", "'data.positive=\">50K\"'", ">50K", marks=pytest.mark.slow),
    pytest.param("data.negative=Ärger", "'data.negative=\"Ärger\"'", "Ärger", marks=pytest.mark.slow),
])
def test_item2_an_override_hydra_cannot_read_gets_the_quoted_form_that_works(override, quoted, label, tmp_path,
                                                                              monkeypatch, capsys):
    """Hydra answered with its lexer's name, a caret and a grammar link. Now: the character, the
    exact form that works (checked: Hydra reads it and the value is the user's label), the YAML
    file as the other way."""
    code, out = _main(["data=table", override], tmp_path, monkeypatch, capsys)
    line = _refused(code, out, "cannot be written unquoted", f"as in {quoted}", "YAML config file", "--config-dir")
    assert "LexerNoViableAltException" not in line
    suggested = re.search(r"as in '(.*?)' \(the double quotes", line).group(1)
    parsed = OverridesParser.create().parse_overrides([suggested])[0].value()
    assert label == parsed or label in parsed["region"]


def test_item2_an_unclosed_bracket_gets_the_general_advice():
    msg = override_syntax_message("release.cells=[a,b", Exception("no viable alternative at input '[a,b'"),
                                  lambda t: OverridesParser.create().parse_overrides([t]))
    assert "every bracket closed" in msg and "YAML config file" in msg
    for argv in (["experiment=logit", "--cfg", "job"], ["--info", "defaults"], ["-m", "seed=0,1"]):
        cli.check_override_syntax(argv)  # Hydra's own options and sweeps pass


# ------------------------------------------------------------------------------ 7. smaller items


def test_item7_help_lists_every_task():
    """--help listed 5 of the 9 tasks (its text: conf/config.yaml's hydra.help.template, which
    tests/test_first_hour.py prints through the real command line)."""
    section = OmegaConf.select(cli._packaged_config(), "hydra.help.template").split("== Tasks (task=NAME) ==")[1]
    listed = set(re.findall(r"^  (\w+) ", section.split("==")[0], flags=re.M))
    assert set(TASKS) <= listed and len(set(TASKS)) == 9, set(TASKS) - listed
    assert "experiment=tuning" in section


@pytest.mark.parametrize("argv,needles", [
    (["model=mlp", "model.activation=rleu"], ["model.activation='rleu' is not allowed", "(did you mean relu?)"]),
    pytest.param(["model=mlp", "model.activation=Tanh"], ["(did you mean tanh?)"], marks=pytest.mark.slow),
    (["model=mlp", "model.activatoin=relu"], ["model.activatoin=relu is not allowed",
                                               "did you mean model.activation?"]),
    (["model=MLP"], ["model=MLP (did you mean model=mlp?)"]),
    pytest.param(["++model._target_=dptrain.models.networks.mpl"], [
        "model._target_='dptrain.models.networks.mpl' is not allowed", "did you mean dptrain.models.networks.mlp?"],
        marks=pytest.mark.slow),
    (["optim.momentun=0.9"], ["did you mean ++optim.momentum=0.9?"]),
    pytest.param(["++optim.momentun=0.9"], ["optim.momentun=0.9 is not allowed", "(did you mean momentum?)"],
                 marks=pytest.mark.slow),
    pytest.param(["++optim._target_=torch.optim.Adamm", "optim.lr=0.1"], ["did you mean torch.optim.Adam?"],
                 marks=pytest.mark.slow),
    pytest.param(["privacy.accountant=PLD"], ["must be one of rdp, pld (did you mean pld?)"], marks=pytest.mark.slow),
    pytest.param(["objective.name=binery"], ["(did you mean binary?)"], marks=pytest.mark.slow),
])
def test_item7_builder_keys_with_a_known_choice_list_get_a_did_you_mean(argv, needles, tmp_path, monkeypatch,
                                                                         capsys):
    """model.activation=rleu gave a nested message ('model={...} is not allowed: ValueError: ...')."""
    code, out = _main([*SMALL, *argv, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, monkeypatch, capsys)
    line = _refused(code, out, *needles)
    assert "ValueError" not in line and "model={" not in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv,needles", [
    (["++data.categorical={region: Nord}"],
     ["data.categorical.region='Nord' is not allowed: data.categorical.region takes a list",
      "'++data.categorical={region: [Nord]}'"]),
    pytest.param(["++data.categorical.region=Nord"], [
        "data.categorical.region takes a list, e.g. data.categorical.region=[Nord]"], marks=pytest.mark.slow),
    pytest.param(["data.categorical=[region]"], ["data.categorical takes a mapping, not a list"],
                 marks=pytest.mark.slow),
    pytest.param(["++data.numeric={age: 3}"], ["data.numeric.age='3' is not allowed", "{age: {lower: 0, upper: 100}}"],
                 marks=pytest.mark.slow),
])
def test_item7_a_scalar_where_a_list_is_needed_is_refused_in_dptrains_words(argv, needles, tmp_path, monkeypatch,
                                                                            capsys):
    code, out = _main(["data=table", "data.path=people.csv", *argv], tmp_path, monkeypatch, capsys)
    line = _refused(code, out, *needles)
    assert "type hint" not in line and "typing.List" not in line and "ListConfig" not in line


def test_item7_an_mlp_run_logs_no_coefficient_line(tmp_path, caplog):
    """Every MLP run logged 'no coefficient table: the model is not linear' (and printed 'coefficient
    intervals: none (the model is not linear)'): a model that cannot have one says nothing of it."""
    caplog.set_level(logging.INFO, logger="dptrain")
    cli.run(_compose(["experiment=mlp", *SMALL]), run_dir=tmp_path / "mlp")
    assert not [r.getMessage() for r in caplog.records if "coefficient" in r.getMessage()]
    caplog.clear()
    cli.run(_compose(["experiment=logit", *SMALL]), run_dir=tmp_path / "logit")
    lines = [r.getMessage() for r in caplog.records if "coefficient" in r.getMessage()]
    assert sum(m.startswith("coefficient intervals") for m in lines) == 1, lines
    assert not any("not linear" in m for m in lines)


def test_item7_the_bare_command_says_what_it_runs_as_the_readme_does(tmp_path, monkeypatch, capsys):
    """``python -m dptrain`` alone ran the schema's defaults (epsilon 3.8 at delta 1e-6) silently,
    unlike the README's first run: it says so first, and the README says the same."""
    ran = []
    monkeypatch.setattr(cli, "_hydra_in_our_words", lambda: ran.append(True))
    code, out = _main([], tmp_path, monkeypatch, capsys)
    assert code == 0 and ran and out.startswith(cli.NO_PRESET_NOTE)
    cfg = _compose([])
    assert (cfg.task, cfg.data.name, cfg.privacy.noise_multiplier, cfg.trainer.epochs, cfg.privacy.delta) == (
        "train", "adult", 1.0, 5, None)
    assert "sigma 1.0, 5 epochs" in cli.NO_PRESET_NOTE and "experiment=logit" in cli.NO_PRESET_NOTE
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "No preset: every default, epsilon 3.8 at delta 1e-6, not the run above (it says so)" in readme
    running = " ".join((REPO / "docs" / "running.md").read_text().split())
    assert "Without a preset, `python -m dptrain` runs `task=train` with every setting at its default" in running
    assert "sigma 1.0, 5 epochs of expected batch 1024, delta 1e-6 from N): epsilon 3.8" in running
    code, out = _main(["experiment=logit", "--cfg", "job"], tmp_path, monkeypatch, capsys)
    assert cli.NO_PRESET_NOTE not in out


def test_item7_experiment_tuning_is_the_private_search():
    """experiment=tuning (the name users guess) failed: it is the README's task=tune command."""
    preset = OmegaConf.to_container(_compose(["experiment=tuning"]))
    spelled = OmegaConf.to_container(_compose(["task=tune", "experiment=logit", "tune=lr_clip",
                                               "privacy.target_epsilon=1"]))
    assert preset == spelled and preset["task"] == "tune"
    again = _compose(["experiment=tuning", "privacy.target_epsilon=2"])
    assert again.privacy.target_epsilon == 2 and again.privacy.noise_multiplier is None


# ------------------------------------------------------------------------------ the newcomer's mistakes


#: what a newcomer types, and what the one error line must say (each refused before any row is read,
#: no run folder left); the mistakes tests/test_first_hour.py, tests/test_cli.py and
#: tests/test_hostile_input.py already cover are not repeated here
MISTAKES = [
    (["task=tuning"], ["task=tuning (did you mean task=tune?)"]),
    (["experiment=logi"], ["experiment=logi (did you mean experiment=logit?)"]),
    ([*SMALL, "privacy.target_epsilon=one"], ["'one' is not a number"]),
    (["data=table"], ["data.path=None is not allowed"]),
    (["data=table", "data.path=missing.csv", "data.target=y", "++data.numeric={a: {lower: 0, upper: 1}}"],
     ["data.path='missing.csv': no such file"]),
    (["task=predict", "run=/nonexistent/run", "data.path=rows.csv"], ["run='/nonexistent/run' is not allowed"]),
    (["task=predict", "data=synthetic", "run=/nonexistent/run"], ["data=synthetic is not allowed: task=predict takes "
                                                                  "no data=NAME"]),
    ([*SMALL, "privacy.noise_seed_file=/nonexistent/seed"],
     ["privacy.noise_seed_file='/nonexistent/seed' is not allowed"]),
    (["task=release", "release.method=dpmos"], ["(did you mean dp_mos?)"]),
    (["task=release", *SMALL], ["trainer, logger: not a setting of task=release"]),
    ([*SMALL, "trainer.device=gpu"], ["trainer.device='gpu' is not allowed"]),
    ([*SMALL, "data.positive=Süd"], ["'data.positive=\"Süd\"'"]),
    (["-m", *SMALL, "privacy.noise_multiplier=1,2", "hydra.sweep.dir=RO/sweep"],
     ["hydra.sweep.dir='RO/sweep' is not allowed"]),
    ([*SMALL, "hydra.run.dir=FILE/run"], ["FILE is a file"]),
]
#: the ones the fast suite runs (the others: -m slow); each is about a second of composing
FAST_MISTAKES = (0, 6, 9, 13)


@pytest.mark.parametrize("argv,needles", [m if i in FAST_MISTAKES else pytest.param(*m, marks=pytest.mark.slow)
                                          for i, m in enumerate(MISTAKES)])
def test_a_newcomers_mistake_ends_in_one_error_line_and_exit_2(argv, needles, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("x\n")
    readonly = _unwritable_folder(tmp_path) or blocker
    fill = {"RO": str(readonly), "FILE": str(blocker)}

    def filled(text: str) -> str:
        return re.sub(r"\b(RO|FILE)\b", lambda m: fill[m.group(1)], text)

    run = [] if any(a.startswith("hydra.") for a in argv) else [f"hydra.run.dir={tmp_path / 'run'}"]
    code, out = _main([*map(filled, argv), *run], tmp_path, monkeypatch, capsys)
    _refused(code, out, *map(filled, needles))
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()
