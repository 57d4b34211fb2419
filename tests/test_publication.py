"""A run owns its folder, its report lists exactly what it wrote, and ``dptrain publish`` exports
exactly what the report covers (issue 43). Each of findings 1-4 is replayed as the attacker saw it
(a killed run's tables vouched by another run; a foreign file vouched, a planted file unnoticed; a
search's duration in file times; a non-private model listed as publishable)."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import dptrain.tasks.cli as cli
from dptrain.runfolder import verify
from dptrain.runfolder.folder import write_manifest
from dptrain.runfolder.tracking import write_json
from dptrain.tasks.tune import CandidateLaw

ROOT = Path(__file__).resolve().parents[1]
#: run A of finding 1, smaller: every 2-way marginal of five columns (10 tables) at epsilon 1
MARGINALS_A = ["experiment=adult_marginals", "tabulate.columns=[sex,race,age,workclass,education]"]
MARGINALS_B = ["experiment=adult_marginals", "tabulate.marginals=[[sex]]", "privacy.epsilon=0.5"]
QUICK = ["experiment=logit", "data=synthetic", "data.n_rows=3000", "trainer.epochs=1", "trainer.batch_size=100",
         "trainer.progress=false", "trainer.baseline=false", "logger.tensorboard=false"]
TUNE = ["task=tune", "data=synthetic", "data.n_rows=3000", "trainer.epochs=1", "trainer.batch_size=256",
        "trainer.progress=false", "logger.tensorboard=false", "privacy.target_epsilon=1", "tune=lr_clip"]


def _dptrain(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "dptrain", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` -> its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _publishable_section(files_txt: str) -> str:
    """FILES.txt's PUBLISHABLE section (its heading to the next blank line)."""
    return files_txt.split("\nPUBLISHABLE")[1].split("\n\n")[0]


# ------------------------------------------------------------------------------ finding 1


def test_a_killed_runs_tables_are_never_vouched_by_another_run(tmp_path, capsys):
    """Finding 1: run A (every 2-way marginal, epsilon 1) killed with its tables written, its lock
    file naming a dead process; run B (one table, epsilon 0.5) into the same folder took over the
    lock and vouched for all of A's tables. Now B is refused with nothing written; with
    overwrite=true A's files are removed first and B's report vouches for its one table; verify
    then fails on a planted file."""
    folder = tmp_path / "run"
    a = _dptrain(*MARGINALS_A, f"hydra.run.dir={folder}")
    assert a.returncode == 0, a.stderr[-2000:]
    tables = sorted(p.name for p in (folder / "tables").iterdir())
    assert len(tables) == 10
    for name in ("privacy.json", "privacy.txt", "FILES.txt", *tables[6:]):  # A was killed after 6 tables
        (folder / ("tables/" + name if name.endswith(".csv") else name)).unlink()
    if (folder / "private" / "hydra.yaml").is_file():  # a killed run leaves Hydra's record in .hydra/
        (folder / "private" / "hydra.yaml").rename(folder / ".hydra" / "hydra.yaml")
    (folder / "private" / "run.lock").write_text("pid 4194303 on host gone\n")
    before = _tree(folder)

    b = _dptrain(*MARGINALS_B, f"hydra.run.dir={folder}")
    assert b.returncode == 2, (b.stdout, b.stderr)
    assert "refused, nothing was written" in b.stderr and "tables/" in b.stderr and "overwrite=true" in b.stderr
    assert _tree(folder) == before  # not one byte written or removed

    b = _dptrain(*MARGINALS_B, f"hydra.run.dir={folder}", "overwrite=true")
    assert b.returncode == 0, b.stderr[-2000:]
    report = json.loads((folder / "privacy.json").read_text())
    assert report["epsilon"] == pytest.approx(0.5, abs=1e-3)
    assert sorted(p.name for p in (folder / "tables").iterdir()) == ["sex.csv"]
    assert set(report["sha256"]) == {".hydra/config.yaml", ".hydra/overrides.yaml", "privacy.txt", "tables/sex.csv"}
    assert set(verify.read_manifest_digests(folder)) == {*report["sha256"], "privacy.json"}
    assert not (folder / ".hydra" / "hydra.yaml").exists() and (folder / "private" / "hydra.yaml").is_file()
    check = _dptrain("verify", str(folder))
    assert check.returncode == 0, check.stdout
    export = _dptrain("publish", str(folder), str(tmp_path / "b.tar.gz"))
    assert export.returncode == 0 and "published 6 files" in export.stdout, export.stderr
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == sorted(
            [*report["sha256"], "privacy.json", "FILES.txt"])
    (folder / "tables" / "exact_counts.csv").write_text("sex,count\nFemale,16192\nMale,32650\n")
    assert verify.main([str(folder)]) == verify.EXIT_MISMATCH
    assert "UNLISTED   tables/exact_counts.csv" in capsys.readouterr().out


