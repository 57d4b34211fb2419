"""The command line's first check, light: ``python -m dptrain`` composes the config and checks
its keys and types (a misspelt key, a value of the wrong type, a key of another task or data
source, a group option that does not exist, a ``+key`` the schema does not have) with the
schemas of :mod:`dptrain.settings.schemas` BEFORE the tasks, torch and pandas are imported
(:func:`check_before_tasks`, called by :mod:`dptrain.__main__` before it imports
:mod:`dptrain.tasks.cli`): a typo is refused in a fraction of the time the import takes
(scripts/bench_refusal.py, docs/performance.md). This module imports Hydra, OmegaConf and the
schemas only (tests/test_light_check.py checks that torch, pandas, scipy, scikit-learn,
matplotlib and opacus stay unloaded). The value checks of each task (ranges, choices that need
a registry: objectives, accountants, engines, release methods) run when the task starts, as
before. A command line that names ``plugins`` is checked after they are imported
(:func:`dptrain.tasks.cli.preload_plugins`): a plugin may add a task and its schema.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import closest
from dptrain.settings.command_line import check_known_keys, free_form_key_message, type_mismatch_message
from dptrain.settings.schemas.data import DATA_SOURCES
from dptrain.settings.schemas.predict import PredictRunConfig
from dptrain.settings.schemas.release import ReleaseRunConfig
from dptrain.settings.schemas.tables import LodesRunConfig, SynthesizeRunConfig, TabulateRunConfig, TopDownRunConfig
from dptrain.settings.schemas.train import (
    AuditRunConfig,
    TrainRunConfig,
    TuneRunConfig,
    sigma_unless_target,
    value_if_private,
)

#: task name -> the root dataclass of its config, for the nine tasks dptrain ships (the registry of
#: :mod:`dptrain.tasks.registry` holds the same classes, and a plugin's tasks)
SCHEMAS: dict[str, type] = {"train": TrainRunConfig, "audit": AuditRunConfig, "release": ReleaseRunConfig,
                            "predict": PredictRunConfig, "tune": TuneRunConfig, "tabulate": TabulateRunConfig,
                            "synthesize": SynthesizeRunConfig, "topdown": TopDownRunConfig, "lodes": LodesRunConfig}

#: the subcommands that run without Hydra (dptrain verify | publish | check ...)
SUBCOMMANDS = ("verify", "publish", "check")

#: command lines already composed and checked in this process (the second check of the same one
#: is skipped: :func:`check_before_tasks` then :func:`dptrain.tasks.cli.main`)
_PASSED: set[tuple[str, ...]] = set()


def register_schemas(schemas: Mapping[str, type]) -> None:
    """Register each task's schema (``schema/NAME``) that ``conf/task/NAME.yaml`` extends, each
    data source's schema (``schema/data/NAME``) that ``conf/data/NAME.yaml`` extends, and the
    ``unless_target`` and ``if_private`` resolvers the privacy presets use."""
    store = ConfigStore.instance()
    for name, schema in schemas.items():
        store.store(group="schema", name=name, node=schema)
    for name, schema in DATA_SOURCES.items():  # conf/data/NAME.yaml: defaults [/schema/data/NAME@_here_]
        store.store(group="schema/data", name=name, node=schema)
    if not OmegaConf.has_resolver("unless_target"):
        OmegaConf.register_new_resolver("unless_target", sigma_unless_target)
    if not OmegaConf.has_resolver("if_private"):
        OmegaConf.register_new_resolver("if_private", value_if_private)


def check_before_tasks(argv: list[str]) -> None:
    """``python -m dptrain ARGS``' first step: compose and check the command line ``argv`` with the
    shipped tasks' schemas; a mistake exits 2 with one ``dptrain: error:`` line before any task,
    torch or pandas is imported. Nothing to do for the subcommands (``verify``, ``publish``,
    ``check``) and for a command line that names ``plugins`` (checked once they are imported)."""
    if argv[:1] and argv[0] in SUBCOMMANDS or command_line_plugins(argv):
        return
    register_schemas(SCHEMAS)
    check_composition(argv, SCHEMAS)


def command_line_plugins(argv: list[str]) -> list[str]:
    """The modules named by ``plugins=[...]`` (``+plugins``, ``++plugins``; every value of a sweep
    ``plugins=[a],[a,b]``) among the command-line arguments ``argv``, in order, each once. A
    malformed override gives none here: Hydra refuses it by name when it composes."""
    items = [a for a in argv if not a.startswith("-") and a.lstrip("+").partition("=")[0].strip() == "plugins"]
    if not items:
        return []
    try:
        parsed = OverridesParser.create().parse_overrides(items)
    except OverrideParseException:
        return []
    modules: list[str] = []
    for override in parsed:
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        for value in values:
            for module in value if isinstance(value, list) else [value]:
                if isinstance(module, str) and module not in modules:
                    modules.append(module)
    return modules


def first_of_sweeps(argv: list[str]) -> list[str] | None:
    """The command line's overrides for one composition: Hydra's own (hydra.*) dropped, a sweep
    replaced by its first value; None when Hydra must see the command line itself (--help,
    --cfg, --config-dir, ... or an override it cannot parse: its message then is the answer)."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    texts = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(texts)
    except (OverrideParseException, HydraException):
        return None
    out = []
    for text, override in zip(texts, parsed):
        if override.is_hydra_override():
            continue
        if not override.is_sweep_override():
            out.append(text)
            continue
        try:
            first = next(iter(override.sweep_iterator()))
        except (HydraException, StopIteration):
            continue
        out.append(f"{override.get_key_element()}={override_value(first)}")
    return out


