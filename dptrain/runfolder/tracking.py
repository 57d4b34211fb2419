"""Run outputs: TensorBoard scalars, atomically written JSON / text artifacts, the one time
stamp. Where each file of a run folder goes, and its file list, is the writer's
(:class:`dptrain.runfolder.folder.RunFolder`).

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

from dptrain.runfolder import verify


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
    run to list anything computed from private rows as publishable
    (:meth:`dptrain.runfolder.folder.RunFolder.finish`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
