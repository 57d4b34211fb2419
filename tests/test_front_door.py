"""``import dptrain as dp``: the names a user needs, loaded when first used (issue 45)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dptrain as dp

REPO = Path(__file__).resolve().parents[1]


def test_import_dptrain_loads_nothing_heavy():
    """The command line's start pays for no front door: ``import dptrain`` loads no dptrain
    submodule, no torch and no pandas (a fresh interpreter)."""
    code = ("import sys, dptrain; print(sorted(m for m in sys.modules if m.startswith(('dptrain.', 'torch', "
            "'pandas', 'numpy', 'sklearn'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_front_door_name_is_its_modules_object():
    """Each name resolves, on first use, to the very object its defining module holds (no copy, no
    wrapper), and ``dir(dptrain)`` lists it."""
    assert 15 <= len(dp.__all__) <= 20
    for name in dp.__all__:
        module = importlib.import_module(dp._FRONT_DOOR[name])
        assert getattr(dp, name) is getattr(module, dp._RENAMED.get(name, name)), name
        assert name in dir(dp)
    assert dp.verify.__name__ == "verify_run" and dp.ACCOUNTANTS.names()[:2] == ["rdp", "pld"]


def test_an_unknown_name_is_refused_with_the_front_doors_names():
    with pytest.raises(AttributeError, match=r"no attribute 'DPLogisticRegresion'; its names: ACCOUNTANTS, "):
        dp.DPLogisticRegresion  # noqa: B018


def test_the_docs_teach_the_front_door():
    """No page of docs/ and not the README imports a front-door name from its deep module path."""
    deep = re.compile(r"from (dptrain(?:\.\w+)+) import ([^\n]+)")
    offenders = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for module, names in deep.findall(page.read_text(encoding="utf-8")):
            for name in re.findall(r"\w+", names.split("#")[0]):
                if dp._FRONT_DOOR.get(name) == module or (name, module) == ("verify_run", "dptrain.runfolder.verify"):
                    offenders.append(f"{page.name}: from {module} import {name}")
    assert offenders == []


def test_the_front_door_trains_and_reports_one_epsilon():
    """The README's estimator through the front door: a private fit whose epsilon meets its target."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, size=(4000, 3))
    y = (X @ [3.0, -2.0, 1.0] + rng.logistic(size=4000) > 1).astype(int)
    clf = dp.DPLogisticRegression(bounds=(0, 1), epsilon=1.0, delta=1e-5, batch_size=256, epochs=2, lr=2.0).fit(X, y)
    assert 0.95 <= clf.epsilon_ <= 1.0 and clf.score(X, y) > 0.6
