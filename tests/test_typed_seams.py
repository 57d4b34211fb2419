"""Typed seams between the layers (issue 45): settings become values at the task's door, one
budget, accountants as objects, defaults stated once."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import yaml

from dptrain.privacy.accounting import ACCOUNTANTS
from dptrain.settings.common import RunBase
from dptrain.tasks import cli  # noqa: F401  (registers the tasks' schemas)
from dptrain.tasks.registry import TASKS

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dptrain"

#: below tasks/ (outside settings/, the configuration's own layer), the one reading of a run's
#: data section: it takes the settings (a dataclass, a DictConfig or a Python caller's mapping)
#: and returns the typed DataSource every loader takes
DATA_SECTION_READERS = {("dptrain/data/__init__.py", name) for name in (
    "_synthetic_schema", "_shipped_declaration", "declaration", "schema_from_config", "data_source", "public_schema")}


def _settings_classes() -> set[str]:
    names = set()
    for path in (PACKAGE / "settings").rglob("*.py"):
        names |= {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
    return names


def _library_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith(("dptrain/tasks/", "dptrain/settings/")):
            yield rel, ast.parse(path.read_text(encoding="utf-8"))


def test_below_the_tasks_no_function_takes_a_configuration_object():
    """No parameter below tasks/ is a configuration object: named conf / cfg / config / settings and
    typed Any (or untyped), or typed with a dataclass of dptrain/settings (the command line's
    schemas). The one exception is the data section's reading (DATA_SECTION_READERS)."""
    schemas, hits = _settings_classes(), []
    for rel, tree in _library_modules():
        for node in ast.walk(tree):
            function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if not function or (rel, node.name) in DATA_SECTION_READERS:
                continue
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                ann = ast.unparse(a.annotation) if a.annotation else None
                if (a.arg in {"conf", "cfg", "config", "settings"} and ann in (None, "Any")) or (
                        set(re.findall(r"\w+", ann or "")) & schemas):
                    hits.append(f"{rel}:{node.lineno} {node.name}({a.arg}: {ann})")
    assert hits == []


def test_no_accountant_name_is_written_outside_the_registry():
    """"rdp" and "pld" appear as string constants only in privacy/accounting.py (the registry):
    everything else names an accountant object (RDP, PLD, DEFAULT) or the run's Budget."""
    names = set(ACCOUNTANTS.names())
    trees = ((p.relative_to(REPO).as_posix(), ast.parse(p.read_text(encoding="utf-8"))) for p in PACKAGE.rglob("*.py"))
    hits = [f"{rel}:{n.lineno} {n.value!r}" for rel, tree in trees if rel != "dptrain/privacy/accounting.py"
            for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]
    assert names >= {"rdp", "pld"} and hits == []


def test_defaults_are_stated_once():
    """conf/task/*.yaml restates no value of its schema (only the config groups it pulls in), and
    every task's schema shares one base for the settings every run has (task, seed, plugins,
    overwrite), none redeclaring plugins or overwrite."""
    for path in sorted((REPO / "conf" / "task").glob("*.yaml")):
        assert set(yaml.safe_load(path.read_text())) == {"defaults"}, path.name
    for name in TASKS.names():
        schema = TASKS.get(name).schema
        assert issubclass(schema, RunBase), name
        assert {f.name: f.default for f in dataclasses.fields(schema)}["task"] == name
        own = {k for c in schema.__mro__ if c not in (RunBase, object) for k in vars(c).get("__annotations__", {})}
        assert not own & {"plugins", "overwrite"}, name
