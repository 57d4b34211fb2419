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


# ------------------------------------------------------------------------------ the import graph


def _dptrain_imports() -> dict[str, set[str]]:
    """module -> the dptrain modules it imports, counting EVERY import statement: at the top,
    under TYPE_CHECKING and inside function bodies (an import inside a function is still a
    dependency; hiding one there is how the cycles of the last renovation grew)."""
    import ast

    root = REPO / "dptrain"
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base
                                                                                                    else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_counting_every_import():
    """Zero cycles among dptrain's modules, counting imports inside functions and under
    TYPE_CHECKING (there were four: privacy <-> objectives through the accounting worker,
    config <-> the task modules, release.run <-> its evaluation, data <-> data.shards)."""
    graph = _dptrain_imports()
    assert len(graph) > 80 and "dptrain.privacy.dpsgd.engine" in graph["dptrain.training.fit"]
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check works


def test_the_import_linter_contracts_hold():
    """The layers (pyproject.toml, [tool.importlinter]): tasks > inference > training > settings >
    release > models, data > privacy, run folder > core; release/ imports no settings (nor training,
    inference or a task), and neither training/ nor inference/ imports release/; privacy/ imports
    no models, data, settings, scikit-learn or scipy; the tasks are independent."""
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "5 kept, 0 broken" in res.stdout


def test_no_process_holds_private_rows_beside_the_run():
    """The accounting worker (a forked process fed the run's rows over a pipe) is gone: no module
    of dptrain starts a process of its own (torchrun and Hydra's launchers start the runs)."""
    for path in (REPO / "dptrain").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|from) multiprocessing|os\.fork\(|subprocess\.Popen\(", text, re.M), path


#: the named boundaries where a heavy third-party library is imported inside a function, because
#: only some runs need it: {dptrain module: {library}}. No dptrain module is ever imported there.
LAZY_THIRD_PARTY = {
    "dptrain.data.parquet": {"pyarrow.parquet"},  # Parquet input only
    "dptrain.data.reading": {"pyarrow.parquet"},
    "dptrain.data.atlas": {"scipy.special"},  # data=atlas only
    "dptrain.models.baselines": {"sklearn.linear_model", "threadpoolctl"},  # trainer.baseline=true only
    "dptrain.privacy.accounting": {"dp_accounting"},  # an uncached accounting only (privacy/cache.py)
    "dptrain.privacy.events": {"dp_accounting"},
    "dptrain.privacy.dpsgd.engine": {"opacus"},  # engine=opacus only (models the fast engine cannot take)
    "dptrain.privacy.dpsgd.model_check": {"opacus.validators"},
    "dptrain.inference.intervals": {"scipy"},
    "dptrain.inference.newton": {"scipy.special"},  # a run's interval quantiles only
    "dptrain.privacy.samplers": {"opendp.prelude"},  # the one-shot table releases only
    "dptrain.release.tables.marginals": {"scipy.sparse", "scipy.sparse.csgraph"},  # consistent 2-way tables only
    "dptrain.training.estimators": {"scipy.special"},  # conf_int() only
    "dptrain.inference.audit_bound": {"scipy"},  # task=audit only  # estimator=subsample_aggregate only
    "dptrain.tasks.tune": {"scipy.optimize"},  # task=tune only
    "dptrain.release.methods.suppression": {"scipy.stats"},  # the suppression baseline of a release only
    "dptrain.release.intervals": {"scipy.special"},  # release intervals only
    "dptrain.release.methods._gd_interval": {"scipy.special"},
    "dptrain.release.figures": {"matplotlib.backends.backend_agg", "matplotlib.figure"},  # figures only
    "dptrain.runfolder.tracking": {"torch.utils.tensorboard", "torch.utils.tensorboard.summary"},  # logger.tensorboard
}


def _function_imports() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({module: dptrain modules imported inside its functions}, {module: other libraries})."""
    import ast

    ours: dict[str, set[str]] = {}
    theirs: dict[str, set[str]] = {}
    for path in (REPO / "dptrain").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                mods = ([f".{node.module}" if node.level else node.module] if isinstance(node, ast.ImportFrom)
                        else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for mod in mods:
                    target = ours if mod.startswith((".", "dptrain")) else theirs
                    target.setdefault(name, set()).add(mod)
    return ours, theirs


def test_no_dptrain_import_inside_a_function():
    """An import of a dptrain module inside a function body hides a dependency (the cycles of the
    last renovation grew that way): there is none. Heavy third-party libraries are imported inside
    a function only at the boundaries named in LAZY_THIRD_PARTY."""
    ours, theirs = _function_imports()
    assert ours == {}
    assert theirs == LAZY_THIRD_PARTY, {k: v - LAZY_THIRD_PARTY.get(k, set()) for k, v in theirs.items()}
