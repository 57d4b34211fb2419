"""The report names the files it covers: SHA-256 digests written at the end of a run, and
``dptrain verify RUN`` to check them.

When a run writes its file list (FILES.txt, :func:`dptrain.runfolder.tracking.write_manifest`), it
computes the SHA-256 of every file it wrote at the top of its folder (the publishable area:
everything outside ``private/``), stores those digests in its report (privacy.json, release.json
or audit.json, key ``sha256``: every such file but the report itself) and lists them in FILES.txt,
the report's own digest included. The report's ``export`` says which of them ``dptrain publish``
exports (none when the run has no finite-epsilon guarantee).

``dptrain verify RUN`` (or ``python -m dptrain verify RUN``) recomputes the digests and prints one
line per file; it exits 0 only when every row is ``ok``:

* ``CHANGED`` / ``MISSING``: a listed file whose bytes differ from its digest, or that is gone;
* ``UNLISTED``: a file in the publishable area that neither the report nor FILES.txt lists (a
  file planted in the folder, a killed run's leftover, a file added after the run);
* ``NOT IN REPORT`` / ``NOT IN FILES.txt``: the report's list and FILES.txt's disagree;
* ``NOT VOUCHED``: the report's ``export`` (or a table task's ``files``) names a file that no
  digest covers.

This module reads and hashes files only; it imports nothing else of dptrain.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

#: the reports that vouch for files, in the order they are looked for
REPORTS = ("privacy.json", "release.json", "audit.json")
MANIFEST = "FILES.txt"
PRIVATE_DIR = "private"
DIGEST_HEADER = "SHA-256 of each file this run wrote outside private/ (check with `dptrain verify RUN`):"
#: the header of folders written before the publishable area was checked whole
OLD_DIGEST_HEADER = "SHA-256 of each publishable file (check with `dptrain verify RUN`):"
EXIT_MISMATCH = 1


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def publishable_area(run_dir: Path) -> list[str]:
    """Every file (and link) of ``run_dir`` outside ``private/``, as sorted paths relative to it:
    where publishable files live, so where nothing may be that the report does not list. A folder
    below that holds its own FILES.txt (a job folder of a sweep, beside the sweep's summary) is
    another run's, vouched for by its own list, and left out."""
    run_dir = Path(run_dir)
    out = []
    for root, dirs, files in os.walk(run_dir):
        here = Path(root)
        if here == run_dir and PRIVATE_DIR in dirs:
            dirs.remove(PRIVATE_DIR)
        dirs[:] = [d for d in dirs if not (here / d / MANIFEST).is_file()]
        out += [(here / name).relative_to(run_dir).as_posix() for name in files]
        out += [(here / d).relative_to(run_dir).as_posix() for d in dirs if (here / d).is_symlink()]
    return sorted(out)


def expand_publishable(run_dir: Path, names: list[str] | dict) -> list[str]:
    """The files behind a list of entries ("privacy.json, privacy.txt", ".hydra/", "model.pt"), as
    sorted paths relative to ``run_dir``; FILES.txt itself and absent files are left out."""
    run_dir = Path(run_dir)
    out: set[str] = set()
    for entry in names:
        for name in (part.strip() for part in str(entry).split(",")):
            path = run_dir / name
            if name.endswith("/") and path.is_dir():
                out.update(p.relative_to(run_dir).as_posix() for p in path.rglob("*") if p.is_file())
            elif name and name != MANIFEST and path.is_file():
                out.add(name)
    return sorted(out)


def digests(run_dir: Path, files: list[str]) -> dict[str, str]:
    return {name: sha256_of(Path(run_dir) / name) for name in files}


def manifest_lines(all_digests: dict[str, str]) -> list[str]:
    """FILES.txt's digest section."""
    return ["", DIGEST_HEADER, *[f"  {digest}  {name}" for name, digest in sorted(all_digests.items())]]


def parse_manifest_digests(text: str) -> dict[str, str]:
    """The digests listed in the text of a FILES.txt (empty when it has none)."""
    lines = text.splitlines()
    header = next((h for h in (DIGEST_HEADER, OLD_DIGEST_HEADER) if h in lines), None)
    if header is None:
        return {}
    out = {}
    for line in lines[lines.index(header) + 1:]:
        parts = line.strip().split("  ", 1)
        if len(parts) != 2 or len(parts[0]) != 64:
            break
        out[parts[1]] = parts[0]
    return out


def read_manifest_digests(run_dir: Path) -> dict[str, str]:
    """The digests listed in FILES.txt (empty when it has none)."""
    path = Path(run_dir) / MANIFEST
    return parse_manifest_digests(path.read_text(encoding="utf-8")) if path.is_file() else {}


def report_of(run_dir: Path) -> Path | None:
    for name in REPORTS:
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


def _expected(run_dir: Path, report: Path | None, body: dict) -> dict[str, tuple[str, list[str]]]:
    """Each listed file -> (its digest, or "disagree" when the two lists differ on it; where listed)."""
    expected: dict[str, tuple[str, list[str]]] = {}
    for name, digest in (body.get("sha256") or {}).items():
        expected[name] = (digest, [report.name])
    for name, digest in read_manifest_digests(run_dir).items():
        if name in expected and expected[name][0] != digest:
            expected[name] = ("disagree", [*expected[name][1], MANIFEST])
        else:
            expected[name] = (digest, [*expected.get(name, ("", []))[1], MANIFEST])
    return expected


def _list_rows(report: Path | None, body: dict, expected: dict) -> list[tuple[str, str, str]]:
    """Rows for the disagreements between the report's list and FILES.txt's (a file only one of
    them lists; the report's own digest is in FILES.txt only), and for an export that names a file
    no digest covers."""
    rows: list[tuple[str, str, str]] = []
    if report is None or "sha256" not in body:
        return rows
    if "export" in body and not (report.parent / MANIFEST).is_file():
        rows.append((MANIFEST, "MISSING", f"{report.name} was written with it"))
    for name, (_, where) in expected.items():
        if name == report.name:
            continue
        if where == [MANIFEST]:
            rows.append((name, "NOT IN REPORT", f"listed by {MANIFEST}, not by {report.name}"))
        elif where == [report.name] and (report.parent / MANIFEST).is_file():
            rows.append((name, f"NOT IN {MANIFEST}", f"listed by {report.name}, not by {MANIFEST}"))
    named = [("export", n) for n in (body.get("export") or {}).get("files", [])]
    if isinstance(body.get("files"), list):  # a table task's list of its released files
        named += [("files", n) for n in body["files"] if isinstance(n, str)]
    for key, name in named:
        if name not in expected and name not in (report.name, MANIFEST):
            rows.append((name, "NOT VOUCHED", f"{report.name}'s {key} names it; no digest covers it"))
    return rows


def verify_run(run_dir: str | Path) -> tuple[list[tuple[str, str, str]], bool]:
    """([(file, status, where it is vouched for)], all ok). Statuses: module docstring; a folder
    without a report or digests gives one row with status NO DIGESTS."""
    run_dir = Path(run_dir)
    report = report_of(run_dir)
    body = json.loads(report.read_text(encoding="utf-8")) if report is not None else {}
    expected = _expected(run_dir, report, body)
    if not expected:
        return [(str(run_dir), "NO DIGESTS", "no report with sha256 and no digests in FILES.txt")], False
    rows = []
    for name, (digest, where) in sorted(expected.items()):
        path = run_dir / name
        status = ("MISSING" if not path.is_file() else "CHANGED" if digest == "disagree" or sha256_of(path) != digest
                  else "ok")
        rows.append((name, status, " and ".join(where)))
    rows += _list_rows(report, body, expected)
    roots = {MANIFEST, report.name if report is not None else MANIFEST}  # the lists themselves
    rows += [(name, "UNLISTED", "in the publishable area (outside private/), listed nowhere: not written by this run")
             for name in publishable_area(run_dir) if name not in expected and name not in roots]
    return rows, all(status == "ok" for _, status, _ in rows)


def main(argv: list[str] | None = None) -> int:
    """``dptrain verify RUN``: print each file's status; exit 0 when all match, else 1."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: dptrain verify RUN_FOLDER   (checks the SHA-256 digests its report and FILES.txt list, and "
              "that nothing else is outside private/)", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    if not run_dir.is_dir():
        print(f"dptrain: error: verify: {run_dir} is not a folder; allowed: a run folder", file=sys.stderr)
        return 2
    rows, ok = verify_run(run_dir)
    for name, status, where in rows:
        print(f"{status:10s} {name}   ({where})")
    print(f"{run_dir}: " + ("every file matches its digest and nothing else is outside private/" if ok else
                            "verification FAILED: the folder's files are not the ones its report describes"))
    return 0 if ok else EXIT_MISMATCH


if __name__ == "__main__":
    raise SystemExit(main())
