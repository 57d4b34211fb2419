"""The light first check of ``python -m dptrain`` (dptrain.settings.launch): a mistake in the
command line is refused from the schemas alone (dptrain.settings.schemas), before the tasks,
torch and pandas are imported (issue 46, item 5); the time it saves is measured by
scripts/bench_refusal.py (docs/performance.md), not here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dptrain.release.oneshot import ONE_SHOT
from dptrain.settings import launch
from dptrain.settings.schemas.tables import ER_EE_BUILTINS
from dptrain.tasks import cli
from dptrain.tasks.registry import TASKS

REPO = Path(__file__).resolve().parents[1]
#: what the light check may not import: the tasks' heavy dependencies
HEAVY = ("torch", "pandas", "scipy", "sklearn", "matplotlib", "opacus", "dp_accounting", "tensorboard")

#: user mistakes and a piece of each one's refusal
MISTAKES = [
    (["trainer.epoch=2"], "trainer.epoch (did you mean trainer.epochs?)"),
    (["experiment=logit", "trainer.epochs=three"], "'three' is not a number"),
    (["data=tabel"], "data=tabel (did you mean data=table?)"),
    (["experiment=logit", "+bogus=1"], "bogus: not a setting of task=train"),
    (["++privacy.epsilon=1"], "privacy.epsilon (did you mean privacy.max_epsilon?)"),
    (["task=release", "trainer.epochs=3"], "trainer: not a setting of task=release"),
    (["task=tabulate", "tabulate.bin=3"], "tabulate.bin (did you mean tabulate.bins?)"),
    (["task=predict", "run=x", "trainer.epochs=3"], "trainer: not a setting of task=predict"),
    (["-m", "privacy.noise_multiplier=1,2", "trainer.epoch=3"], "did you mean trainer.epochs?"),
]

_PROBE = """
import json, sys
from dptrain.settings import launch
out = []
for argv in json.loads(sys.argv[1]):
    try:
        launch.check_before_tasks(argv)
        out.append([None, argv])
    except SystemExit as stop:
        out.append([stop.code, argv])