def override_value(value: Any) -> str:
    text = str(value)
    return text if isinstance(value, (int, float, bool)) or text.replace("_", "").replace("-", "").replace(
        ".", "").replace("/", "").isalnum() else "'" + text.replace("'", "\\'") + "'"


def check_composition(argv: list[str], schemas: Mapping[str, type]) -> None:
    """Compose the command line's config before Hydra does, so that every mistake Hydra would
    report in its own words (a misspelt key written ``key=value``, a value of the wrong type, a
    key of another task or data source, a group option that does not exist) gets dptrain's one
    error style, exit 2: a key the config does not have is checked as if written ``++key=value``
    (the schema's check, which names the closest key and where the key belongs), any other
    failure is Hydra's message without its advice to add ``+`` (which would be the wrong fix)."""
    overrides = first_of_sweeps(argv)
    if overrides is None or tuple(argv) in _PASSED:
        return
    try:
        with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
            check_known_keys(compose(config_name="config", overrides=overrides), schemas)
        _PASSED.add(tuple(argv))
        return
    except DPTrainError as err:
        print(f"dptrain: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        failure = err
    message = composition_message(failure, overrides, schemas)
    print(f"dptrain: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def composition_message(err: Exception, overrides: list[str], schemas: Mapping[str, type]) -> str:
    """dptrain's words for a composition failure (:func:`check_composition`)."""
    cause = err.__cause__ or err
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    full_key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")), None)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and full_key is not None:
        forced = [f"++{o}" if "=" in o and not o.startswith(("+", "~")) and (
            "." in o.split("=", 1)[0] or (o.split("=", 1)[0] + ".").startswith(full_key + ".")) else o
            for o in overrides]  # every dotted key: the schema's check then names each key this task lacks
        try:
            with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
                composed = compose(config_name="config", overrides=forced)
            check_known_keys(composed, schemas)
        except DPTrainError as known:
            return str(known).replace("refused (a key added with + or ++ is checked too)", "refused")
        except (HydraException, OmegaConfBaseException, ValueError):
            pass
        else:  # a free-form section (model, optim): its keys are its builder's arguments
            return free_form_key_message(composed, full_key, overrides)
    no_group = re.search(r"Could not override '([^']+)'. No match in the defaults list", str(err))
    if no_group:
        group = no_group.group(1)
        task = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "task"), "train")
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == group), "...")
        return (f"{group}={value} is not allowed: task={task} takes no {group}=NAME (no {group} group in this "
                f"task); allowed: drop it; the keys task={task} has are listed in docs/settings.md")
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", str(err))
    if missing:
        group, option = missing.groups()
        options = [line for line in str(err).split("Available options in")[-1].split("Config search path")[0]
                   .splitlines()[1:] if line.strip()] if "Available options" in str(err) else []
        options = [o.strip() for o in options]
        close = closest(option, options, n=1)
        return (f"{group}={option}" + (f" (did you mean {group}={close[0]}?)" if close else "")
                + f": no such option of {group}; allowed: {', '.join(options) or 'see python -m dptrain --help'}")
    detail = [line for line in lines if not line.startswith(("full_key:", "reference_type=", "object_type=",
                                                             "To append to your config use", "Config search path",
                                                             "provider="))]
    keys = [o.lstrip("+").split("=", 1)[0] for o in overrides]
    if full_key and full_key not in keys:  # OmegaConf names a key relative to the node it was merged into
        full_key = next((k for k in keys if k.endswith(f".{full_key}")), full_key)
    value = next((o.split("=", 1)[1] for o in overrides if full_key and o.lstrip("+").split("=", 1)[0] == full_key),
                 None)
    where = f"{full_key}={value}: " if value is not None else (f"{full_key}: " if full_key else "")
    mismatch = type_mismatch_message(detail[0], full_key, value) if detail else None
    if mismatch is not None:
        return f"{mismatch}. Every setting, its type and allowed values: docs/settings.md (python -m dptrain --help)"
    typed = re.match(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", detail[0]) if detail else None
    if typed:
        kind = {"Float": "number", "Integer": "whole number", "Boolean": "true or false"}.get(typed.group(2),
                                                                                            typed.group(2))
        detail = [f"{typed.group(1)!r} is not a {kind}; {full_key} takes a {kind}"]
    return (f"{where}{'; '.join(detail) or str(err)}. Every setting, its type and allowed values: docs/settings.md "
            "(python -m dptrain --help)")