# ------------------------------------------------------------------------------ finding 2


def test_a_foreign_file_under_a_publishable_folder_is_never_vouched(tmp_path, caplog):
    """Finding 2: a file already under tables/ (exact counts) got a digest in the next run's
    FILES.txt and report, as a covered release. The command line now refuses such a folder (the
    test above); a run started from Python into it never vouches for the file: FILES.txt names it
    NOT VOUCHED, the log says so, verify and publish fail until it is removed."""
    folder = tmp_path / "run"
    (folder / "tables").mkdir(parents=True)
    (folder / "tables" / "exact.csv").write_text("sex,count\nFemale,16192\n")
    cli.run(_compose(MARGINALS_B), run_dir=folder)
    report = json.loads((folder / "privacy.json").read_text())
    assert set(report["sha256"]) == {"privacy.txt", "tables/sex.csv"}
    assert "tables/exact.csv" not in verify.read_manifest_digests(folder)
    assert "tables/exact.csv" not in report["export"]["files"]
    files = (folder / "FILES.txt").read_text()
    assert "tables/exact.csv" in files.split("NOT VOUCHED")[1].split("\n\n")[0]
    assert "not vouched for" in caplog.text and "tables/exact.csv" in caplog.text
    rows, ok = verify.verify_run(folder)
    assert not ok and [r[1] for r in rows if r[0] == "tables/exact.csv"] == ["UNLISTED"]
    assert (folder / "tables" / "exact.csv").read_text() == "sex,count\nFemale,16192\n"  # never removed


def test_a_file_the_run_left_untouched_is_never_vouched(tmp_path, caplog):
    """Finding 2, the report's side: a resumed run may start in a folder holding files (here one
    under .hydra/, a publishable entry, which the old code hashed into the report). The report
    vouches only for files this run wrote; FILES.txt names the other as NOT VOUCHED, the log says
    so, and verify fails on it until it is removed."""
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "exact_counts.yaml").write_text("Female: 16192\n")
    cli.run(_compose([*QUICK, "trainer.resume=auto"]), run_dir=folder)
    report = json.loads((folder / "privacy.json").read_text())
    assert ".hydra/exact_counts.yaml" not in report["sha256"] and "model.pt" in report["sha256"]
    assert ".hydra/exact_counts.yaml" not in report["export"]["files"]
    files = (folder / "FILES.txt").read_text()
    assert "NOT VOUCHED" in files and ".hydra/exact_counts.yaml" in files.split("NOT VOUCHED")[1]
    assert "not vouched for" in caplog.text
    rows, ok = verify.verify_run(folder)
    assert not ok and ("UNLISTED" in dict((r[0], r[1]) for r in rows)[".hydra/exact_counts.yaml"])
    (folder / ".hydra" / "exact_counts.yaml").unlink()
    assert verify.verify_run(folder)[1]


def _small_run(folder: Path) -> None:
    """A folder written by write_manifest: a report, one table, .hydra/."""
    (folder / "tables").mkdir(parents=True)
    (folder / "tables" / "a.csv").write_text("x,count\n1,5\n")
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("task: tabulate\n")
    write_json(folder / "privacy.json", {"guarantee": "(1, 1e-06)-DP", "epsilon": 1.0})
    write_manifest(folder, publishable={"privacy.json": "the report", "tables/": "the tables", "FILES.txt": "this",
                                        ".hydra/": "the settings"}, private={}, guarantee="(1, 1e-06)-DP",
                   report="privacy.json", finite_guarantee=True)


