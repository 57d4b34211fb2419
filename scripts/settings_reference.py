"""Write docs/settings.md, the reference of every setting, from the schema (so it cannot drift).

    python scripts/settings_reference.py            # (re)write docs/settings.md
    python scripts/settings_reference.py --check    # exit 1 if docs/settings.md is out of date

Each setting's meaning and allowed values are metadata of its dataclass field
(``dptrain.core.validation.setting``: dptrain/settings/, dptrain/settings/release.py); its default
is the value the task's composed config holds (``python -m dptrain task=T [data=S]`` without a
preset), so a default set by a config file (conf/) is the one shown. The free-form sections
(``model``, ``optim``) list their config-group options instead, and the presets
(``experiment=NAME``) are listed with the first line of their description.
``tests/test_first_hour.py`` fails when docs/settings.md differs from what this script writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "settings.md"
CONF = ROOT / "conf"

HEADER = """# Settings reference

Every setting of `python -m dptrain`, per task: what it means, its default (the value the
task's composed config holds without a preset; presets, `experiment=NAME`, change some of them)
and what is allowed. Set one with `key=value` on the command line (`python -m dptrain
experiment=logit trainer.epochs=3`); a config group with `group=option` (`data=table`,
`optim=adam`). Keys the schema does not have are refused, also when added with `+` or `++`, with
the closest valid key suggested. `python -m dptrain ... --cfg job` prints a run's composed config.

This page is generated from the schema (the field metadata in `dptrain/settings/` and
`dptrain/settings/release.py`) by `python scripts/settings_reference.py`; do not edit it by hand
(the tests fail when it is out of date).
"""


def _yaml_value(value: Any) -> str:
    """A value as it is written on the command line / in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '""' if value == "" else value
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _compose(overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    import dptrain.tasks.cli  # noqa: F401  (registers the schemas)

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True)


def _rows(schema: type, values: dict, prefix: str) -> list[str]:
    """One table row per leaf setting of ``schema`` (nested dataclasses flattened)."""
    from dptrain.settings.command_line import _schema_of

    rows = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind, inner = _schema_of(hints[f.name], None)
        value = values.get(f.name) if isinstance(values, dict) else None
        if kind == "dataclass" and hints[f.name] is not Any:
            rows += _rows(inner, value or {}, f"{prefix}{f.name}.")
            continue
        meta = f.metadata or {}
        rows.append(f"| `{prefix}{f.name}` | `{_cell(_yaml_value(value))}` | {_cell(meta.get('allowed', ''))} | "
                    f"{_cell(meta.get('help', '(not described yet)'))} |")
    return rows


def _table(schema: type, values: dict, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    rows = [r for r in _rows(schema, values, prefix) if not any(r.startswith(f"| `{prefix}{s}") for s in skip)]
    return ["| setting | default | allowed | meaning |", "|---|---|---|---|", *rows, ""]


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _first_comment(path: Path) -> str:
    """The first sentence of a config file's leading comment."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.lstrip("#").strip().startswith("@package"):
            lines.append(line.lstrip("#").strip())
    return _first_sentence(" ".join(lines))


def _group_options(group: str) -> list[str]:
    """``group=option``: the option's keys and values (free-form groups: model, optim)."""
    import yaml

    lines = ["| option | keys |", "|---|---|"]
    for path in sorted((CONF / group).glob("*.yaml")):
        body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        keys = ", ".join(f"`{group}.{k}={_yaml_value(v)}`" for k, v in body.items() if k != "defaults")
        lines.append(f"| `{group}={path.stem}` | {_cell(keys)} |")
    return [*lines, ""]


def _presets() -> list[str]:
    lines = ["## Presets (`experiment=NAME`)", "", "| preset | what it runs |", "|---|---|"]
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        lines.append(f"| `experiment={path.stem}` | {_cell(_first_comment(path))} |")
    return [*lines, ""]


#: the data=table keys a release reads (the others declare a training schema)
RELEASE_TABLE_KEYS = ("name", "path", "format", "delimiter", "nonfinite")


def _data_sections(task: str, sources: tuple[str, ...]) -> list[str]:
    from dptrain.settings.data import DATA_SOURCES

    options = ", ".join(f"`data={s}`" for s in sources)
    lines = [f"### data (a config group: {options})", "",
             "Each source has its own keys; only the chosen source's keys are in a run's config.", ""]
    for source in sources:
        schema = DATA_SOURCES[source]
        values = _compose([f"task={task}", f"data={source}"])["data"]
        doc = _first_sentence((schema.__doc__ or "").split("\n\n")[0])
        skip: tuple[str, ...] = ()
        if task == "release" and source == "table":
            skip = tuple(f.name for f in dataclasses.fields(schema) if f.name not in RELEASE_TABLE_KEYS)
            doc += (" A release reads only the file settings below (its columns are release.x, release.y, "
                    "release.cells).")
        lines += [f"#### data={source}", "", doc, "", *_table(schema, values, "data.", skip=skip)]
    return lines


def _task_section(task: str, title: str, sources: tuple[str, ...], only: tuple[str, ...] | None = None) -> list[str]:
    """One task's settings: the top level, the data sources, the free-form groups, then each
    section (``only``: just those sections, for a task that adds to another's)."""
    from dptrain.tasks.registry import task_schemas as _task_schemas

    schema = _task_schemas()[task]
    hints = typing.get_type_hints(schema)
    values = _compose([f"task={task}"])
    lines = [f"## task={task}: {title}", ""]
    top = [f.name for f in dataclasses.fields(schema)]
    free = tuple(n for n in top if hints[n] is Any)  # data (per source), model, optim
    sections = [n for n in top if n not in free and dataclasses.is_dataclass(hints[n])]
    lines += ["### top level", "", *_table(schema, values, "", skip=tuple(sections) + free)]
    if only is None and sources:
        lines += _data_sections(task, sources)
    for group in ("model", "optim"):
        if only is None and group in free:
            lines += [f"### {group} (a config group; free-form: the keys its `_target_` takes)", "",
                      *_group_options(group)]
    for name in sections:
        if only is None or name in only:
            lines += [f"### {name}", "", *_table(hints[name], values[name], f"{name}.")]
    return lines


def render() -> str:
    """The text of docs/settings.md."""
    lines = [HEADER, *_presets()]
    lines += _task_section("train", "DP-SGD training (the default)", ("adult", "table", "synthetic", "panel"))
    lines += _task_section("audit", "a training run with canaries and an epsilon lower bound (every section of "
                           "task=train, with the same keys and defaults, plus audit)", (), only=("audit",))
    lines += _task_section("release", "small-cell regression releases (docs/release.md)", ("table", "atlas"))
    lines += _task_section("predict", "score new rows with a trained run's model.pt", ())
    lines += _task_section("tune", "a private hyperparameter search, one epsilon for all of it (docs/tuning.md; every "
                           "section of task=train, with the same keys and defaults, plus tune)", (), only=("tune",))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/settings.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python scripts/settings_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
