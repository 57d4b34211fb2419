"""One writer per run folder: an exclusive lock taken before anything is written into it.

Two processes launched into the same folder (a double click, a SLURM array with a fixed
``hydra.run.dir``, a resubmitted job) used to interleave their files: a report describing one
run beside the other run's model. Now the first process takes an exclusive ``flock`` on
``<folder>/private/run.lock`` before Hydra or the task writes anything, and holds it until it
exits; a second process refuses at once, naming the folder and the owner (pid, host), and
writes nothing. The kernel releases a ``flock`` when its process dies (even by SIGKILL), so a
lock file left by a dead process is simply taken over, with a message naming the old owner.
Resuming (``trainer.resume``) takes the same lock; the runs of a sweep each have their own folder
(and the sweep its own lock on the sweep folder).

The lock file (``private/run.lock``) holds the owner's pid and host name while the run writes,
nothing about the data or the run's timing; it is removed when the run ends, before the run's
files get their one time (:func:`dptrain.runfolder.tracking.stamp_times`), so a finished folder holds no
trace of it. A lock file that still names an owner marks a run that did not end cleanly.
``flock`` is advisory and local: on a network file system shared by several hosts it may not
exclude a process on another host; the owner's host in the message helps to see that case.

Taking over a dead run's lock does not take over its files: the launch's claim on the folder
(:mod:`dptrain.runfolder.ownership`) refuses a folder holding them, and :meth:`RunLock.mark_start`
records the folder as the run found it, so that its FILES.txt never vouches for a file it did not
write.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import shutil
import socket
from pathlib import Path

from dptrain.core.errors import DPTrainError
from dptrain.runfolder import ownership
from dptrain.runfolder.ownership import LOCK_NAME


class RunFolderBusy(DPTrainError):
    """Another live process holds the run folder's lock."""


class RunLock:
    """An exclusive lock on one run folder (:func:`acquire`); :meth:`release` removes it."""

    def __init__(self, folder: Path, fd: int, *, took_over: str | None) -> None:
        self.folder, self._fd, self.took_over = folder, fd, took_over
        self.created = False  # acquire() made the folder
        self.made_private = False  # acquire() made private/ (for the lock): removed again if left empty
        self.before: dict | None = None  # the publishable area when the run started (mark_start)

    def mark_start(self) -> None:
        """Record the publishable area's files as they are before the run writes (once, after the
        launch's claim on the folder): FILES.txt never vouches for those the run leaves untouched
        (:func:`dptrain.runfolder.ownership.snapshot`)."""
        if self.before is None:
            self.before = ownership.snapshot(self.folder)

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def discard(self) -> None:
        """Release the lock and remove what taking it created (a refused run leaves no folder
        behind). A folder this lock created did not exist before this launch, so everything in it
        (Hydra's .hydra/, the run's private log) was written by the refused run: it is removed
        whole. Otherwise only private/ if this lock made it and it is left empty."""
        self.release()
        if self.created:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        for path in (self.path.parent,) if self.made_private else ():
            try:
                path.rmdir()
            except FileNotFoundError:  # already removed with the lock
                continue
            except OSError:  # not empty: another file was written
                return

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # no owner: should the removal fail, the file says the run ended
        if _same_file(self._fd, self.path):
            try:
                self.path.unlink()
                if self.made_private:
                    self.path.parent.rmdir()  # a sweep folder's private/ held the lock only
            except OSError:  # not empty: a run folder's private/ holds the run's files
                pass
        os.close(self._fd)
        self._fd = None
        _HELD.pop(self.folder, None)


_HELD: dict[Path, RunLock] = {}


def _owner_text() -> str:
    return f"pid {os.getpid()} on host {socket.gethostname()}"


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_owner(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 200).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def acquire(folder: str | os.PathLike) -> RunLock:
    """Take (or, in this process, reuse) the exclusive lock of ``folder``; the folder is created
    if needed. Raises :class:`RunFolderBusy` naming the folder and the owner when another live
    process holds it."""
    folder = Path(folder).resolve()
    held = _HELD.get(folder)
    if held is not None and held._fd is not None:
        return held
    created = not folder.exists()
    made_private = not (folder / LOCK_NAME).parent.exists()
    (folder / LOCK_NAME).parent.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            owner = _read_owner(fd) or "another process"
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunFolderBusy(
                f"the run folder {folder} is in use by {owner} (lock {path}); refused, nothing was written. "
                "Allowed: wait for that run to end, or launch into another folder (hydra.run.dir=...)") from None
        if _same_file(fd, path):  # not a lock file someone removed while we opened it
            break
        os.close(fd)
    previous = _read_owner(fd)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, _owner_text().encode("utf-8") + b"\n")
    lock = RunLock(folder, fd, took_over=previous or None)
    lock.created, lock.made_private = created, made_private
    _HELD[folder] = lock
    return lock


def release_all() -> None:
    """Release every lock this process holds (at exit)."""
    for lock in list(_HELD.values()):
        lock.release()


atexit.register(release_all)  # a normal interpreter exit ends cleanly; os._exit and kills do not


def took_over_message(lock: RunLock) -> str | None:
    """What to tell the user when the lock file of a dead process was taken over."""
    if not lock.took_over:
        return None
    return (f"run folder {lock.folder}: took over the lock left by {lock.took_over}, which is no longer running "
            "(a crashed or killed run); files it wrote may be incomplete")


def start_snapshot(folder: str | os.PathLike) -> dict | None:
    """The snapshot taken when this process's run in ``folder`` started (:meth:`RunLock.mark_start`),
    or None when this process holds no lock on it (a task called from Python without the command
    line: every file of its publishable area then counts as its own)."""
    held = _HELD.get(Path(folder).resolve())
    return None if held is None or held._fd is None else held.before