def test_verify_fails_on_a_file_added_later_and_on_lists_that_disagree(tmp_path):
    """Finding 2: verify checked the listed names only. Now a file added after the run fails
    (UNLISTED), and so does a FILES.txt that lists a file the report does not (NOT IN REPORT),
    which the old verify accepted whenever the file matched FILES.txt's own digest."""
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "a.csv").write_text("x,count\n1,5\n")
    body = {"guarantee": "(1, 1e-06)-DP", "sha256": verify.digests(tmp_path, ["tables/a.csv"]),
            "export": {"finite_guarantee": True, "files": ["FILES.txt", "privacy.json", "tables/a.csv"]}}
    (tmp_path / "privacy.json").write_text(json.dumps(body))
    digests = verify.digests(tmp_path, ["tables/a.csv", "privacy.json"])
    (tmp_path / "FILES.txt").write_text("Files\n" + "\n".join(verify.manifest_lines(digests)) + "\n")
    rows, ok = verify.verify_run(tmp_path)
    assert ok, rows
    (tmp_path / "tables" / "b.csv").write_text("x,count\n1,3\n")
    rows, ok = verify.verify_run(tmp_path)
    assert not ok and ("tables/b.csv", "UNLISTED") in [(r[0], r[1]) for r in rows]
    manifest = (tmp_path / "FILES.txt").read_text()
    line = f"  {verify.sha256_of(tmp_path / 'tables' / 'b.csv')}  tables/b.csv"
    (tmp_path / "FILES.txt").write_text(manifest.replace(verify.DIGEST_HEADER, verify.DIGEST_HEADER + "\n" + line))
    rows, ok = verify.verify_run(tmp_path)
    assert not ok and ("tables/b.csv", "NOT IN REPORT") in [(r[0], r[1]) for r in rows]
    (tmp_path / "tables" / "b.csv").unlink()
    (tmp_path / "FILES.txt").write_text(manifest)
    assert verify.verify_run(tmp_path)[1]
    body["export"]["files"].append("tables/ghost.csv")  # a report naming a file no digest covers
    (tmp_path / "privacy.json").write_text(json.dumps(body))
    assert ("tables/ghost.csv", "NOT VOUCHED") in [(r[0], r[1]) for r in verify.verify_run(tmp_path)[0]]
    (tmp_path / "FILES.txt").unlink()  # the report was written with it
    assert ("FILES.txt", "MISSING") in [(r[0], r[1]) for r in verify.verify_run(tmp_path)[0]]


# ------------------------------------------------------------------------------ the claim, unit by unit


def test_the_claim_reads_the_folder_and_overwrite_empties_only_run_folders(tmp_path):
    from dptrain.runfolder import ownership

    run = tmp_path / "run"
    ownership.check_claim(run, key="hydra.run.dir", overwrite=False, resume=False, differences=None)  # absent: new
    (run / ".hydra").mkdir(parents=True)
    for name in ownership.HYDRA_LAUNCH_FILES:  # Hydra rewrites them at every launch
        (run / name).write_text("x")
    (run / "private").mkdir()
    (run / "private" / "checkpoint.pt").write_bytes(b"state")  # private leftovers are never vouched
    ownership.check_claim(run, key="hydra.run.dir", overwrite=False, resume=False, differences=None)
    (run / "model.pt").write_bytes(b"w")
    with pytest.raises(ownership.FolderNotOwned, match="model.pt"):
        ownership.check_claim(run, key="hydra.run.dir", overwrite=False, resume=False, differences=None)
    ownership.check_claim(run, key="hydra.run.dir", overwrite=False, resume=True, differences=[])
    with pytest.raises(ownership.FolderNotOwned, match="optim.lr differ"):
        ownership.check_claim(run, key="hydra.run.dir", overwrite=False, resume=True, differences=["optim.lr"])
    with pytest.raises(ownership.FolderNotOwned, match="config.yaml is missing"):
        ownership.check_claim(run, key="hydra.run.dir", overwrite=False, resume=True, differences=None)
    ownership.check_claim(run, key="hydra.run.dir", overwrite=True, resume=False, differences=None)
    (run / "private" / "run.lock").write_text("")
    removed = ownership.empty_run_folder(run)
    assert set(removed) == {".hydra", "model.pt", "private/checkpoint.pt"}
    assert _tree(run) == {"private/run.lock": b""}
    mine = tmp_path / "notes"  # not a run folder: overwrite never empties it
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    with pytest.raises(ownership.FolderNotOwned, match="not a run folder"):
        ownership.check_claim(mine, key="hydra.run.dir", overwrite=True, resume=False, differences=None)
    assert ownership.config_differences({"a": 1, "trainer": {"resume": None, "lr": 1}, "overwrite": False},
                                        {"a": 1, "trainer": {"resume": "auto", "lr": 2}, "overwrite": True}) == \
        ["trainer.lr"]
    # a budget is a stop condition: a run stopped by privacy.max_epsilon resumes under another one or
    # none (tests/test_distributed.py resumes that way); any other privacy setting is another run
    assert ownership.config_differences({"privacy": {"max_epsilon": 0.5, "noise_multiplier": 1.0}},
                                        {"privacy": {"max_epsilon": None, "noise_multiplier": 1.0}}) == []
    assert ownership.config_differences({"privacy": {"max_epsilon": 0.5, "noise_multiplier": 1.0}},
                                        {"privacy": {"max_epsilon": 0.5, "noise_multiplier": 2.0}}) == \
        ["privacy.noise_multiplier"]


