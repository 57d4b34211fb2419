"""``dptrain publish RUN DEST``: the export of a run, which is what leaves, never the run folder.

A run folder cannot be published as it is: a file's change time (ctime) cannot be set, so the
files of a search written at its end carry the search's duration beside the start time they were
stamped with, and ``tar --format=posix`` carries ctime; a folder may also hold files its report
does not vouch for. The export fixes both:

1. it verifies the run (:func:`dptrain.runfolder.verify.verify_run`: every digest matches, nothing
   unlisted outside ``private/``) and refuses a run that does not verify, or whose report does not
   state a finite-epsilon guarantee (its ``export`` is empty: privacy off, no noise, a release
   method without a guarantee), or that has no report (nothing vouches for its files);
2. it reads each file the report's ``export`` names once, checks those bytes against the digest
   the report and FILES.txt give it (a file changed after the check is refused), and writes them:
3. to ``DEST.tar.gz`` (or ``.tgz``): entries sorted by path, each folder before its files, every
   entry's time :data:`FIXED_TIME`, modes 0644 (files) and 0755 (folders), owner and group 0 with
   no names, no access or change times (POSIX tar headers carry none unless asked: none are), a
   gzip header without time or file name; the same run exported twice gives the same bytes;
4. or to a new folder ``DEST``: the same files with the same modes and the one time as their
   modification and access times. Their change times are the export's own (the file system sets
   them); nothing in the export holds the run's start (Hydra's record is under ``private/``), so
   they give no duration. Archive the folder with ``dptrain publish RUN DEST.tar.gz``, not with a
   ``tar`` that stores change times.

The export holds the report and FILES.txt, so ``dptrain verify DEST`` (a folder) passes on it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tarfile
import tempfile
from pathlib import Path

from dptrain.core.errors import DPTrainError
from dptrain.runfolder.verify import MANIFEST, parse_manifest_digests, report_of, verify_run
from dptrain.runfolder.write_errors import reason

#: every entry's modification (and a folder export's access) time: 2000-01-01T00:00:00Z
FIXED_TIME = 946_684_800
FILE_MODE, DIR_MODE = 0o644, 0o755
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


class PublishRefused(DPTrainError):
    """A run that cannot be exported (it does not verify, has no guarantee, or DEST is taken)."""


def _read(run_dir: Path, name: str) -> bytes:
    """The bytes of a regular file inside ``run_dir`` (never a link: it could name any file)."""
    path = run_dir / name
    if ".." in Path(name).parts or Path(name).is_absolute():
        raise PublishRefused(f"publish: the report names {name!r}, outside the run folder; refused")
    for parent in [path, *path.parents]:
        if parent == run_dir:
            break
        if parent.is_symlink():
            raise PublishRefused(f"publish: {name} is a link (or inside one) in {run_dir}; refused, nothing was "
                                 "written. Allowed: a run folder whose files are regular files")
    if not stat.S_ISREG(path.lstat().st_mode):
        raise PublishRefused(f"publish: {name} in {run_dir} is not a regular file; refused, nothing was written")
    return path.read_bytes()


def exported_files(run_dir: str | os.PathLike) -> dict[str, bytes]:
    """The files ``dptrain publish`` exports from ``run_dir`` (name -> bytes, sorted by name), each
    checked against its digest; raises :class:`PublishRefused` (module docstring)."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise PublishRefused(f"publish: {run_dir} is not a folder; allowed: a run folder")
    rows, ok = verify_run(run_dir)
    if not ok:
        bad = [f"{name} {status}" for name, status, _ in rows if status != "ok"]
        raise PublishRefused(f"publish: {run_dir} does not verify ({'; '.join(bad[:6])}"
                             f"{'; ...' if len(bad) > 6 else ''}); refused, nothing was written. Allowed: a run "
                             "folder that `dptrain verify` passes (remove the files it lists as UNLISTED, or rerun)")
    report = report_of(run_dir)
    if report is None:
        raise PublishRefused(f"publish: {run_dir} has no report (privacy.json, release.json or audit.json) that "
                             "vouches for its files and states a guarantee; refused, nothing was written")
    report_bytes, manifest_bytes = _read(run_dir, report.name), _read(run_dir, MANIFEST)
    body = json.loads(report_bytes)
    export = body.get("export")
    if not export or not export.get("finite_guarantee") or not export.get("files"):
        why = ("its report was written before exports existed: rerun it" if not export else
               f"no finite-epsilon guarantee covers it (guarantee: {str(body.get('guarantee', 'none'))[:160]})")
        raise PublishRefused(f"publish: {run_dir}: {why}; refused, nothing was written. Allowed: a run whose report "
                             "states a finite epsilon (privacy on, noise added, a method with a guarantee)")
    digests = {**parse_manifest_digests(manifest_bytes.decode("utf-8")), **(body.get("sha256") or {})}
    out = {}
    for name in sorted(export["files"]):
        data = {report.name: report_bytes, MANIFEST: manifest_bytes}.get(name)
        data = _read(run_dir, name) if data is None else data
        if name != MANIFEST and hashlib.sha256(data).hexdigest() != digests.get(name):
            raise PublishRefused(f"publish: {name} in {run_dir} does not match its digest (changed while exporting?); "
                                 "refused, nothing was written")
        out[name] = data
    return out


