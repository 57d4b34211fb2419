"""Checks of the composed config as a whole, with the command line that composed it: keys the
task's schema does not have (however they were added), a sweep preset without ``-m``, an
optimiser changed while the learning rate stays another optimiser's, privacy settings without
privacy."""

from __future__ import annotations

import dataclasses
import importlib.resources
import re
import shlex
import types
import typing
from collections.abc import Mapping
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from dptrain.core.validation import (
    ConfigError,
    bad,
    closest,
)
from dptrain.settings.builders import closest_argument
from dptrain.settings.schemas.data import DATA_SOURCES


def _schema_of(hint: Any, value: Any) -> tuple[str, Any]:
    """How to walk a value of the annotated type: ("dataclass", cls), ("dict", cls) for a mapping
    of dataclasses, or ("leaf", None). ``Any`` fields (model, optim, data) are free-form unless
    the composed node carries its own schema (data: the source's dataclass)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if dataclasses.is_dataclass(hint):
        return "dataclass", hint
    if typing.get_origin(hint) is dict and len(typing.get_args(hint)) == 2:
        inner = typing.get_args(hint)[1]
        if dataclasses.is_dataclass(inner):
            return "dict", inner
    if hint is Any and isinstance(value, DictConfig):
        node_type = OmegaConf.get_type(value)
        if dataclasses.is_dataclass(node_type):
            return "dataclass", node_type
    return "leaf", None


def _walk(node: Any, schema: type, prefix: str, out: list[tuple[str, list[str]]]) -> None:
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key in list(node.keys()):
        path = f"{prefix}{key}"
        if key not in names:
            out.append((path, [f"{prefix}{n}" for n in names]))
            continue
        value = node._get_node(key) if isinstance(node, DictConfig) else node[key]
        kind, inner = _schema_of(hints[key], value)
        if not isinstance(value, (Mapping, DictConfig)) or kind == "leaf":
            continue
        if kind == "dataclass":
            _walk(value, inner, f"{path}.", out)
        else:
            for item in list(value.keys()):
                sub = value._get_node(item) if isinstance(value, DictConfig) else value[item]
                if isinstance(sub, (Mapping, DictConfig)):
                    _walk(sub, inner, f"{path}.{item}.", out)


def unknown_settings(cfg: Any, schema: type) -> list[tuple[str, list[str]]]:
    """Every key of the composed ``cfg`` (a DictConfig or mapping; its ``hydra`` node is skipped)
    that ``schema`` (a task's root dataclass) does not have, with the valid keys at that level.
    ``+key=value`` and ``++key=value`` add keys Hydra does not check; OmegaConf would even set
    them as attributes of the dataclass objects."""
    out: list[tuple[str, list[str]]] = []
    node = cfg
    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        node = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    _walk(node, schema, "", out)
    return out


def _all_paths(schema: type, prefix: str = "") -> list[str]:
    paths = []
    for f in dataclasses.fields(schema):
        kind, inner = _schema_of(typing.get_type_hints(schema)[f.name], None)
        paths.append(f"{prefix}{f.name}")
        if kind == "dataclass":
            paths += _all_paths(inner, f"{prefix}{f.name}.")
    return paths


def _suggestion(path: str, siblings: list[str], everywhere: list[str], cfg: Any) -> str:
    """" (did you mean X?)": the same name in another section, else the closest key at that
    level, else the closest anywhere; for data, the sources that have the key."""
    section, _, last = path.rpartition(".")
    if section == "data":
        owners = [name for name, schema in DATA_SOURCES.items()
                  if last in {f.name for f in dataclasses.fields(schema)}]
        if owners:
            current = cfg.get("data", {}).get("name") if isinstance(cfg, (Mapping, DictConfig)) else None
            return (f" (a key of {', '.join(f'data={o}' for o in owners)}, not of data={current}: choose the "
                    "source with data=NAME)")
    same = [p for p in everywhere if p.rsplit(".", 1)[-1] == last and p != path]
    best = same[:1] or closest(path, siblings, n=1) or closest(path, everywhere, n=1)
    return f" (did you mean {best[0]}?)" if best else ""


def _refused_why(schema: type, path: str) -> str | None:
    """Why the section of ``path`` refuses its key, when its dataclass says (``REFUSED_KEYS``: {key:
    why}, e.g. task=predict's data section for the training data sources' keys), else None."""
    *sections, last = path.split(".")
    for name in sections:
        kind, inner = _schema_of(typing.get_type_hints(schema).get(name, Any), None)
        if kind != "dataclass":
            return None
        schema = inner
    return getattr(schema, "REFUSED_KEYS", {}).get(last)


def renamed_settings(schema: type, prefix: str = "") -> dict[str, tuple[str, str]]:
    """{old path: (new path, why)} of every setting a schema renamed: a dataclass's ``RENAMED``
    class attribute ({old key: (new key, why)}), in the schema and its nested sections."""
    out = {f"{prefix}{old}": (f"{prefix}{new}", why) for old, (new, why) in getattr(schema, "RENAMED", {}).items()}
    for f in dataclasses.fields(schema):
        kind, inner = _schema_of(typing.get_type_hints(schema)[f.name], None)
        if kind == "dataclass":
            out.update(renamed_settings(inner, f"{prefix}{f.name}."))
    return out


def check_renamed(cfg: Any, schema: type, unknown: list[str]) -> None:
    """Refuse a renamed setting by its old name, with the new name and why it changed (never
    accepted silently: a key that changed meaning must be rewritten by the user)."""
    renamed = renamed_settings(schema)
    old = next((path for path in unknown if path in renamed), None)
    if old is None:
        return
    new, why = renamed[old]
    value = OmegaConf.select(OmegaConf.create(cfg) if not isinstance(cfg, DictConfig) else cfg, old, default=None)
    shown = f"{old}={value}" if value is not None else old
    raise ConfigError(f"{shown} is refused: the setting was renamed {new} ({why}). Write {new}="
                      f"{value if value is not None else 'VALUE'} instead (in a sweep: {new}=A,B,...)")


def check_known_keys(cfg: Any, schemas: Mapping[str, type]) -> None:
    """Refuse any key of the composed config that its task's schema (``schemas[task]``) does not
    have (however it was added), naming it and the closest valid key. Runs before anything else."""
    task = cfg.get("task", "train") if isinstance(cfg, (Mapping, DictConfig)) else getattr(cfg, "task", "train")
    schema = schemas.get(task)
    if schema is None:
        return  # the task registry refuses the task by name
    unknown = unknown_settings(cfg, schema)
    if not unknown:
        return
    check_renamed(cfg, schema, [path for path, _ in unknown])
    everywhere = _all_paths(schema)
    parts = [f"{path} ({why})" if (why := _refused_why(schema, path)) else
             f"{path}{_suggestion(path, siblings, everywhere, cfg)}" for path, siblings in unknown]
    level = unknown[0][1]
    raise ConfigError(
        f"{', '.join(parts)}: not a setting of task={task}, refused (a key added with + or ++ is checked too); "
        f"allowed at that level: {', '.join(level)}. Every setting is listed in docs/settings.md "
        "(python -m dptrain --help)")


#: privacy settings that do nothing when privacy.enabled=false
PRIVATE_ONLY = ("noise_multiplier", "target_epsilon", "max_grad_norm", "delta", "accountant", "calibration_rtol",
                "max_epsilon")


def override_keys(overrides: Any) -> dict[str, str]:
    """``{key: value}`` of command-line overrides (``key=v``, ``+key=v``, ``++key=v``, ``~key``)."""
    out = {}
    for item in overrides or []:
        key, _, value = str(item).lstrip("~+").partition("=")
        out[key.strip().lstrip("/")] = value.strip()
    return out


def _package_yaml(*parts: str) -> dict:
    """A file of the shipped conf/ (dptrain.conf), parsed; {} when it is not there."""
    try:
        node = importlib.resources.files("dptrain.conf").joinpath(*parts)
        return yaml.safe_load(node.read_text(encoding="utf-8")) or {}
    except (FileNotFoundError, OSError, ModuleNotFoundError):
        return {}


def _default_choice(defaults: Any, group: str) -> str | None:
    for entry in defaults or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if key.replace("override ", "").strip().lstrip("/") == group:
                    return value
    return None


def preset_optimiser(choices: Mapping) -> str | None:
    """The optim group the preset (experiment=NAME) or else the task's file picks, from the
    shipped conf/; None when unknown (a preset of the user's own --config-dir)."""
    preset = choices.get("experiment")
    if preset:
        picked = _default_choice(_package_yaml("experiment", f"{preset}.yaml").get("defaults"), "optim")
        if picked:
            return picked
    return _default_choice(_package_yaml("task", f"{choices.get('task') or 'train'}.yaml").get("defaults"), "optim")


def check_optimiser_change(cfg: Any, keys: Mapping[str, str], choices: Mapping) -> None:
    """``experiment=logit optim=adam`` would keep the preset's optim.lr (4.0, tuned for SGD):
    when the optimiser is changed on the command line (``optim=NAME`` or ``optim._target_=...``)
    while the learning rate still comes from a preset or another optimiser's file, ask for an
    explicit ``optim.lr``."""
    changed = [k for k in ("optim", "optim._target_") if k in keys]
    lr = cfg.optim.get("lr") if isinstance(cfg.optim, (Mapping, DictConfig)) else None
    if not changed or "optim.lr" in keys or lr is None:
        return
    if changed == ["optim"]:
        chosen = choices.get("optim")
        own_lr = _package_yaml("optim", f"{chosen}.yaml").get("lr")
        if own_lr == lr or chosen == preset_optimiser(choices):
            return
        source = f"the preset experiment={choices.get('experiment')}" if choices.get("experiment") else "the preset"
        what = f"optim={chosen}"
    else:
        source = f"conf/optim/{choices.get('optim')}.yaml or the preset"
        what = f"optim._target_={keys['optim._target_']}"
    raise ConfigError(
        f"optim.lr={lr!r} is not allowed implicitly: it comes from {source} and was tuned for another optimiser, "
        f"but {what} changed the optimiser on the command line; allowed: set the learning rate for this "
        "optimiser explicitly, e.g. optim.lr=0.01 (conf/optim/adam.yaml's default for Adam)")


def check_privacy_off(cfg: Any, keys: Mapping[str, str]) -> None:
    """Privacy settings given on the command line of a run without privacy do nothing: refused."""
    if cfg.privacy.get("enabled", True) is not False:
        return
    for key, value in keys.items():
        name = key.partition(".")[2]
        if key.startswith("privacy.") and name in PRIVATE_ONLY and value.lower() not in ("null", "none", "~", ""):
            raise ConfigError(f"{key}={value} is not allowed: it has no effect with privacy.enabled=false (this run "
                              "trains without privacy: no clipping, no noise, no epsilon); allowed: drop it, or train "
                              "privately (experiment=logit, or privacy=dp / privacy.enabled=true)")


def check_command_line(cfg: Any, *, overrides: Any, choices: Mapping, multirun: bool) -> None:
    """Settings that would silently do nothing or the wrong thing, judged with the command line
    (Hydra's overrides and its config-group choices): a sweep preset without ``-m``, an optimiser
    changed while the learning rate stays another optimiser's, privacy settings without privacy."""
    keys = override_keys(overrides)
    sweep = choices.get("sweep")
    if sweep and not multirun:
        raise bad("sweep", sweep, "a sweep preset lists the runs of a multirun (hydra.sweeper.params); without -m "
                  f"it would be ONE plain run; allowed: python -m dptrain -m ... sweep={sweep}")
    if cfg.get("task") in ("train", "audit"):
        check_optimiser_change(cfg, keys, choices)
        check_privacy_off(cfg, keys)


#: characters that end a word inside an override's value (Hydra's grammar: lists, dicts, key: value)
_WORD_ENDS = " ,[]{}:=\"'"
#: what a lexer error of Hydra's grammar starts with; its caret line points under the override
_LEXER = "LexerNoViableAltException: "


def _bad_position(text: str, message: str) -> int | None:
    """The index in ``text`` of the character Hydra's lexer could not read (its caret line)."""
    lines = message.splitlines()
    if not lines or not lines[0].startswith(_LEXER) or len(lines) < 2 or "^" not in lines[1]:
        return None
    index = lines[1].index("^") - len(_LEXER)
    return index if 0 <= index < len(text) else None


def _quoted_at(text: str, index: int) -> str:
    """``text`` with the word around ``index`` (its value part) put in double quotes."""
    start = max(index, text.find("=") + 1)
    while start > 0 and text[start - 1] not in _WORD_ENDS:
        start -= 1
    end = index
    while end < len(text) and text[end] not in _WORD_ENDS:
        end += 1
    word = text[start:end].strip()
    lead = len(text[start:end]) - len(text[start:end].lstrip())
    return f"{text[:start + lead]}\"{word}\"{text[start + lead + len(word):]}"


def quoted_override(text: str, parse: Any) -> str | None:
    """``text`` with every word Hydra's lexer cannot read put in double quotes, when ``parse`` (a
    callable that raises on a bad override) then reads it; None otherwise."""
    fixed = text
    for _ in range(20):
        try:
            parse(fixed)
            return fixed if fixed != text else None
        except Exception as err:  # noqa: BLE001 - Hydra's parse errors: only the message is read
            index = _bad_position(fixed, str(err))
            if index is None:
                return None
            fixed = _quoted_at(fixed, index)
    return None


def override_syntax_message(text: str, err: Exception, parse: Any) -> str:
    """dptrain's words for an override Hydra's grammar cannot read: the character, the exact
    quoted form that works (checked with ``parse``), or a config file."""
    message = str(err)
    index = _bad_position(text, message)
    what = (f"{text[index]!r} cannot be written unquoted (Hydra's override grammar reads only ASCII letters, digits "
            "and _-+./\\ and a few more outside quotes)" if index is not None
            else " ".join(line for line in message.splitlines()[:2] if not line.startswith("See https")))
    fixed = quoted_override(text, parse)
    form = (f"quote the value, as in {shlex.quote(fixed)} (the double quotes for Hydra, the single quotes around "
            "the whole argument for the shell)" if fixed is not None
            else "put a value with spaces or other characters in double quotes inside the argument and the whole "
            "argument in single quotes (data.positive='\"a b\"'), with every bracket closed")
    return (f"the override {text!r} cannot be read: {what}. Allowed: {form}; or write the setting in a YAML config "
            "file, where any label works (--config-dir DIR data=NAME with DIR/data/NAME.yaml, docs/quickstart.md)")


def type_mismatch_message(detail: str, key: str | None, value: str | None) -> str | None:
    """dptrain's words for OmegaConf's type errors at composition (``detail``: its first line) on
    ``key`` (the full key, as OmegaConf names it) set to ``value`` (the override's text, when the
    override names the key itself): a scalar where a list or a mapping is needed, a list where a
    mapping is. None: not one of these."""
    if key is None:
        return None
    last = key.rsplit(".", 1)[-1]
    hinted = re.match(r"Value '(.*)' \(\w+\) is incompatible with type hint '.*List", detail)
    listed = re.match(r"Invalid value assigned: \w+ is not a ListConfig, list or tuple", detail)
    if hinted or listed:
        text = hinted.group(1) if hinted else (value if value is not None else "...")
        inside = (f"; inside a mapping: '++{key.rsplit('.', 1)[0]}={{{last}: [{text}]}}'" if "." in key and hinted
                  else "")
        return (f"{key}={text!r} is not allowed: {key} takes a list, e.g. {key}=[{text}] (one value is a list of one)"
                f"{inside}")
    subclass = re.match(r"Invalid type assigned: (\w+) is not a subclass of (\w+)\. value: (.*)", detail)
    if subclass:
        example = "{lower: 0, upper: 100}" if subclass.group(2) == "NumericColumn" else "{key: value, ...}"
        return (f"{key}={subclass.group(3)!r} is not allowed: {key} takes a mapping ({subclass.group(2)}), e.g. "
                f"{{{last}: {example}}}")
    if detail.startswith("Cannot merge DictConfig with ListConfig"):
        example = "{column: [value, ...]}" if key.startswith("data.categorical") else "{key: value, ...}"
        return (f"{key}={value if value is not None else '[...]'} is not allowed: {key} takes a mapping, "
                f"not a list, e.g. '++{key}={example}'")
    return None


def free_form_key_message(cfg: Any, key: str, overrides: Any) -> str:
    """``model.activatoin=relu`` (no +) on a free-form section (model, optim: its keys are its
    ``_target_``'s arguments): the key is not in the section; the closest key that is."""
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else None
    siblings = [f"{parent}.{k}" for k in (node.keys() if isinstance(node, DictConfig) else []) if k != last]
    value = override_keys(overrides).get(key, "...")
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    owner = f"{parent} ({target})" if target else parent or "the config"
    best = closest(key, [s for s in siblings if not s.endswith("._target_")], n=1)
    argument = None if best else closest_argument(target, last)
    hint = (f" (did you mean {best[0]}?)" if best else
            f" (did you mean ++{parent}.{argument}={value}? {target} takes {argument})" if argument else "")
    return (f"{key}={value} is not allowed: {owner} has no setting {last!r}{hint}; allowed: "
            f"{', '.join(siblings) or 'none'}, or an argument its _target_ takes, added with ++{key}=VALUE. Every "
            "setting: docs/settings.md (python -m dptrain --help)")