def test_a_resume_of_another_configuration_is_refused(tmp_path):
    """trainer.resume into a folder holding a finished run of other settings (a learning rate the
    checkpoint's own check lets through) is refused, nothing written; the same settings resume."""
    folder = tmp_path / "run"
    assert _dptrain(*QUICK, f"hydra.run.dir={folder}").returncode == 0
    before = _tree(folder)
    other = _dptrain(*QUICK, "optim.lr=0.5", "trainer.resume=auto", f"hydra.run.dir={folder}")
    assert other.returncode == 2 and "optim.lr" in other.stderr and "another configuration" in other.stderr
    assert _tree(folder) == before
    same = _dptrain(*QUICK, "trainer.resume=auto", f"hydra.run.dir={folder}")
    assert same.returncode == 0, same.stderr[-2000:]
    assert verify.verify_run(folder)[1]


# ------------------------------------------------------------------------------ finding 4


@pytest.mark.parametrize("override", ["privacy.enabled=false", "privacy.noise_multiplier=0"])
def test_a_run_without_a_finite_epsilon_lists_nothing_computed_from_rows_as_publishable(tmp_path, override):
    """Finding 4: with privacy off or sigma = 0 (epsilon inf), FILES.txt said "Guarantee: none" and
    then listed model.pt and coefficients.csv as PUBLISHABLE; verify passed. Now only the settings
    and the list are publishable, privacy.txt says so, the report's export is empty, verify checks
    the files' integrity, and publish refuses the run."""
    folder = tmp_path / "run"
    cli.run(_compose([*QUICK, override]), run_dir=folder)
    files = (folder / "FILES.txt").read_text()
    shown = _publishable_section(files)
    assert "Guarantee: none" in files and "nothing computed from private rows" in shown
    for name in ("model.pt", "coefficients.csv", "metrics.json", "privacy.json"):
        assert name not in shown and name in files.split("NOT PUBLISHABLE")[1]
    assert "may be PUBLISHED" not in (folder / "privacy.txt").read_text()
    report = json.loads((folder / "privacy.json").read_text())
    assert report["export"] == {**report["export"], "finite_guarantee": False, "files": []}
    assert verify.verify_run(folder)[1]
    from dptrain.runfolder.publish import PublishRefused, publish

    with pytest.raises(PublishRefused, match="no finite-epsilon guarantee"):
        publish(folder, tmp_path / "out.tar.gz")
    assert not (tmp_path / "out.tar.gz").exists()


# ------------------------------------------------------------------------------ finding 3 and the export


def _tune_run(folder: Path, k: int, monkeypatch) -> None:
    """task=tune with K = k candidates, each made 0.4 s longer (so the search's duration grows with K)."""
    import dptrain.tasks.tune as tune

    original = tune.fit

    def slow_fit(*args, **kwargs):
        time.sleep(0.4)
        return original(*args, **kwargs)

    monkeypatch.setattr(CandidateLaw, "sample", lambda self, rng: k)
    monkeypatch.setattr(tune, "fit", slow_fit)
    cli.run(_compose(TUNE), run_dir=folder)


