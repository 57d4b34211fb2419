"""Structure limits of the package: no function longer than 60 lines, no function with more than
7 parameters other than keyword-only configuration objects.

    python scripts/check_structure.py [--max-lines 60] [--max-params 7] [--report]

Counts, per function (including methods and nested functions) in dptrain/: its lines (from the
``def`` line to its last line, decorators excluded, docstring included) and its parameters
(positional and keyword-only, without ``self`` / ``cls`` / ``*args`` / ``**kwargs``; keyword-only
parameters whose annotation names a configuration object, a class whose name ends in ``Config``
or is ``Config``, ``DictConfig``, ``Mechanism`` or ``DPSGDMechanism``, are not counted). Exits 1
and lists the offenders when a limit is exceeded; ``--report`` prints the longest functions and
the widest signatures either way.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_NAMES = ("Config", "DictConfig", "Mechanism", "DPSGDMechanism")


def _is_config(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation)
    return any(part.strip().endswith(CONFIG_NAMES) for part in text.replace("|", ",").split(","))


def functions(path: Path):
    """(qualified name, lines, parameters) of every function in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                a = child.args
                positional = [p for p in a.posonlyargs + a.args if p.arg not in ("self", "cls")]
                kwonly = [p for p in a.kwonlyargs if not _is_config(p.annotation)]
                out.append((name, child.end_lineno - child.lineno + 1, len(positional) + len(kwonly)))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-lines", type=int, default=60)
    p.add_argument("--max-params", type=int, default=7)
    p.add_argument("--report", action="store_true")
    p.add_argument("--root", type=Path, default=ROOT / "dptrain")
    args = p.parse_args(argv)
    rows = []
    for path in sorted(args.root.rglob("*.py")):
        rel = path.relative_to(args.root.parent)
        rows += [(str(rel), name, n, k) for name, n, k in functions(path)]
    long = [r for r in rows if r[2] > args.max_lines]
    wide = [r for r in rows if r[3] > args.max_params]
    if args.report:
        print("longest functions:")
        for f, name, n, _ in sorted(rows, key=lambda r: -r[2])[:15]:
            print(f"  {n:4d} lines  {f}:{name}")
        print("widest signatures:")
        for f, name, _, k in sorted(rows, key=lambda r: -r[3])[:15]:
            print(f"  {k:4d} params {f}:{name}")
    for f, name, n, _ in long:
        print(f"{f}:{name}: {n} lines > {args.max_lines}")
    for f, name, _, k in wide:
        print(f"{f}:{name}: {k} parameters > {args.max_params}")
    print(f"{len(rows)} functions; {len(long)} longer than {args.max_lines} lines; "
          f"{len(wide)} with more than {args.max_params} parameters")
    return 1 if long or wide else 0


if __name__ == "__main__":
    sys.exit(main())
