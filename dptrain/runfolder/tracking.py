"""Run outputs: TensorBoard scalars, atomically written JSON / text artifacts, and the run
folder's split between files that may be published and files that must stay with the data.

Run folder layout (contract, see docs/privacy.md "Who sees what"):
  ``<run>/``          publishable files only (the privacy report, the model, covered metrics,
                      a release's release.csv / release.json) and ``FILES.txt``, which lists
                      every file with its status
  ``<run>/private/``  PRIVATE_DIR: everything computed from private rows without the mechanism's
                      protection (checkpoints with generator states, the log, TensorBoard
                      diagnostics, metrics on private rows, evaluations against exact values)

TensorBoard tag conventions (contract):
  ``test/*``                    metrics on the held-out test split (the numbers to quote)
  ``privacy/epsilon``           epsilon spent so far (RDP, every release so far included)
  ``dp/*``                      released with noise, their privacy cost in epsilon: covered by the
                                guarantee (dp/train_loss, dptrain.privacy.curves)
  ``diagnostics_nonprivate/*``  computed on PRIVATE training rows: NOT covered by the guarantee
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from dptrain.runfolder import ownership, runlock, verify


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash never leaves a truncated file: write a
    temporary file in the same folder, fsync, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


PRIVATE_DIR = verify.PRIVATE_DIR
MANIFEST = verify.MANIFEST
log = logging.getLogger("dptrain")


def private_dir(run_dir: Path) -> Path:
    """``<run_dir>/private``, created if needed: files that must stay with the data."""
    path = Path(run_dir) / PRIVATE_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


def private_log_handler(filename: str, mode: str = "a", encoding: str = "utf-8"):
    """The run log's file handler (conf/hydra/job_logging/dptrain.yaml): creates the private
    folder the log lives in, which Hydra does not."""
    Path(filename).parent.mkdir(parents=True, exist_ok=True)
    return logging.FileHandler(filename, mode=mode, encoding=encoding)


class ConsoleFormatter(logging.Formatter):
    """The console's format (conf/hydra/job_logging/dptrain.yaml): an INFO line is its message;
    a warning or an error is prefixed by its level. No clock (a search's first and last lines
    would publish its duration) and no module name."""

    def format(self, record) -> str:
        text = super().format(record)
        return text if record.levelno == logging.INFO else f"[{record.levelname}] {text}"


class ConsoleFilter:
    """Logging filter of the console handler (conf/hydra/job_logging/dptrain.yaml): records
    logged with ``extra={"console": False}`` go to the private log file only (an error the
    command line prints itself is shown once)."""

    def filter(self, record) -> bool:
        return getattr(record, "console", True) is not False


def finite_epsilon(value: Any) -> bool:
    """Whether ``value`` is a finite epsilon (a number, not inf, NaN or None): the condition for a
    run to list anything computed from private rows as publishable (:func:`write_manifest`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: publishable entries computed from public information only (still publishable without a guarantee)
PUBLIC_ENTRIES = (".hydra/", MANIFEST)
HYDRA_RECORD_NOTE = ("Hydra's record of the launch: this machine's paths and the run folder's name, which holds "
                     "the run's start time")


def write_manifest(run_dir: Path, *, publishable: dict[str, str], private: dict[str, str], guarantee: str,
                   finite_guarantee: bool, report: str | None = None, kept: dict[str, str] | None = None) -> None:
    """``FILES.txt``: which files of the run folder may be published and which must stay with
    the data, one line each with the reason, then the SHA-256 of every file this run wrote outside
    private/ (:mod:`dptrain.runfolder.verify`). ``publishable`` / ``private`` map a path relative to
    the run folder to a one-line description. ``report`` (e.g. "privacy.json"): the report that
    vouches for the other files; their digests are added to it (key ``sha256``), and what
    ``dptrain publish`` exports (key ``export``), before its own digest is taken.

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


def stamp_times(folder: Path, when_ns: int) -> None:
    """Set the modification and access times of ``folder``, and of every file and folder under it,
    to ``when_ns`` (nanoseconds since the epoch): a run folder stamped with its start shows no
    duration (a search's duration grows with its secret number of candidates). Links are stamped
    themselves, never their targets."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    links = os.utime in os.supports_follow_symlinks
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in [*files, *dirs]:
            path = os.path.join(root, name)
            if links or not os.path.islink(path):
                os.utime(path, ns=(when_ns, when_ns), follow_symlinks=not links)
    os.utime(folder, ns=(when_ns, when_ns))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Atomic, strict JSON (inf written as the string "inf", NaN as null)."""
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False, allow_nan=False) + "\n")


class Tracker:
    """TensorBoard writer for one run (events under ``<run_dir>/tb``); a no-op when disabled."""

    def __init__(self, run_dir: Path, *, tensorboard: bool) -> None:
        self.log_dir = str(Path(run_dir) / "tb")
        self.enabled = tensorboard
        self._writer = None
        self._purge_step: int | None = None

    @property
    def writer(self):
        """The SummaryWriter, opened on first use (so that a resumed run can purge first)."""
        if self._writer is None and self.enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.log_dir, purge_step=self._purge_step)
        return self._writer

    def purge_after(self, step: int) -> None:
        """A run resumed from a checkpoint at ``step``: TensorBoard drops the points a crashed
        run logged after that step (they are logged again). Call before the first write."""
        if step > 0 and self._writer is None:
            self._purge_step = step + 1

    def scalars(self, values: dict[str, float], *, step: int) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            if value is not None and math.isfinite(value):
                self.writer.add_scalar(tag, value, global_step=step)

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        """One HParams trial for this run, in the run's own event file, so that TensorBoard's
        HParams dashboard lists the runs of a sweep as comparable trials. ``metrics`` are
        logged as scalars under their own tags (values the dashboard shows per trial).

        Only the trial (session start and end) is written, not an experiment summary: given
        one, TensorBoard takes the first run's as the whole sweep's, with that run's values as
        the only ones and every hparam marked ``differs: false``; without it, TensorBoard builds
        the experiment from all the runs' trials (each hparam's values, ``differs``) and their
        scalar tags."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        clean = {k: ("none" if v is None else v) for k, v in hparams.items()}
        finite = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}
        _experiment, session_start, session_end = hparams_summary(clean, finite)
        for summary in (session_start, session_end):
            self.writer.file_writer.add_summary(summary)
        for tag, value in finite.items():
            self.writer.add_scalar(tag, value)

    def text(self, tag: str, text: str) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, text)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()


MODEL_FILENAME = "model.pt"


def model_path_in(run: str | Path) -> Path:
    """``run`` itself when it is a file, else ``<run>/model.pt``."""
    path = Path(run).expanduser()
    return path if path.is_file() else path / MODEL_FILENAME