def test_a_tune_export_carries_one_fixed_time_and_is_byte_identical(tmp_path, monkeypatch):
    """Finding 3: every file of a search's folder had one mtime, but ctime - mtime was the search's
    duration (corr with K 0.991) and `tar --format=posix` carries ctime. The run folder still has
    it (no program can set a ctime); the export has none: every tar entry has the one fixed time,
    no pax header (no atime, ctime, owner), fixed modes, a gzip header without time or name, no
    file of the export holds the run's start; the same run exported twice is byte-identical; a
    folder export has the fixed mtime and atime on every file and folder."""
    from dptrain.runfolder.publish import DIR_MODE, FILE_MODE, FIXED_TIME, publish

    durations = {}
    for k in (1, 4):
        folder = tmp_path / f"k{k}"
        _tune_run(folder, k, monkeypatch)
        model = (folder / "model.pt").stat()
        durations[k] = (model.st_ctime_ns - model.st_mtime_ns) / 1e9
        first, second = tmp_path / f"k{k}-1.tar.gz", tmp_path / f"k{k}-2.tar.gz"
        names = publish(folder, first)
        publish(folder, second)
        assert first.read_bytes() == second.read_bytes()
        raw = first.read_bytes()
        assert raw[4:8] == b"\0\0\0\0" and raw[3] & 0x08 == 0  # gzip: MTIME 0, no FNAME
        with tarfile.open(first) as tar:
            members = tar.getmembers()
            assert [m.name for m in members] == sorted(m.name for m in members)
            assert {m.name for m in members if m.isfile()} == set(names)
            for m in members:
                assert m.mtime == FIXED_TIME and m.pax_headers == {} and (m.uid, m.gid, m.uname, m.gname) == (0, 0,
                                                                                                              "", "")
                assert m.mode == (DIR_MODE if m.isdir() else FILE_MODE)
            contents = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}
        assert {"model.pt", "privacy.json", "FILES.txt", ".hydra/resolved_config.yaml"} <= set(contents)
        assert ".hydra/hydra.yaml" not in contents and not any(n.startswith("private/") for n in contents)
        assert not any(str(folder).encode() in data for data in contents.values())  # no run folder name or start
        assert first.stat().st_mtime == FIXED_TIME
        exported = tmp_path / f"k{k}-folder"
        publish(folder, exported)
        folders = {exported / parent for n in contents for parent in Path(n).parents}
        for path in [*folders, *(exported / n for n in contents)]:  # stat only: reading a folder moves its atime
            st = path.stat()
            assert st.st_mtime == st.st_atime == FIXED_TIME, path
            assert stat.S_IMODE(st.st_mode) == (DIR_MODE if path.is_dir() else FILE_MODE)
        assert _tree(exported) == contents and verify.verify_run(exported)[1]
    assert durations[4] > durations[1] + 1.0  # the leak the folder keeps: why the export, not the folder, leaves
    with gzip.open(tmp_path / "k1-1.tar.gz") as a, gzip.open(tmp_path / "k4-1.tar.gz") as b:
        assert a.read()[:512][136:148] == b.read()[:512][136:148]  # the first entry's mtime field: the same


def test_publish_refuses_what_it_cannot_vouch_for_and_writes_nothing(tmp_path):
    from dptrain.runfolder.publish import PublishRefused, main, publish

    run = tmp_path / "run"
    _small_run(run)
    (run / "tables" / "planted.csv").write_text("x\n")
    with pytest.raises(PublishRefused, match="does not verify.*planted.csv UNLISTED"):
        publish(run, tmp_path / "a.tar.gz")
    (run / "tables" / "planted.csv").unlink()
    with pytest.raises(PublishRefused, match="inside the run folder"):
        publish(run, run / "export.tar.gz")
    (tmp_path / "taken").mkdir()
    with pytest.raises(PublishRefused, match="exists"):
        publish(run, tmp_path / "taken")
    body = json.loads((run / "privacy.json").read_text())
    del body["export"]
    (run / "privacy.json").write_text(json.dumps(body))  # a report from before exports: it no longer verifies
    with pytest.raises(PublishRefused, match="does not verify"):
        publish(run, tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "taken"]
    assert main([str(run)]) == 2 and main([str(run), str(tmp_path / "c")]) == 2


def test_a_release_without_a_guarantee_lists_nothing_computed_from_rows_as_publishable(tmp_path):
    """Finding 4 for a release: MOS is NOT differentially private, so release.csv and release.json
    are NOT publishable, the export is empty and publish refuses; a DP method's release is."""
    from dptrain.runfolder.publish import PublishRefused, publish

    for method, covered in (("mos", False), ("dp_mos", True)):
        folder = tmp_path / method
        cli.run(_compose(["experiment=mos_atlas", "data.n_cells=200", "release.private_evaluation=false",
                          f"release.method={method}"]), run_dir=folder)
        files = (folder / "FILES.txt").read_text()
        report = json.loads((folder / "release.json").read_text())
        assert ("release.csv" in _publishable_section(files)) is covered
        assert report["export"]["finite_guarantee"] is covered and bool(report["export"]["files"]) is covered
        assert verify.verify_run(folder)[1]
        if covered:
            assert set(publish(folder, tmp_path / f"{method}.tar.gz")) == {"release.csv", "release.json", "FILES.txt"}
        else:
            assert "NOT differentially private" in files.split("\n\n")[1]
            with pytest.raises(PublishRefused, match="no finite-epsilon guarantee"):
                publish(folder, tmp_path / f"{method}.tar.gz")
