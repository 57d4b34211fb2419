"""An operating system's refusal to create or write a run folder, in dptrain's words.

A run folder on a read-only mount, a launch from a read-only working directory (the default
``hydra.run.dir`` is ``outputs/<date>/<time>`` below it), a file where a folder should be, a
full disk or quota while the run writes: each is an :class:`OSError` that used to end in a
traceback. The command line (:mod:`dptrain.tasks.cli`) turns it into ONE :class:`OutputError`
line that names the folder or file, the setting and the fix, and exits with status 2.
Nothing already written is removed: a folder refused before the run keeps what it held, a run
stopped by a failed write keeps every file it had written (its checkpoint included). The
message names paths and the system's reason only, never a value read from the data.
"""

from __future__ import annotations

import errno
from pathlib import Path

from dptrain.core.errors import DPTrainError


class OutputError(DPTrainError):
    """A run folder or one of its files could not be created or written."""


#: errno -> the reason in words
_REASONS = {
    errno.EROFS: "a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOSPC: "no space left on the device (the disk is full)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.ENOTDIR: "a file stands where a folder is needed",
    errno.EEXIST: "a file stands where a folder is needed",
    errno.ENAMETOOLONG: "a name longer than the file system allows",
    errno.EFBIG: "the file is larger than the file system allows",
}
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def reason(err: OSError) -> str:
    """What the operating system said, in words (its own text for an errno not listed)."""
    return _REASONS.get(err.errno, err.strerror or type(err).__name__)


def _where(err: OSError, fallback: Path | None) -> str:
    """The path the system refused: for a file standing where a folder is needed, that file."""
    name = err.filename if err.filename is not None else fallback
    if name is None:
        return "a file of the run folder"
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        blocking = next((p for p in [Path(str(name)), *Path(str(name)).parents] if p.is_file()), None)
        if blocking is not None:
            return f"{blocking} is a file"
    return str(name)


def folder_error(err: OSError, *, key: str, folder: Path) -> OutputError:
    """The run folder ``folder`` (the setting ``key``: hydra.run.dir or hydra.sweep.dir) could not
    be created or locked, before anything was written."""
    cwd = Path.cwd()
    relative = not Path(str(folder)).is_absolute()
    if err.errno in _FULL:
        fix = (f"free space on that disk, or name a folder on another disk ({key}=/other/disk/run)")
    elif relative:
        fix = (f"the folder is relative to the working directory {cwd}: run from a writable folder (cd to it "
               f"first), or give a writable absolute folder, e.g. {key}=$HOME/dptrain-runs/run1")
    else:
        fix = f"a folder you can write, e.g. {key}=$HOME/dptrain-runs/run1"
    return OutputError(f"{key}={str(folder)!r} is not allowed: the run folder cannot be created or written "
                       f"({_where(err, folder)}: {reason(err)}); refused before anything was written. "
                       f"Allowed: {fix}")


def write_error(err: OSError, *, folder: Path | None) -> OutputError:
    """A file could not be written (or opened) while the run, or Hydra for the run, wrote into
    ``folder`` (None: the folder is not known here): the run stopped there; nothing written is
    removed."""
    where = _where(err, folder)
    if err.errno in _FULL:
        what, fix = "cannot write", "free space on that disk (or write the run to another disk with hydra.run.dir=DIR)"
    elif err.errno in _REASONS or isinstance(err, PermissionError):
        what, fix = "cannot write", "make the folder writable, or write the run elsewhere with hydra.run.dir=DIR"
    else:
        what, fix = "cannot open", "correct the path named, or write the run elsewhere with hydra.run.dir=DIR"
    kept = (f"every file written before stays in {folder}" if folder is not None
            else "every file written before stays where it was written")
    rerun = ("then launch again: into the same folder with overwrite=true (or trainer.resume=auto to continue a "
             "training run from its last checkpoint), or into a new folder")
    return OutputError(f"{what} {where}: {reason(err)}; the run stopped there and {kept} (nothing was "
                       f"removed). Fix: {fix}; {rerun}")
