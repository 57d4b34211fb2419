"""The report names the files it covers: SHA-256 digests written at the end of a run, and
``dptrain verify RUN`` to check them.

When a run writes its file list (FILES.txt, :func:`dptrain.runfolder.tracking.write_manifest`), it
computes the SHA-256 of every publishable file, stores those of the files its report vouches for
(model.pt, coefficients.csv, metrics.json, release.csv, the .hydra/ settings, ...) in the report
itself (privacy.json, release.json or audit.json, key ``sha256``), and lists every publishable
file's digest, the report's included, in FILES.txt. A reader holding the folder can then check
that the report and the model belong together: ``dptrain verify RUN`` (or
``python -m dptrain verify RUN``) recomputes the digests and prints one line per file, ``ok``,
``CHANGED`` or ``MISSING``, and exits 0 only when every file matches. A hand-edited model, a
report copied beside another run's model, or a file list that disagrees with its report fails.

This module reads and hashes files only; it imports nothing else of dptrain.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

#: the reports that vouch for files, in the order they are looked for
REPORTS = ("privacy.json", "release.json", "audit.json")
MANIFEST = "FILES.txt"
DIGEST_HEADER = "SHA-256 of each publishable file (check with `dptrain verify RUN`):"
EXIT_MISMATCH = 1


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def expand_publishable(run_dir: Path, names: list[str] | dict) -> list[str]:
    """The files behind a list of publishable entries ("privacy.json, privacy.txt", ".hydra/",
    "model.pt"), as sorted paths relative to ``run_dir``; FILES.txt itself and absent files are
    left out."""
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


def read_manifest_digests(run_dir: Path) -> dict[str, str]:
    """The digests listed in FILES.txt (empty when it has none)."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    if DIGEST_HEADER not in lines:
        return {}
    out = {}
    for line in lines[lines.index(DIGEST_HEADER) + 1:]:
        parts = line.strip().split("  ", 1)
        if len(parts) != 2 or len(parts[0]) != 64:
            break
        out[parts[1]] = parts[0]
    return out


def report_of(run_dir: Path) -> Path | None:
    for name in REPORTS:
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


def verify_run(run_dir: str | Path) -> tuple[list[tuple[str, str, str]], bool]:
    """([(file, status, where it is vouched for)], all ok). Statuses: ok, CHANGED, MISSING; a
    folder without a report or digests gives one row with status NO DIGESTS."""
    run_dir = Path(run_dir)
    expected: dict[str, tuple[str, list[str]]] = {}
    report = report_of(run_dir)
    if report is not None:
        vouched = json.loads(report.read_text(encoding="utf-8")).get("sha256") or {}
        for name, digest in vouched.items():
            expected[name] = (digest, [report.name])
    for name, digest in read_manifest_digests(run_dir).items():
        if name in expected and expected[name][0] != digest:
            expected[name] = ("disagree", [*expected[name][1], MANIFEST])
        else:
            expected[name] = (digest, [*expected.get(name, ("", []))[1], MANIFEST])
    if not expected:
        return [(str(run_dir), "NO DIGESTS", "no report with sha256 and no digests in FILES.txt")], False
    rows = []
    for name, (digest, where) in sorted(expected.items()):
        path = run_dir / name
        status = ("MISSING" if not path.is_file() else "CHANGED" if digest == "disagree" or sha256_of(path) != digest
                  else "ok")
        rows.append((name, status, " and ".join(where)))
    return rows, all(status == "ok" for _, status, _ in rows)


def main(argv: list[str] | None = None) -> int:
    """``dptrain verify RUN``: print each covered file's status; exit 0 when all match, else 1."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: dptrain verify RUN_FOLDER   (checks the SHA-256 digests its report and FILES.txt list)",
              file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    if not run_dir.is_dir():
        print(f"dptrain: error: verify: {run_dir} is not a folder; allowed: a run folder", file=sys.stderr)
        return 2
    rows, ok = verify_run(run_dir)
    for name, status, where in rows:
        print(f"{status:10s} {name}   ({where})")
    print(f"{run_dir}: " + ("every file matches its digest" if ok else "verification FAILED: the folder's files "
                            "are not the ones its report describes"))
    return 0 if ok else EXIT_MISMATCH


if __name__ == "__main__":
    raise SystemExit(main())
