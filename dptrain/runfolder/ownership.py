"""A run owns its folder: it writes only into a new folder, a folder it resumes (the same
configuration), or, with ``overwrite=true``, a folder it first empties; and its report vouches only
for files it wrote.

Before this, a run launched into the folder of a killed run took over its lock with a warning and
vouched, in its FILES.txt and its report's digests, for every file it found under a publishable
entry (``tables/``): a report accounting for one table vouched for sixty. Now:

* :func:`check_claim` (the command line, before Hydra writes anything): a folder whose publishable
  area (everything outside ``private/``) holds any file but Hydra's launch files
  (:data:`HYDRA_LAUNCH_FILES`, rewritten by every launch) is refused, nothing written, unless
  ``overwrite=true`` (then :func:`empty_run_folder` removes every file of the old run first: the
  files its report vouched for, the unvouched ones, its private files; the new run's lock stays)
  or the launch resumes a run of the same configuration (``trainer.resume``; the old
  ``.hydra/config.yaml`` must equal the new one but for :data:`RESUME_KEYS`).
  ``overwrite`` empties only a folder that looks like a run folder (:func:`is_run_folder`).
* :func:`snapshot` (when the run takes its lock, after the claim): the publishable area's files as
  they are before the run writes. :func:`untouched` (when the run writes FILES.txt) names those the
  run did not rewrite: they are never vouched (and ``dptrain verify`` then fails on them).

Hydra's private record, ``.hydra/hydra.yaml`` (this machine's paths and the run folder's name,
which holds the run's start time), is moved to ``private/hydra.yaml`` when the run writes its file
list (:func:`move_hydra_record`): with a file's change time, a start time would give a duration.

This module reads, lists and removes files only; it imports nothing of dptrain but the error type
and the digests module.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dptrain.core.errors import DPTrainError
from dptrain.runfolder.verify import MANIFEST, PRIVATE_DIR, publishable_area

#: what Hydra writes into a run folder at every launch (rewritten by a new launch, so never a
#: leftover of another run)
HYDRA_LAUNCH_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")
HYDRA_RECORD, HYDRA_RECORD_PRIVATE = ".hydra/hydra.yaml", f"{PRIVATE_DIR}/hydra.yaml"
LOCK_NAME = f"{PRIVATE_DIR}/run.lock"  # under private/: the top holds publishable files only
#: files that only a dptrain run folder holds: ``overwrite=true`` empties nothing else
RUN_MARKERS = (MANIFEST, ".hydra/config.yaml", LOCK_NAME, f"{PRIVATE_DIR}/dptrain.log", f"{PRIVATE_DIR}/checkpoint.pt")
#: keys whose change does not make a resumed run another configuration: the resume itself, and the
#: budget, a stop condition (a run stopped by ``privacy.max_epsilon`` continues under a larger one
#: or none; the accountant's whole history still counts, and a checkpoint that already spent more
#: than the new budget is refused by the training loop)
RESUME_KEYS = ("trainer.resume", "overwrite", "privacy.max_epsilon")


class FolderNotOwned(DPTrainError):
    """A launch into a folder that holds files this run would not own."""


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """The files of ``folder``'s publishable area that this launch did not write: everything
    outside ``private/`` but Hydra's launch files."""
    folder = Path(folder)
    return [f for f in publishable_area(folder) if f not in HYDRA_LAUNCH_FILES] if folder.is_dir() else []