print(json.dumps({"results": out, "modules": sorted(sys.modules)}))
"""


def _probe(argvs: list[list[str]]) -> tuple[list, set[str], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argvs)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    return data["results"], set(data["modules"]), res.stderr


def test_every_mistake_is_refused_before_the_tasks_torch_and_pandas_load():
    """One process checks every mistake in turn: each exits 2 with one dptrain error line naming
    it, and at the end neither the tasks nor any heavy library has been imported."""
    results, modules, err = _probe([argv for argv, _ in MISTAKES] + [["experiment=logit", "trainer.epochs=2"]])
    assert [code for code, _ in results] == [2] * len(MISTAKES) + [None]
    lines = err.strip("\n").split("\n")
    assert len(lines) == len(MISTAKES) and all(line.startswith("dptrain: error: ") for line in lines), err
    for line, (_, needle) in zip(lines, MISTAKES):
        assert needle in line, (needle, line)
    assert "Traceback" not in err and "HYDRA_FULL_ERROR" not in err
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert heavy == [] and not any(m.startswith("dptrain.tasks") for m in modules), heavy
    assert {"dptrain.settings.schemas.train", "dptrain.settings.schemas.release", "hydra"} <= modules


def test_the_light_schemas_are_the_task_registrys_and_name_every_builtin_mechanism():
    """The light check composes with the same classes the tasks run with, and the help of
    lodes.publish lists the ER-EE mechanisms dptrain registers (without importing them)."""
    assert set(launch.SCHEMAS) <= set(TASKS)
    assert {name: TASKS.get(name).schema for name in launch.SCHEMAS} == launch.SCHEMAS
    assert len(launch.SCHEMAS) == 9
    builtin = [n for n in ONE_SHOT if ONE_SHOT.get(n).family == "er_ee"
               and type(ONE_SHOT.get(n)).__module__.startswith("dptrain.")]
    assert list(ER_EE_BUILTINS) == builtin


def test_a_good_command_line_is_composed_once(monkeypatch):
    """python -m dptrain checks a command line with the light schemas, then the command line's own
    check (dptrain.tasks.cli) does not compose the same one again."""
    calls = []
    real = launch.compose
    monkeypatch.setattr(launch, "compose", lambda **kw: calls.append(kw) or real(**kw))
    monkeypatch.setattr(launch, "_PASSED", set())
    argv = ["experiment=logit", "trainer.epochs=2", "seed=7"]
    launch.check_before_tasks(argv)
    cli.check_composition(argv)
    assert len(calls) == 1
    cli.check_composition([*argv, "trainer.batch_size=64"])  # another command line: composed
    assert len(calls) == 2


@pytest.mark.parametrize("argv", [["verify", "runs/x"], ["publish", "a", "b"], ["check", "data=table"],
                                  ["plugins=[no_such_module_46]", "trainer.epoch=2"]])
def test_subcommands_and_plugins_are_left_to_the_command_line(argv, monkeypatch, capsys):
    """The subcommands have no Hydra config; a command line with plugins is checked once they are
    imported (a plugin may add a task): the light check composes none of them."""
    monkeypatch.setattr(launch, "compose", lambda **kw: pytest.fail(f"composed {argv}"))
    launch.check_before_tasks(argv)
    assert capsys.readouterr().err == ""


def test_the_entry_module_checks_before_it_imports_the_tasks():
    """dptrain/__main__.py: the light check at module level, then the tasks' import (no import in a
    function: docs/architecture.md)."""
    text = (REPO / "dptrain" / "__main__.py").read_text()
    assert text.index("check_before_tasks(sys.argv[1:])") < text.index("from dptrain.tasks.cli import")


# ------------------------------------------------------------------------------ scripts/bench_refusal.py


def _bench():
    spec = importlib.util.spec_from_file_location("bench_refusal_under_test", REPO / "scripts" / "bench_refusal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_refusal_interleaves_the_two_commands_and_reports_their_ratio(monkeypatch, capsys, tmp_path):
    """The script alternates the import and the refusal, and prints each pair's ratio, the load, the
    thread settings and the medians (the processes are stand-ins here: no timing is measured)."""
    bench = _bench()
    calls = []

    def fake(args):
        calls.append(args)
        refusal = args[:2] == ["-m", "dptrain"]
        seconds = 1.0 if refusal else 4.0 + len(calls)
        return seconds, subprocess.CompletedProcess(args, 2 if refusal else 0, "",
                                                    "dptrain: error: trainer.epoch ...\n" if refusal else "")

    monkeypatch.setattr(bench, "timed", fake)
    assert bench.main(["-r", "3", "--json", str(tmp_path / "b.json")]) == 0
    kinds = ["refusal" if a[:2] == ["-m", "dptrain"] else "import" for a in calls]
    assert kinds == ["import", "refusal"] * 4  # a warm-up pair, then three pairs
    assert calls[1] == ["-m", "dptrain", "trainer.epoch=2"]
    out = capsys.readouterr().out
    assert "threads: OMP_WAIT_POLICY=" in out and out.count("load ") == 3
    s = json.loads((tmp_path / "b.json").read_text())["summary"]
    assert s["median_import_s"] == 9.0 and s["median_refusal_s"] == 1.0  # imports: 7, 9, 11 s
    assert abs(s["ratio_of_medians"] - 1 / 9) < 1e-12 and abs(s["median_of_ratios"] - 1 / 9) < 1e-12


def test_bench_refusal_stops_when_the_mistake_is_not_refused(monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "timed", lambda args: (1.0, subprocess.CompletedProcess(args, 0, "", "")))
    with pytest.raises(SystemExit, match="trainer.epochs=2 was not refused"):
        bench.main(["-r", "1", "--", "trainer.epochs=2"])