def _folders(names: list[str]) -> list[str]:
    return sorted({p.as_posix() for n in names for p in Path(n).parents if p.as_posix() != "."})


def write_archive(files: dict[str, bytes], dest: Path) -> None:
    """``files`` as a deterministic .tar.gz at ``dest`` (module docstring, 3), written to a
    temporary file beside it, then renamed."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    entries = sorted([(d, None) for d in _folders(list(files))] + list(files.items()))
                    for name, data in entries:
                        info = tarfile.TarInfo(name)
                        info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_TIME, 0, 0, "", ""
                        if data is None:
                            info.type, info.mode = tarfile.DIRTYPE, DIR_MODE
                            tar.addfile(info)
                        else:
                            info.mode, info.size = FILE_MODE, len(data)
                            tar.addfile(info, io.BytesIO(data))
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, FILE_MODE)
        os.utime(tmp, (FIXED_TIME, FIXED_TIME))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_folder(files: dict[str, bytes], dest: Path) -> None:
    """``files`` into the new folder ``dest`` (module docstring, 4): written to a temporary folder
    beside it, stamped, then renamed."""
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    try:
        for folder in _folders(list(files)):
            (tmp / folder).mkdir()
        for name, data in files.items():
            (tmp / name).write_bytes(data)
            os.chmod(tmp / name, FILE_MODE)
        for path in [*(tmp / n for n in files), *(tmp / d for d in reversed(_folders(list(files)))), tmp]:
            if path.is_dir():
                os.chmod(path, DIR_MODE)
            os.utime(path, (FIXED_TIME, FIXED_TIME))
        os.rename(tmp, dest)
        os.utime(dest, (FIXED_TIME, FIXED_TIME))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(run_dir: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Export the run ``run_dir`` to ``dest`` (a new folder, or a new ``.tar.gz`` / ``.tgz``);
    returns the exported names. Raises :class:`PublishRefused` before writing anything."""
    run_dir, dest = Path(run_dir).resolve(), Path(dest).expanduser()
    target = dest.parent.resolve() / dest.name
    if target == run_dir or run_dir in target.parents:
        raise PublishRefused(f"publish: {dest} is inside the run folder {run_dir} (it would become a file the report "
                             "does not list); allowed: a path outside the run folder")
    if target.exists() or target.is_symlink():
        raise PublishRefused(f"publish: {dest} exists; refused, nothing was written. Allowed: a new path (an export "
                             "is never merged into or written over another)")
    if not target.parent.is_dir():
        raise PublishRefused(f"publish: the folder of {dest} does not exist; allowed: a path in an existing folder")
    files = exported_files(run_dir)
    (write_archive if dest.name.endswith(ARCHIVE_SUFFIXES) else write_folder)(files, target)
    return list(files)


def main(argv: list[str] | None = None) -> int:
    """``dptrain publish RUN DEST``: exit 0 when exported, 2 when refused (nothing written)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or any(a.startswith("-") for a in args):
        print("usage: dptrain publish RUN_FOLDER DEST   (DEST: a new folder, or a new .tar.gz: the verified files "
              "the report vouches for, with one fixed time)", file=sys.stderr)
        return 2
    try:
        names = publish(*args)
    except PublishRefused as err:
        print(f"dptrain: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # DEST's folder read-only, a full disk: the temporary export is removed
        print(f"dptrain: error: publish: cannot write {err.filename or args[1]}: {reason(err)}; nothing was "
              f"published (no part of the export is left). Allowed: a DEST in a folder you can write, on a disk "
              "with space", file=sys.stderr)
        return 2
    print(f"published {len(names)} files of {args[0]} -> {args[1]} (verified against their digests; one time, "
          "2000-01-01T00:00:00Z, modes 0644/0755, no owner): publish this export, never the run folder")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