def is_run_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds one of :data:`RUN_MARKERS` (a run, or a killed run, wrote it)."""
    return any((Path(folder) / name).is_file() for name in RUN_MARKERS)


def _examples(files: list[str]) -> str:
    return ", ".join(files[:4]) + (f", ... ({len(files)} files)" if len(files) > 4 else "")


def check_claim(folder: str | os.PathLike, *, key: str, overwrite: bool, resume: bool,
                differences: list[str] | None) -> None:
    """Refuse (:class:`FolderNotOwned`) a launch into ``folder`` (set by the setting ``key``) whose
    publishable area holds files of another run, unless ``overwrite`` (and it is a run folder) or
    ``resume`` with no ``differences`` between the old and the new configuration (None: the folder
    has no record of its configuration). Reads only; writes nothing."""
    folder = Path(folder)
    foreign = foreign_files(folder)
    if not foreign:
        return
    if overwrite:
        if not is_run_folder(folder):
            raise FolderNotOwned(
                f"overwrite=true: {key}={str(folder)!r} is not a run folder (no {MANIFEST}, .hydra/config.yaml or "
                f"private/ log, lock or checkpoint) but holds {_examples(foreign)}; refused, nothing was removed or "
                f"written. Allowed: a new folder for the run ({key}=...)")
        return
    if resume and differences == []:
        return
    if resume:
        why = ("its .hydra/config.yaml is missing, so it cannot be told to be the same run" if differences is None
               else f"it was written by another configuration ({', '.join(differences[:5])} differ)")
        raise FolderNotOwned(
            f"trainer.resume: {key}={str(folder)!r} holds {_examples(foreign)}, and {why}; a run resumes only a "
            f"run of its own configuration; refused, nothing was written. Allowed: the same settings as the run "
            f"being resumed, a new folder ({key}=...), or overwrite=true to empty it first")
    raise FolderNotOwned(
        f"{key}={str(folder)!r} holds files this launch would not write ({_examples(foreign)}): a killed run's "
        "leftovers, or files put there; a run writes only into a new folder, a folder it resumes, or one it "
        "empties first, so that its report vouches for exactly what it wrote; refused, nothing was written. "
        f"Allowed: a new folder (leave {key} out, or name another), overwrite=true to empty it first (every file of "
        "the old run is removed), or, to continue a training run of the same settings, trainer.resume=auto")


def empty_run_folder(folder: str | os.PathLike, *, whole: bool = True) -> list[str]:
    """Remove what an old run left in ``folder`` before this run writes: ``whole``, every file
    and folder but this launch's lock (the command line, before Hydra writes); else the files of
    the publishable area but Hydra's launch files (a run started from Python). Returns what was
    removed, relative to the folder."""
    folder = Path(folder)
    if whole:
        names = [p.name for p in sorted(folder.iterdir()) if p.name != PRIVATE_DIR] if folder.is_dir() else []
        names += [f"{PRIVATE_DIR}/{p.name}" for p in sorted((folder / PRIVATE_DIR).glob("*")) if
                  f"{PRIVATE_DIR}/{p.name}" != LOCK_NAME]
    else:
        names = foreign_files(folder)
    for name in names:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return names


def config_differences(old: dict, new: dict) -> list[str]:
    """The dotted keys whose values differ between two configurations (nested dicts), but for
    :data:`RESUME_KEYS`."""
    out: list[str] = []
    if not isinstance(old, dict):
        return ["the whole configuration (the record is not a mapping)"]

    def walk(a: object, b: object, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{prefix}{k}.")
        elif a != b and prefix[:-1] not in RESUME_KEYS:
            out.append(prefix[:-1])

    walk(old, new, "")
    return out


StatKey = tuple[int, int, int]


def _stat_key(path: Path) -> StatKey | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns, st.st_size


def snapshot(folder: str | os.PathLike) -> dict[str, StatKey]:
    """The publishable area's files (but Hydra's launch files) as they are now: inode, change
    time (which no program can set back) and size."""
    folder = Path(folder)
    out = {}
    for name in foreign_files(folder):
        key = _stat_key(folder / name)
        if key is not None:
            out[name] = key
    return out


def untouched(folder: str | os.PathLike, before: dict[str, StatKey] | None) -> list[str]:
    """The files of ``before`` (a :func:`snapshot`) still there and unchanged: not written by the
    run that took the snapshot."""
    folder = Path(folder)
    return sorted(name for name, key in (before or {}).items() if _stat_key(folder / name) == key)


def move_hydra_record(folder: str | os.PathLike) -> bool:
    """Move ``.hydra/hydra.yaml`` to ``private/hydra.yaml`` (module docstring); True if moved."""
    folder = Path(folder)
    source = folder / HYDRA_RECORD
    if not source.is_file():
        return False
    (folder / PRIVATE_DIR).mkdir(parents=True, exist_ok=True)
    os.replace(source, folder / HYDRA_RECORD_PRIVATE)
    return True
