"""``dptrain check [--config-dir DIR] SETTINGS...``: the data holder's check of a table, with the
settings of the run it precedes (``python -m dptrain check`` works the same).

It composes the run's configuration from the same command line (``experiment=...`` and every
other setting may stay; only the ``data`` section is read), checks the data settings, reads the
table and reports every problem at once, with counts and the setting that handles each
(:mod:`dptrain.data.check`). It trains nothing and publishes nothing: the report quotes values of
the file, so it is printed for the data holder and written to ``<folder>/private/check.txt`` and
``check.json`` only (``<folder>``: ``hydra.run.dir=DIR``, default ``outputs/<date>/<time>-check``);
the folder gets no FILES.txt, so nothing in it is vouched for publication. Exit status 0 when the
table was read (whatever it holds), 2 when the settings or the file cannot be used.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError
from dptrain.data import read_table, schema_from_config
from dptrain.data.check import check_table, format_check, id_columns, numeric_lines, numeric_problems
from dptrain.data.rules import parse_numbers
from dptrain.data.schema import Schema, number_format
from dptrain.release.api import estimates_for_listed
from dptrain.release.cell_domain import from_table, from_values, read_keys_file
from dptrain.release.cells import Domain
from dptrain.runfolder.tracking import atomic_write_text, private_dir, write_json
from dptrain.runfolder.write_errors import folder_error, reason
from dptrain.settings.command_line import override_syntax_message
from dptrain.settings.data import TRAIN_DATA, as_source, check_source
from dptrain.settings.release import resolved_domain

USAGE = ("usage: dptrain check [--config-dir DIR] [SETTING=VALUE ...]   (the settings of the run: data=table "
         "data.path=FILE data.target=COLUMN ...; writes its PRIVATE report under hydra.run.dir, default "
         "outputs/<date>/<time>-check)")


def _arguments(argv: list[str]) -> tuple[list[str], Path | None, Path]:
    """(the overrides to compose, the --config-dir, the report's folder)."""
    overrides, config_dir, folder = [], None, None
    args = iter(argv)
    for arg in args:
        if arg in ("--config-dir", "-cd"):
            config_dir = Path(next(args, "")).resolve()
        elif arg.startswith("--config-dir="):
            config_dir = Path(arg.split("=", 1)[1]).resolve()
        elif arg in ("-m", "--multirun") or arg.startswith("-"):
            raise ConfigError(f"{arg} is not allowed with dptrain check: give the settings of ONE run (no sweep); "
                              "allowed: --config-dir DIR and SETTING=VALUE")
        elif arg.split("=", 1)[0] == "hydra.run.dir":
            folder = Path(arg.split("=", 1)[1])
        elif not arg.startswith(("hydra.", "hydra/")):
            overrides.append(arg)
    stamp = time.strftime("%Y-%m-%d/%H-%M-%S")
    return overrides, config_dir, folder or Path("outputs") / f"{stamp}-check"


def _compose(overrides: list[str], config_dir: Path | None) -> Any:
    """The run's composed config (the data section is what the check reads); the config schemas
    are registered by the command line (:mod:`dptrain.tasks.cli`) that calls this."""
    parser = OverridesParser.create()
    for text in overrides:  # one Hydra cannot read: the quoted form that works, or a config file
        try:
            parser.parse_overrides([text])
        except OverrideParseException as err:
            raise ConfigError(override_syntax_message(text, err, lambda t: parser.parse_overrides([t]))) from None
    try:
        parsed = parser.parse_overrides(overrides)
        if any(o.is_sweep_override() for o in parsed):
            raise ConfigError("a sweep (key=a,b) is not allowed with dptrain check: give the settings of ONE run")
        extra = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir is not None else []
        with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
            return compose(config_name="config", overrides=[*overrides, *extra])
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise ConfigError(f"the settings could not be composed ({str(err).splitlines()[0]}); allowed: the settings "
                          "of a run (docs/settings.md)") from None


def _table(data: Any, schema: Any) -> Any:
    """The table's rows, every column of a file (id columns included), checked for the declared ones."""
    path = data.path if data.name == "table" else None
    if not path:
        raise ConfigError(f"data.path={path!r} is not allowed: dptrain check reads the table of data=table")
    return read_table(path, fmt=data.format, delimiter=data.delimiter, text_columns=schema.text_columns,
                      required=schema.declared_columns)


def _release_check(conf: Any) -> tuple[dict[str, Any], str]:
    """task=release's table: x and y (missing, text, outside release.domain), the cell columns'
    missing values, the rows of cells not listed and the cells without release.min_n rows, what
    the release's rules would leave out, and id columns."""
    r, data = conf.release, conf.data
    check_source(data, ("table",), "dptrain check of a release")
    lo_x, hi_x, lo_y, hi_y = resolved_domain(r, "table")
    thousands, decimal = number_format(data)  # the release reads x and y written so (tasks/release.py)
    text = None if thousands is None and decimal == "." else [r.x, r.y]
    df = read_table(data.path, fmt=data.format, delimiter=data.delimiter, text_columns=text,
                    required=[("release.x", r.x), ("release.y", r.y), *(("release.cells", c) for c in r.cells)])
    plain = Schema(r.y, None, (), (), split_key=tuple(c for c in df.columns if c in r.cells), thousands=thousands,
                   decimal=decimal)
    report = {"rows": len(df), "numeric": {c: numeric_problems(df[c], plain, lo, hi) for c, lo, hi in
                                           ((r.x, lo_x, hi_x), (r.y, lo_y, hi_y))},
              "cells": {c: {"missing": int(df[c].isna().sum())} for c in r.cells},
              "ids": id_columns(df, Schema(r.y, None, (), ())), "run": None}
    listed = (from_values(dict(r.cell_values), list(r.cells)) if r.cell_values is not None else
              from_table(read_keys_file(r.cell_keys_file, list(r.cells)), list(r.cells), origin="declared",
                         setting="release.cell_keys_file") if r.cell_keys_file is not None else None)
    if listed is not None:
        rows = df.assign(**{c: parse_numbers(df[c].astype(object), thousands=thousands, decimal=decimal)[0]
                            for c in text or ()})
        est = estimates_for_listed(rows, listed, x=r.x, y=r.y, domain=Domain(lo_x, hi_x, lo_y, hi_y), clip=r.clip,
                                   drop_nonfinite=True)
        report["run"] = {**est.rows, "cells_below_min_n": int((est.cells.n < r.min_n).sum()),
                         "cells_listed": int(len(est.cells.n))}
    lines = [f"dptrain check of a release table: {len(df)} rows (PRIVATE: for the data holder, never published)"]
    for col, found in report["numeric"].items():
        lines += numeric_lines(col, found, data.nonfinite, "release.domain")
    lines += [f"  {c}: {v['missing']} rows with a missing cell value -> row left out" for c, v in
              report["cells"].items() if v["missing"]]
    if report["run"] is not None:
        run = report["run"]
        why = ", ".join(f"{what} {rule.replace('_', ' ')}: {n}" for what, rules in run["left_out_by"].items()
                        for rule, n in rules.items() if n) or "none"
        lines += [f"A release with these settings: {run['read']} rows read, {run['kept']} used, {run['left_out']} "
                  f"left out ({why}); {run['cells_below_min_n']} of {run['cells_listed']} listed cells have fewer "
                  f"than release.min_n={r.min_n} rows (not released)"]
    return report, "\n".join(lines)


def _probe_folder(folder: Path) -> None:
    """Refuse a report folder that cannot be created or written before any row is read; what the
    probe created is removed again (a refused check leaves no folder)."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    try:
        private_dir(folder)
    except OSError as err:
        raise folder_error(err, key="hydra.run.dir", folder=folder) from None
    if missing:
        shutil.rmtree(missing[-1], ignore_errors=True)


def run_check(argv: list[str]) -> int:
    """``dptrain check`` (module docstring); returns the exit status."""
    overrides, config_dir, folder = _arguments(argv)
    if (folder / "FILES.txt").exists():
        raise ConfigError(f"hydra.run.dir={str(folder)!r} holds a run; allowed: a new folder for the check's report")
    cfg = _compose(overrides, config_dir)
    _probe_folder(folder)
    if cfg.get("task") == "release":
        report, text = _release_check(OmegaConf.to_object(cfg))
        origin = f"data.path={str(cfg.data.path)!r}"
    else:
        data = as_source(OmegaConf.to_object(cfg.data))
        check_source(data, TRAIN_DATA, "dptrain check")
        schema = schema_from_config(data, require_negative=False)  # a missing data.negative is reported
        df = _table(data, schema)
        origin = f"data.path={str(data.path)!r}"
        report = check_table(df, schema, seed=int(cfg.get("seed", 0) or 0))
        text = format_check(report, origin)
    private = private_dir(folder)
    write_json(private / "check.json", {"data": origin, **report})
    atomic_write_text(private / "check.txt", text + "\n")
    print(text)
    print(f"\nreport (PRIVATE, never publish it): {private / 'check.txt'} and check.json")
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``dptrain check``: errors in dptrain's one style, exit 2."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        return run_check(argv)
    except DPTrainError as err:
        print(f"dptrain: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the report cannot be written (a full disk): one line, no traceback
        print(f"dptrain: error: dptrain check: cannot write {err.filename or 'its report'}: {reason(err)}; the "
              "table was checked but its report is not complete. Allowed: a hydra.run.dir on a disk with space",
              file=sys.stderr)
        return 2
