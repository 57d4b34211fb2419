"""One run-folder writer (issue 45, part C): every task places its files through a
:class:`~dptrain.runfolder.folder.RunFolder`, which writes the report's file list, FILES.txt and the
digests; no task writes a manifest itself, and the privacy report holds no list of a training
folder's files."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from dptrain.privacy import report as privacy_report
from dptrain.runfolder import folder as folder_module
from dptrain.runfolder import runlock, verify
from dptrain.runfolder.folder import Report, RunFolder

REPO = Path(__file__).resolve().parents[1]


def _sections(text: str) -> tuple[str, str]:
    """(FILES.txt's publishable part, its private part)."""
    head, _, private = text.partition("\nPRIVATE:")
    return head.split("SHA-256")[0], private


def _small_run(path: Path, *, finite: bool) -> tuple[RunFolder, dict]:
    """A run that places one file of each kind, through the writer only."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text("task: x\n")
    folder = RunFolder(path)
    folder.write_text("model.csv", "w\n1\n", "the model (covered)")
    folder.publishable("tables/", "the released tables")
    folder.write_text("tables/a.csv", "x,count\n1,5\n")
    folder.write_json("metrics.json", {"acc": 0.9}, "every metric", private=True)
    folder.record({"private/diag.json": "counts"})
    (path / "private" / "diag.json").write_text("{}")
    body = {"guarantee": "(1, 1e-06)-DP", "epsilon": 1.0}
    folder.finish(guarantee=body["guarantee"], finite_guarantee=finite,
                  report=Report("privacy.json", body, "this report", text=lambda b: b["guarantee"] + "\n",
                                listing=True))
    return folder, body


def test_the_folder_writes_the_report_list_files_txt_and_digests(tmp_path):
    """What a task places is what the report lists, FILES.txt lists and the digests cover: the
    publishable files at the top (the report first), the private ones under private/, the folder's
    own entries (FILES.txt, .hydra/, the log) added by the folder; verify and the export agree."""
    run = tmp_path / "run"
    _, body = _small_run(run, finite=True)
    saved = json.loads((run / "privacy.json").read_text())
    assert list(saved["files"]["publishable"]) == ["privacy.json, privacy.txt", "model.csv", "tables/", "FILES.txt",
                                                   ".hydra/"]
    assert list(saved["files"]["private"]) == ["private/metrics.json", "private/diag.json", "private/dptrain.log"]
    assert body["files"] == saved["files"]  # the task's report dict holds the same list
    assert set(saved["sha256"]) == {"model.csv", "tables/a.csv", "privacy.txt", ".hydra/config.yaml"}
    assert saved["export"]["files"] == sorted(["FILES.txt", "privacy.json", "privacy.txt", "model.csv",
                                               "tables/a.csv", ".hydra/config.yaml"])
    top, private = _sections((run / "FILES.txt").read_text())
    for name in saved["files"]["publishable"]:
        assert name in top
    for name in saved["files"]["private"]:
        assert name in private and name not in top
    assert (run / "privacy.txt").read_text() == "(1, 1e-06)-DP\n"
    assert (run / "private" / "metrics.json").is_file() and not (run / "metrics.json").exists()
    rows, ok = verify.verify_run(run)
    assert ok, rows


def test_without_a_finite_guarantee_nothing_computed_from_rows_is_publishable(tmp_path):
    run = tmp_path / "run"
    _small_run(run, finite=False)
    saved = json.loads((run / "privacy.json").read_text())
    assert saved["export"] == {**saved["export"], "finite_guarantee": False, "files": []}
    top, _ = _sections((run / "FILES.txt").read_text())
    shown = top.split("NOT PUBLISHABLE")[0]
    assert "FILES.txt" in shown and ".hydra/" in shown
    assert "model.csv" not in shown and "tables/" not in shown and "privacy.json" not in shown
    assert "model.csv" in top.split("NOT PUBLISHABLE")[1]


@pytest.mark.parametrize("entry", ["private/x.csv", "FILES.txt", ".hydra/", "../x.csv", "/tmp/x.csv", ""])
def test_a_publishable_file_cannot_be_placed_outside_the_top(entry, tmp_path):
    with pytest.raises(ValueError):
        RunFolder(tmp_path).publishable(entry, "why")


def test_every_file_is_placed_with_a_description(tmp_path):
    """A file written through the folder without a line of its own must fall under a folder
    entry already placed (tables/, .hydra/); nothing is written otherwise."""
    folder = RunFolder(tmp_path)
    with pytest.raises(ValueError, match="no description"):
        folder.write_text("tables/a.csv", "x\n")
    with pytest.raises(ValueError, match="no description"):
        folder.write_text("notes.csv", "x\n", private=True)
    assert not list(tmp_path.rglob("*.csv"))
    folder.private("tables/other/", "another mechanism's tables")
    placed = folder.write_text("tables/other/a.csv", "x\n", private=True)
    assert placed == tmp_path / "private" / "tables" / "other" / "a.csv"
    assert folder.write_text(".hydra/resolved_config.yaml", "a: 1\n").is_file()
    assert folder.private("metrics.json", "every metric") == tmp_path / "private" / "metrics.json"
    assert folder.listing()["private"]["private/metrics.json"] == "every metric"


def test_the_command_line_opens_the_folder_the_task_writes_through(tmp_path):
    """RunFolder.open (the command line) takes the lock and is what RunFolder.of gives the task;
    close releases the lock and gives every file and folder the run's one start time."""
    run, started = tmp_path / "run", 1_600_000_000_000_000_000
    opened = RunFolder.open(run, started_ns=started)
    try:
        assert RunFolder.of(run) is opened and RunFolder.of(str(run) + "/") is opened
        assert runlock.start_snapshot(run) == {}  # the folder as the run found it: empty
        assert RunFolder.of(tmp_path / "other") is not RunFolder.of(tmp_path / "other")  # from Python: its own
        opened.write_text("a.csv", "x\n", "a file")
        opened.finish(guarantee="g", finite_guarantee=True)
    finally:
        opened.close()
    assert not folder_module._OPEN and not runlock._HELD
    assert not (run / "private" / "run.lock").exists()
    times = {p: p.stat().st_mtime_ns for p in [run, *run.rglob("*")]}
    assert set(times.values()) == {started}, times
    assert RunFolder.of(run) is not opened  # closed: a later run gets its own


def _calls(name: str, roots: list[Path], *, methods: bool = True) -> list[str]:
    """Where ``name`` is called (``methods`` False: as a function, not ``folder.name(...)``)."""
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    f = node.func
                    called = f.id if isinstance(f, ast.Name) else f.attr if methods and isinstance(f, ast.Attribute) \
                        else ""
                    if called == name:
                        out.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return out


def test_one_call_site_writes_a_manifest():
    """FILES.txt is written in one place (RunFolder.finish): no task, library module or script
    calls write_manifest, and no task module writes a file of its run folder but through the
    folder (dptrain check writes no run folder: its private report only)."""
    sites = _calls("write_manifest", [REPO / "dptrain", REPO / "scripts"])
    assert sites == [f"dptrain/runfolder/folder.py:{_finish_line()}"], sites
    tasks = [p for p in sorted((REPO / "dptrain" / "tasks").glob("*.py")) if p.name != "check.py"]
    for name in ("atomic_write_text", "write_json"):
        direct = [s for s in _calls(name, [REPO / "dptrain" / "tasks"], methods=False)
                  if s.split(":")[0] in {p.relative_to(REPO).as_posix() for p in tasks}]
        assert not direct, (name, direct)


def _finish_line() -> int:
    tree = ast.parse((REPO / "dptrain" / "runfolder" / "folder.py").read_text(encoding="utf-8"))
    finish = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "finish")
    return next(n.lineno for n in ast.walk(finish) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
                "write_manifest")


def test_the_privacy_report_holds_no_list_of_a_training_folders_files():
    """The file descriptions belong to the task that writes the files (tasks/outputs.py) and to the
    folder: privacy/report.py builds no file list, and a report it builds has none."""
    source = Path(privacy_report.__file__).read_text(encoding="utf-8")
    assert "files_section" not in source and '"model.pt"' not in source and "final weights" not in source
    mechanism = {"enabled": False, "noise_multiplier": 0.0, "engine": "fast", "dataset_size": 10,
                 "expected_batch_size": 2, "sample_rate": 0.2, "steps": 1, "epochs": 0.2}
    assert "files" not in privacy_report.build_report(mechanism=mechanism, epsilons=None, accountant="rdp", seed=0,
                                                      data_source="x")


def test_a_folder_the_run_did_not_write_into_is_left_without_a_lock(tmp_path):
    """A folder opened from Python (no command line) takes no lock and stamps nothing."""
    run = tmp_path / "run"
    folder = RunFolder.of(run)
    folder.write_text("a.csv", "x\n", "a file")
    os.utime(run / "a.csv", ns=(5, 5))
    folder.close()
    assert (run / "a.csv").stat().st_mtime_ns == 5 and not runlock._HELD
