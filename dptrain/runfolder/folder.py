"""One writer for a run folder: :class:`RunFolder` places each file a run writes, says what it is,
and writes the folder's file list (FILES.txt), its digests and its report's file list.

A task states what it publishes; it never writes FILES.txt itself:

* the command line opens the folder once per run (:meth:`RunFolder.open`): it takes the folder's
  lock (:mod:`dptrain.runfolder.runlock`), records the folder as the run found it (files it leaves
  untouched are never vouched for: :mod:`dptrain.runfolder.ownership`) and the run's start, the
  one time every file gets when the run ends (:meth:`RunFolder.close`);
* the task gets that folder with :meth:`RunFolder.of` (a task called from Python, without the
  command line, gets a folder of its own: no lock, no time stamp), places each file with a
  one-line description, either publishable, at the top (:meth:`RunFolder.publishable`), or
  private, under ``private/`` (:meth:`RunFolder.private`), or writes it through the folder
  (:meth:`RunFolder.write_text`, :meth:`RunFolder.write_json`);
* it ends with :meth:`RunFolder.finish`: the report (privacy.json, release.json or audit.json,
  with its text twin and, when asked, the folder's file list under ``files``), then FILES.txt with
  the SHA-256 of every file the run wrote outside ``private/`` (:func:`write_manifest`, called
  there and nowhere else).

The folder describes what it owns itself: FILES.txt, ``.hydra/`` (the configuration), the run's
log (``private/dptrain.log``) and Hydra's record of the launch (moved to ``private/hydra.yaml``).
Nothing computed from private rows is listed as publishable unless the run states a finite-epsilon
guarantee (``finite_guarantee``): without one, only :data:`PUBLIC_ENTRIES` are.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dptrain.runfolder import ownership, runlock, verify
from dptrain.runfolder.tracking import atomic_write_text, stamp_times, write_json

PRIVATE_DIR, MANIFEST = verify.PRIVATE_DIR, verify.MANIFEST
log = logging.getLogger("dptrain")

#: publishable entries computed from public information only (still publishable without a guarantee)
PUBLIC_ENTRIES = (".hydra/", MANIFEST)
HYDRA_RECORD_NOTE = ("Hydra's record of the launch: this machine's paths and the run folder's name, which holds "
                     "the run's start time")
#: the entries every run folder has, described by the folder itself
SETTINGS_ENTRY, SETTINGS_NOTE = ".hydra/", "the configuration (the command line; holds no secret and no private value)"
LOG_ENTRY, LOG_NOTE = f"{PRIVATE_DIR}/dptrain.log", "the run's log"
MANIFEST_NOTE = "this list"


def take_lock(path: str | Path) -> runlock.RunLock:
    """The exclusive lock of the run folder ``path`` (taken, or reused in this process), with a
    warning naming the owner when a dead run's lock was taken over."""
    lock = runlock.acquire(path)
    message = runlock.took_over_message(lock)
    if message:
        log.warning("%s", message)
    return lock


@dataclass(frozen=True)
class Report:
    """The report a run's files are vouched by (module docstring): ``name`` (privacy.json, ...),
    its ``body``, the line FILES.txt gives it (``why``), ``text`` (the body -> its human-readable
    twin, ``<stem>.txt``; None: no twin) and ``listing`` (put the folder's file list into the body
    under ``files`` before it is written)."""

    name: str
    body: dict[str, Any]
    why: str
    text: Callable[[dict[str, Any]], str] | None = None
    listing: bool = False

    @property
    def entry(self) -> str:
        return f"{self.name}, {self.twin}" if self.text is not None else self.name

    @property
    def twin(self) -> str:
        return f"{PurePosixPath(self.name).stem}.txt"


_OPEN: dict[Path, RunFolder] = {}


