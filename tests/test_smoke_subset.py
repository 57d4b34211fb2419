"""The quick subset (``python -m pytest -m smoke``, tests/conftest.py): every id it lists names a
fast test that exists, and the README and CI say how each subset is run."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from conftest import SMOKE

REPO = Path(__file__).resolve().parents[1]


def test_every_smoke_id_names_a_fast_test_that_exists():
    assert len(SMOKE) == len(set(SMOKE)) >= 8
    for node in SMOKE:
        path, _, name = node.partition("::")
        spec = importlib.util.spec_from_file_location(f"smoke_{Path(path).stem}", REPO / path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        test = getattr(module, name.split("[", 1)[0], None)
        assert callable(test), node
        marks = {m.name for m in getattr(test, "pytestmark", [])}
        assert "slow" not in marks and "skip" not in marks, node


def test_the_readme_gives_both_commands_and_ci_runs_the_whole_suite():
    readme = (REPO / "README.md").read_text()
    assert "python -m pytest -m smoke" in readme
    assert re.search(r"about \d+ minutes on 2 cores", readme)
    ci = (REPO / ".ci" / "run").read_text()
    assert "\npython -m pytest\n" in ci and "-m smoke" not in ci
