"""The house rules the code keeps: function length and width limits, and every document the
code or the README points to exists in the repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_function_longer_than_60_lines_or_wider_than_7_parameters():
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "check_structure.py")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "0 longer than 60 lines; 0 with more than 7 parameters" in res.stdout


def test_every_referenced_document_is_in_the_repository():
    """Comments, docstrings, configs and the README cite docs by path (docs/NAME.md, or NAME.md
    between docs): each must resolve, and no upper-case design-document name from outside the
    repository (PRIVACY.md, MOS.md, ...) may be cited at all."""
    sources = [*REPO.joinpath("dptrain").rglob("*.py"), *REPO.joinpath("conf").rglob("*.yaml"),
               *REPO.joinpath("scripts").rglob("*.py"), *REPO.joinpath("tests").rglob("*.py"), REPO / "README.md"]
    missing = []
    for path in sources:
        if path.name == "test_structure.py":
            continue
        text = path.read_text(encoding="utf-8")
        missing += [(str(path.relative_to(REPO)), m) for m in re.findall(r"docs/[\w-]+\.md", text)
                    if not (REPO / m).exists()]
        missing += [(str(path.relative_to(REPO)), m) for m in re.findall(r"\b[A-Z][A-Z_]+\.md\b", text)
                    if m != "README.md" and not list(REPO.rglob(m))]
    for path in REPO.joinpath("docs").glob("*.md"):
        missing += [(str(path.relative_to(REPO)), m) for m in re.findall(r"\]\(([\w-]+\.md)\)", path.read_text())
                    if not (path.parent / m).exists()]
    assert not missing, f"documents cited but not in the repository: {sorted(set(missing))}"