class RunFolder:
    """One run's folder and the description of every file placed in it (module docstring)."""

    def __init__(self, path: str | Path, *, run_log: bool = True) -> None:
        self.path, self.run_log = Path(path), run_log  # run_log False: no run's log (a script's folder)
        self._top: dict[str, str] = {}
        self._private: dict[str, str] = {}
        self._kept: dict[str, str] = {}
        self._lock: runlock.RunLock | None = None
        self.started_ns: int | None = None

    # ------------------------------------------------------------------ the command line's side

    @classmethod
    def open(cls, path: str | Path, *, started_ns: int | None = None) -> RunFolder:
        """The run's folder, opened by the command line: its lock taken (or reused), the folder as
        the run found it recorded, ``started_ns`` (default now) kept for :meth:`close`."""
        folder = cls(path)
        folder._lock = take_lock(folder.path)
        folder._lock.mark_start()
        folder.started_ns = time.time_ns() if started_ns is None else started_ns
        _OPEN[folder.path.resolve()] = folder
        return folder

    @classmethod
    def of(cls, path: str | Path) -> RunFolder:
        """The folder the command line opened at ``path``, or a new one (a task called from
        Python: no lock, no time stamp; every file of its publishable area counts as its own)."""
        return _OPEN.get(Path(path).resolve()) or cls(path)

    def discard(self) -> None:
        """A refused run: remove what taking the lock created (a folder this launch made)."""
        if self._lock is not None and self._lock.created:
            self._lock.discard()

    def close(self) -> None:
        """Release the lock, then give every file and folder the run's start as its one time
        (:func:`dptrain.runfolder.tracking.stamp_times`); removing the lock file moves a time."""
        _OPEN.pop(self.path.resolve(), None)
        if self._lock is not None:
            self._lock.release()
            stamp_times(self.path, self.started_ns)

    # ------------------------------------------------------------------ the task's side

    def publishable(self, entry: str, why: str) -> Path:
        """Place ``entry`` at the top of the folder, publishable when the run has a finite-epsilon
        guarantee: a file (``model.pt``), a folder (``tables/``) or files sharing one line
        (``summary.csv, summary.md``). Returns the path of its (first) file or folder."""
        return self._place(self._top, entry, why, top=True)

    def private(self, name: str, why: str) -> Path:
        """Place ``name`` (relative to ``private/``: ``metrics.json``, ``tb/``) under ``private/``:
        kept with the data, never published. Returns its path."""
        return self._place(self._private, f"{PRIVATE_DIR}/{name}", why, top=False)

    def kept(self, entry: str, why: str) -> Path:
        """Place ``entry`` at the top of the folder, never published (digested, not exported)."""
        return self._place(self._kept, entry, why, top=True)

    def note(self, entry: str, why: str) -> None:
        """A line of the private list that names no file of this folder (a sweep's job folders:
        each has its own FILES.txt)."""
        self._private[entry] = why

    def record(self, entries: dict[str, str]) -> None:
        """Files a library function wrote and described (``{"private/data_diagnostics.json": why}``):
        placed by their names (under ``private/``: private; else publishable)."""
        for name, why in entries.items():
            if name.startswith(f"{PRIVATE_DIR}/"):
                self.private(name[len(PRIVATE_DIR) + 1:], why)
            else:
                self.publishable(name, why)

    def write_text(self, name: str, text: str, why: str | None = None, *, private: bool = False) -> Path:
        """Write ``text`` atomically to ``name`` (relative to the top, or to ``private/``),
        placing it with ``why``; ``why`` may be left out for a file inside a folder entry already
        placed (``tables/a.csv`` under ``tables/``; ``.hydra/...``, the folder's own)."""
        path = self._path_for(name, why, private=private)
        atomic_write_text(path, text)
        return path

    def write_json(self, name: str, body: dict[str, Any], why: str | None = None, *, private: bool = False) -> Path:
        """:meth:`write_text` of strict JSON (:func:`dptrain.runfolder.tracking.write_json`)."""
        path = self._path_for(name, why, private=private)
        write_json(path, body)
        return path

    def listing(self) -> dict[str, dict[str, str]]:
        """The file list a report holds (``files``): the publishable entries then FILES.txt and
        ``.hydra/``; the private ones then the log."""
        return {"publishable": {**self._top, MANIFEST: MANIFEST_NOTE, **self._settings()},
                "private": {**self._private, **({LOG_ENTRY: LOG_NOTE} if self.run_log else {})}}

    def finish(self, *, guarantee: str, finite_guarantee: bool, report: Report | None = None) -> None:
        """Write the report (``report``: first in the list, with the folder's file list when it
        asks for it), then FILES.txt with the digests of what the run wrote (:func:`write_manifest`).
        ``finite_guarantee`` False: nothing computed from private rows is listed as publishable."""
        if report is not None:
            self._top = {report.entry: report.why, **self._top}
            if report.listing:  # the task's report dict holds it too (privacy.txt shows it)
                report.body["files"] = self.listing()
            write_json(self.path / report.name, report.body)
            if report.text is not None:
                atomic_write_text(self.path / report.twin, report.text(report.body))
        files = self.listing()
        write_manifest(self.path, publishable=files["publishable"], private=files["private"], guarantee=guarantee,
                       finite_guarantee=finite_guarantee, report=None if report is None else report.name,
                       kept=self._kept or None)

    # ------------------------------------------------------------------ helpers

    def _settings(self) -> dict[str, str]:
        return {SETTINGS_ENTRY: SETTINGS_NOTE} if (self.path / SETTINGS_ENTRY).is_dir() else {}

    def _place(self, entries: dict[str, str], entry: str, why: str, *, top: bool) -> Path:
        first = entry.split(",")[0].strip()
        parts = PurePosixPath(first).parts
        if not first or PurePosixPath(first).is_absolute() or ".." in parts or not why:
            raise ValueError(f"run folder entry {entry!r}: a relative path inside the folder, with a description")
        if top and (parts[0] == PRIVATE_DIR or first in (MANIFEST, SETTINGS_ENTRY)):
            raise ValueError(f"run folder entry {entry!r}: not at the top (private/ and the folder's own files "
                             "are placed by the folder)")
        entries[entry] = why
        path = self.path / first
        path.parent.mkdir(parents=True, exist_ok=True)  # a folder entry is made by what writes into it
        return path

    def _path_for(self, name: str, why: str | None, *, private: bool) -> Path:
        listed = f"{PRIVATE_DIR}/{name}" if private else name
        if why is not None:
            return self.private(name, why) if private else self.publishable(name, why)
        folders = [*self._top, *self._private, *self._kept, SETTINGS_ENTRY]
        if not any(e.endswith("/") and listed.startswith(e) for e in folders):
            raise ValueError(f"run folder file {listed!r}: no description, and no folder entry holds it")
        path = self.path / listed
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def write_manifest(run_dir: Path, *, publishable: dict[str, str], private: dict[str, str], guarantee: str,
                   finite_guarantee: bool, report: str | None = None, kept: dict[str, str] | None = None) -> None:
    """``FILES.txt`` (:meth:`RunFolder.finish` writes it; nothing else does): which files of the run
    folder may be published and which must stay with the data, one line each with the reason, then
    the SHA-256 of every file this run wrote outside private/ (:mod:`dptrain.runfolder.verify`).
    ``publishable`` / ``private`` map a path relative to the run folder to a one-line description.
    ``report`` (e.g. "privacy.json"): the report that vouches for the other files; their digests are
    added to it (key ``sha256``), and what ``dptrain publish`` exports (key ``export``), before its
    own digest is taken.

    Only files this run wrote are vouched: those that were in the folder when it took its lock and
    that it left untouched are not (:mod:`dptrain.runfolder.ownership`). ``finite_guarantee``
    False (privacy off, no noise, a method without a guarantee): nothing computed from private
    rows is listed as publishable (only :data:`PUBLIC_ENTRIES`) and nothing is exported. ``kept``:
    files outside private/ that are not published (described, digested, never exported)."""
    run_dir = Path(run_dir)
    if ownership.move_hydra_record(run_dir):
        private = {**private, ownership.HYDRA_RECORD_PRIVATE: HYDRA_RECORD_NOTE}
    left = set(ownership.untouched(run_dir, runlock.start_snapshot(run_dir)))
    wrote = [f for f in verify.publishable_area(run_dir) if f != MANIFEST and f not in left]
    shown = {k: v for k, v in publishable.items() if finite_guarantee or k in PUBLIC_ENTRIES}
    withheld = {**{k: v for k, v in publishable.items() if k not in shown}, **(kept or {})}
    exported = set(verify.expand_publishable(run_dir, list(shown))) & set(wrote)
    undescribed = sorted(set(wrote) - set(verify.expand_publishable(run_dir, [*publishable, *(kept or {})])))
    if report is not None and (run_dir / report).is_file():
        covered = verify.digests(run_dir, [f for f in wrote if f != report])
        body = json.loads((run_dir / report).read_text(encoding="utf-8"))
        files = sorted({*exported, report, MANIFEST}) if finite_guarantee else []
        write_json(run_dir / report, {**body, "sha256": covered, "export": {
            "finite_guarantee": bool(finite_guarantee), "files": files, "rule": EXPORT_RULE}})
    _warn_unvouched(run_dir, sorted(left), undescribed)
    lines = [
        "Files of this run folder", "", f"Guarantee: {guarantee}", "",
        "PUBLISHABLE (covered by the guarantee above, or computed from public information only; a run with a report: "
        "export them with "
        "`dptrain publish RUN DEST`, never the folder itself):" if finite_guarantee else
        "PUBLISHABLE: nothing computed from private rows (no finite-epsilon guarantee covers this run; `dptrain "
        "publish` refuses it):",
        *[f"  {name:28s} {why}" for name, why in shown.items()],
        *_section("NOT PUBLISHABLE (kept for the data holder: their digests below check their integrity only; "
                  "without a finite-epsilon guarantee, everything computed from private rows):", withheld),
        *_section("NOT PUBLISHABLE (written by this run, not described by it: check before publishing):",
                  {f: "" for f in undescribed}),
        *_section("NOT VOUCHED (in this folder before the run started, not written by it: remove them; `dptrain "
                  "verify` fails while they are here):", {f: "" for f in sorted(left)}),
        *verify.manifest_lines(verify.digests(run_dir, wrote)),
        "",
        f"PRIVATE: keep with the data, never publish (everything under {PRIVATE_DIR}/):",
        *[f"  {name:28s} {why}" for name, why in private.items()],
        "",
        "Anything not listed (e.g. files added later) is private until you have checked it; `dptrain verify` fails "
        f"on any file outside {PRIVATE_DIR}/ that is not listed above.",
    ]
    atomic_write_text(run_dir / MANIFEST, "\n".join(lines) + "\n")


#: the report's ``export.rule``
EXPORT_RULE = ("dptrain publish RUN DEST exports exactly these files (verified against their digests first), with "
               "one fixed time, fixed modes and no owner; empty when no finite-epsilon guarantee covers the run")


def _section(title: str, entries: dict[str, str]) -> list[str]:
    return ["", title, *[f"  {name:28s} {why}".rstrip() for name, why in entries.items()]] if entries else []


def _warn_unvouched(run_dir: Path, left: list[str], undescribed: list[str]) -> None:
    if left:
        log.warning("run folder %s: %d file(s) outside %s/ were there before this run and are not vouched for "
                    "(dptrain verify fails while they are there): %s", run_dir, len(left), PRIVATE_DIR,
                    ", ".join(left[:5]))
    if undescribed:
        log.warning("run folder %s: this run wrote %d file(s) outside %s/ that its file list does not describe "
                    "(not exported): %s", run_dir, len(undescribed), PRIVATE_DIR, ", ".join(undescribed[:5]))
