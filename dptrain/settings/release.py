"""The settings of a release run (``release.*``) and their checks, before any row is read.

See docs/release.md for what each setting means for privacy. ``validate_release`` takes the
run's whole config (it also checks the ``data`` choice that a release can read).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dptrain.core.errors import ReleaseError
from dptrain.core.validation import (
    ConfigError,
    bad,
    integer,
    one_of,
    setting,
)
from dptrain.core.validation import bad as _bad
from dptrain.core.validation import finite_positive as _finite_positive
from dptrain.core.validation import integer as _integer
from dptrain.core.validation import is_real as _is_real
from dptrain.core.validation import one_of as _one_of
from dptrain.data.schema import number_format
from dptrain.release.cell_domain import CellSource, check_listing
from dptrain.release.dp_mos import stage_epsilons
from dptrain.release.spec import ReleaseSpec
from dptrain.release.units import UnitBound
from dptrain.settings.common import (
    TASKS_ALLOWED,
    RunBase,
    check_common,
    check_noise_seed_file,
    check_unit_bound,
    max_rows_per_unit_setting,
)
from dptrain.settings.data import check_delimiter, check_source

DOMAIN_HELP = ("PUBLIC bounds of (x, y), declared from documentation or domain knowledge (never from the rows). "
               "They bound what one person can change: the sensitivity of every released statistic, and so its "
               "noise, is computed from them, and rows are clipped into them (release.clip)")


STATISTIC_SETTINGS = ("p25", "p75", "slope", "custom")


@dataclass
class DomainConfig:
    """The PUBLIC domain of (x, y); rows are clipped into it (release.clip) or left out. Required
    for data=table; data=atlas (the simulator) uses its public design [0, 1] x [0, 1]."""

    x_lo: float | None = setting(None, help="lower bound of x", allowed="a finite number < x_hi (required for "
                                 "data=table)")
    x_hi: float | None = setting(None, help="upper bound of x", allowed="a finite number > x_lo (required for "
                                 "data=table)")
    y_lo: float | None = setting(None, help="lower bound of y", allowed="a finite number < y_hi (required for "
                                 "data=table)")
    y_hi: float | None = setting(None, help="upper bound of y", allowed="a finite number > y_lo (required for "
                                 "data=table)")


#: the simulator's public design (data=atlas): percentile ranks
SIMULATOR_DOMAIN = {"x_lo": 0.0, "x_hi": 1.0, "y_lo": 0.0, "y_hi": 1.0}


def resolved_domain(r: ReleaseConfig, data_name: str) -> tuple[float, float, float, float]:
    """(x_lo, x_hi, y_lo, y_hi): the declared release.domain, or, for data=atlas, the simulator's
    public [0, 1] design where a bound is left null. Raises ConfigError for data=table without a
    complete declaration (what the domain is for is in the message)."""
    dom = r.domain
    values = {k: getattr(dom, k) for k in SIMULATOR_DOMAIN}
    missing = [k for k, v in values.items() if v is None]
    if missing and data_name != "atlas":
        raise ConfigError(
            f"release.domain.{missing[0]}=None is not allowed: declare the PUBLIC domain of x and y for "
            f"data={data_name}, e.g. release.domain={{x_lo: 0, x_hi: 200000, y_lo: 0, y_hi: 1}}. The domain bounds "
            "what one person's row can change: the noise of every released statistic is computed from it, and "
            "rows outside it are clipped into it (release.clip=false leaves them out), so it must come from "
            "documentation or domain knowledge, never from the rows; a domain that misses the data (x in dollars "
            "against the default [0, 1] of percentile ranks) releases nothing useful")
    x_lo, x_hi, y_lo, y_hi = (float(SIMULATOR_DOMAIN[k] if v is None else v) for k, v in values.items())
    for lo, hi, name in ((x_lo, x_hi, "x"), (y_lo, y_hi, "y")):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise _bad(f"release.domain.{name}", f"[{lo:g}, {hi:g}]", "bounds must be finite with lo < hi (a null "
                       "bound of data=atlas is the simulator's 0 or 1)")
    return x_lo, x_hi, y_lo, y_hi


@dataclass
class ReleaseConfig:
    """Small-cell regression releases (docs/release.md). ``epsilon`` is PER STATISTIC (theta, SE, N
    each get it; a cell costs 3 epsilon; disjoint cells compose in parallel). The cells come from
    a public declaration (``cell_values`` / ``cell_keys_file``) or a private selection
    (``cell_selection=private``), never from the rows present."""

    x: str = setting("x", help="the regressor column (e.g. parent income rank)", allowed="a numeric column")
    y: str = setting("y", help="the outcome column (e.g. child income rank)", allowed="a numeric column")
    cells: list[str] = setting(help="columns whose value combinations define the cells",
                               allowed="one or more columns", factory=lambda: ["cell"])
    statistic: str = setting("p25", help="what each cell releases: the OLS prediction at the 25th / 75th "
                             "percentile of the x domain, the slope, or custom (release.stat_fn, brute-force "
                             "refits)", allowed=" | ".join(STATISTIC_SETTINGS))
    stat_fn: str | None = setting(None, help="f(x, y) -> float for statistic=custom",
                                  allowed="'package.module:function' | null")
    neighbors: str = setting("add_remove", help="MOS only: the neighbour relation (add: the Stata guide; "
                             "add_remove: the paper's definition; dp_mos needs add_remove)", allowed="add | add_remove")
    noise: str = setting("laplace", help="MOS only: discrete Laplace (grid-snapped) or normal of the same variance "
                         "(dp_mos needs laplace)", allowed="laplace | normal")
    method: str = setting("mos", help="what release.csv holds: mos (NOT DP) | suppression_5/10/20 (EXACT values, NOT "
                          "DP) | ss_laplace | noisy_stats | theil_sen | theil_sen_wide | dp_gd | dp_sgd",
                          allowed="a method registered in dptrain/release/methods/ (or by a plugin)")
    # typed Any and null by default (a free-form mapping; Hydra adds no key to a mapping in struct
    # mode, but replaces a null): the method declares its own keys and checks their values
    # (dptrain.release.methods.check_release_method), before any row is read
    method_settings: Any = setting(None, help="the settings release.method itself declares (ReleaseMethod.settings: "
                                   "names and defaults), e.g. release.method_settings={threshold: 10}; the method "
                                   "checks them (check_settings) before any row is read, and release.json records "
                                   "them. The built-in methods declare none", allowed="a mapping of the chosen "
                                   "method's own settings | null (its defaults)")
    epsilon: float = setting(1.0, help="epsilon PER STATISTIC (theta, its SE and N each get it: a MOS cell costs 3 "
                             "epsilon; disjoint cells compose in parallel)", allowed="a number > 0")
    min_n: int = setting(3, help="cells with N < min_n are not released and do not enter chi (a suppression rule "
                         "on the PRIVATE N)", allowed="an integer >= 3")
    chi_by: list[str] = setting(help="MOS and DP-MOS: [] = one chi over all cells; e.g. [state] = one chi per state",
                                allowed="columns of the cell list", factory=list)
    domain: DomainConfig = setting(help=DOMAIN_HELP, factory=DomainConfig)
    clip: bool = setting(True, help="clip rows into release.domain (false: leave rows outside it out, counted "
                         "privately)", allowed="true | false")
    # The cells (dptrain.release.cell_domain): a PUBLIC declaration, or a private selection.
    # cell_values is typed Any because Hydra cannot add keys to a typed dict in struct mode:
    # validate_release checks it.
    cell_values: Any = setting(None, help="the PUBLIC cells: {column: [values]} for each release.cells column; the "
                               "cells are the cross product", allowed="a mapping of lists | null")
    cell_keys_file: str | None = setting(None, help="a CSV / Parquet listing the PUBLIC cells, one column per "
                                         "release.cells column (for domains that are not a product)",
                                         allowed="a file path | null")
    cell_selection: str = setting("declared", help="declared: the list above (data=atlas: the simulator's design); "
                                  "private: cells selected from the rows by a stability-based histogram, "
                                  "(selection_epsilon, selection_delta)-DP", allowed="declared | private")
    selection_epsilon: float = setting(1.0, help="epsilon of the private cell selection (composed into the "
                                       "totals)", allowed="a number > 0")
    selection_delta: float = setting(1e-6, help="delta of the private cell selection", allowed="a number in (0, 1)")
    private_evaluation: str = setting("auto", help="compare every method against EXACT private values (tables and "
                                      "figures in <run>/private/evaluation/, never publishable); auto: only for "
                                      "simulated data (data=atlas)", allowed="auto | true | false")
    theil_sen_variant: str = setting("auto", help="DP Theil-Sen pairs: all_pairs | matchings (k random matchings) | "
                                     "auto (matchings above the pair limit)", allowed="auto | all_pairs | matchings")
    theil_sen_k: int = setting(25, help="matchings of DP Theil-Sen (each point in at most k pairs: epsilon / k)",
                               allowed="an integer >= 1")
    suppression_k: list[int] = setting(help="thresholds of the suppression baselines", allowed="registered "
                                       "suppression_K thresholds (5, 10, 20)", factory=lambda: [5, 10, 20])
    rate_outcome: bool = setting(False, help="y is a 0/1 outcome: suppression also needs >= k events and >= k "
                                 "non-events", allowed="true | false")
    delta: float = setting(1e-6, help="delta of the (epsilon, delta) baselines (DP-GD, DP-SGD)",
                           allowed="a number in (0, 1)")
    dp_mos_split: Any = setting(help="DP-MOS: the share of release.epsilon each stage spends (n: noisy N; se: the "
                                "noisy Sxx, Syy and sum of x behind the SE; chi: its exponential mechanism; test: "
                                "the stability test; theta); the total is their sum times release.epsilon (3 "
                                "epsilon by default, as MOS)", allowed="a mapping with exactly n, se, chi, test, "
                                "theta, each a number > 0", factory=lambda: {"n": 0.25, "se": 0.5, "chi": 0.25,
                                                                           "test": 1.0, "theta": 1.0})
    dp_mos_chi_quantile: float = setting(0.75, help="DP-MOS: the share of eligible cells chi aims to cover (cells "
                                         "above it fail the stability test and are not released)",
                                         allowed="a number in (0, 1]")
    tail_epsilons: list[float] = setting(help="epsilons of the tail-classification figure (private evaluation)",
                                         allowed="numbers > 0", factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0, 8.0])


def validate_release(cfg: Any) -> None:
    """Value checks of a release run (task=release), before any row is read (and before the cell
    declaration file is opened): the run's seed and data source, the ``release.*`` settings
    (``release.method`` against the registry of release methods) and where the cells come from."""
    _integer("seed", cfg.seed, 0)
    seed_file = cfg.privacy.noise_seed_file
    if seed_file is not None and not (isinstance(seed_file, str) and seed_file.strip()):
        raise _bad("privacy.noise_seed_file", seed_file, "must be null or the path of a secret seed file")
    check_release_settings(cfg.release)
    resolved_domain(cfg.release, cfg.data.name)
    check_cell_source(cfg.release, cfg.data)
    r = cfg.release
    if r.cell_values is not None:
        check_cell_values(r.cell_values, list(r.cells))
    if r.cell_keys_file is not None and not (isinstance(r.cell_keys_file, str) and r.cell_keys_file.strip()):
        raise _bad("release.cell_keys_file", r.cell_keys_file, "must be the path of a CSV or Parquet file")
    if str(r.private_evaluation).strip().lower() not in ("auto", "true", "false"):
        raise _bad("release.private_evaluation", r.private_evaluation,
                   "must be auto (only for simulated data), true or false")
    _integer("release.theil_sen_k", r.theil_sen_k, 1, "must be an integer >= 1 (matchings of DP Theil-Sen)")


def check_release_settings(r: ReleaseConfig) -> None:
    """The ``release.*`` values that do not depend on the data source."""
    _finite_positive("release.epsilon", r.epsilon)
    if not (0 < r.delta < 1):
        raise _bad("release.delta", r.delta, "must be in (0, 1)")
    if not r.cells:
        raise _bad("release.cells", list(r.cells), "name at least one cell column")
    dom = r.domain
    for lo, hi, name in ((dom.x_lo, dom.x_hi, "x"), (dom.y_lo, dom.y_hi, "y")):
        if lo is None or hi is None:
            continue  # required for data=table: resolved_domain says so, with what the domain is for
        if not (_is_real(lo) and _is_real(hi) and math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise _bad(f"release.domain.{name}", f"[{lo}, {hi}]", "bounds must be finite with lo < hi")
    _one_of("release.statistic", r.statistic, STATISTIC_SETTINGS)
    if (r.statistic == "custom") != bool(r.stat_fn):
        raise _bad("release.stat_fn", r.stat_fn, "set it (module:function) exactly when release.statistic=custom")
    _one_of("release.neighbors", r.neighbors, ("add", "add_remove"))
    _one_of("release.noise", r.noise, ("laplace", "normal"))
    _one_of("release.cell_selection", r.cell_selection, ("declared", "private"))
    _one_of("release.theil_sen_variant", r.theil_sen_variant, ("auto", "all_pairs", "matchings"))
    check_method_settings_shape(r.method_settings)
    if r.min_n < 3:
        raise _bad("release.min_n", r.min_n, "must be >= 3 (OLS and its SE need at least 3 rows)")
    if any(k <= 0 for k in r.suppression_k):
        raise _bad("release.suppression_k", list(r.suppression_k), "thresholds must be integers > 0")
    for e in r.tail_epsilons:
        _finite_positive("release.tail_epsilons", e)
    check_dp_mos_settings(r)


def check_method_settings_shape(value: Any) -> None:
    """release.method_settings is a mapping with setting names as keys (null counts as {}); the
    keys and values are the method's to check (dptrain.release.methods.check_release_method)."""
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise _bad("release.method_settings", value, "a mapping {name: value} of the settings release.method "
                   "declares, e.g. release.method_settings={threshold: 10}, or null")


def check_dp_mos_settings(r: ReleaseConfig) -> None:
    """release.dp_mos_* (always: a sweep may switch methods), and release.neighbors with dp_mos."""
    split = r.dp_mos_split
    if not isinstance(split, Mapping):
        raise _bad("release.dp_mos_split", split, "a mapping with exactly n, se, chi, test, theta (shares > 0)")
    try:
        stage_epsilons(1.0, {str(k): v for k, v in dict(split).items()})
    except ReleaseError as err:
        raise ConfigError(str(err)) from None
    q = r.dp_mos_chi_quantile
    if not (_is_real(q) and 0 < q <= 1):
        raise _bad("release.dp_mos_chi_quantile", q, "must be a number in (0, 1], e.g. 0.9")
    if r.method == "dp_mos" and r.neighbors != "add_remove":
        raise _bad("release.neighbors", r.neighbors, "dp_mos is defined for add_remove neighbours only (the "
                   "standard relation of its guarantee); leave release.neighbors=add_remove")
    if r.method == "dp_mos" and r.noise != "laplace":
        raise _bad("release.noise", r.noise, "dp_mos draws discrete Laplace noise only (its pure-epsilon stages); "
                   "leave release.noise=laplace")


def check_cell_source(r: ReleaseConfig, d: Any) -> None:
    """Where the cells come from, before any row is read: a public declaration (release.cell_values
    or release.cell_keys_file; for data=atlas the simulator's own public design), or
    release.cell_selection=private (:func:`dptrain.release.cell_domain.check_listing`, whose
    message the Python API gives too). Cells taken from the rows present are refused."""
    check_listing(CellSource(has_values=r.cell_values is not None, keys_file=r.cell_keys_file,
                             selection=r.cell_selection, selection_epsilon=r.selection_epsilon,
                             selection_delta=r.selection_delta, simulated=d.name == "atlas"))


def check_cell_values(vals: Any, cells: list[str]) -> None:
    """release.cell_values: one non-empty list of strings or numbers per release.cells column."""
    if not isinstance(vals, Mapping) or set(map(str, vals)) != set(cells):
        got = sorted(map(str, vals)) if isinstance(vals, Mapping) else vals
        raise _bad("release.cell_values", got, f"give a list of values for exactly the release.cells columns {cells}")
    for col, values in vals.items():
        if not isinstance(values, (list, tuple)) or len(values) == 0:
            raise _bad(f"release.cell_values.{col}", values, "must be a non-empty list of values")
        for v in values:
            if v is None or not isinstance(v, (str, numbers.Number)):
                raise _bad(f"release.cell_values.{col}", list(values), "every value must be a string or a number")


def release_spec(r: ReleaseConfig) -> ReleaseSpec:
    """The checked ``release.*`` section as the value the release library reads
    (:class:`~dptrain.release.spec.ReleaseSpec`): lists become tuples, mappings read-only."""
    return ReleaseSpec(
        method=r.method, method_settings=MappingProxyType(dict(r.method_settings or {})), statistic=r.statistic,
        epsilon=float(r.epsilon), delta=float(r.delta), neighbors=r.neighbors, noise=r.noise, min_n=int(r.min_n),
        chi_by=tuple(r.chi_by), dp_mos_split=MappingProxyType({str(k): v for k, v in dict(r.dp_mos_split).items()}),
        dp_mos_chi_quantile=float(r.dp_mos_chi_quantile), suppression_k=tuple(r.suppression_k),
        rate_outcome=bool(r.rate_outcome), theil_sen_variant=r.theil_sen_variant, theil_sen_k=int(r.theil_sen_k),
        tail_epsilons=tuple(float(e) for e in r.tail_epsilons), y=r.y)


@dataclass
class ReleasePrivacyConfig:
    """The privacy settings a release run shares with training: opt-in reproducible noise, the
    bound on rows per unit of privacy."""

    noise_seed_file: str | None = setting(
        None, help="opt-in reproducible noise: a secret file from which every noise draw is derived; null: fresh "
        "from the OS CSPRNG for every run", allowed="the path of a secret file outside the run folder | null")
    max_rows_per_unit: int | None = max_rows_per_unit_setting()


@dataclass
class ReleaseRunConfig(RunBase):
    """task=release: small-cell regression releases (docs/release.md)."""

    task: str = setting("release", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="seeds the simulator (data=atlas); NEVER the release's noise", allowed="an integer "
                        ">= 0")
    data: Any = setting(None, help="the data source, a config group: data=table (your microdata) | atlas "
                        "(simulated cells)", allowed="table | atlas")
    privacy: ReleasePrivacyConfig = setting(help="opt-in reproducible noise", factory=ReleasePrivacyConfig)
    release: ReleaseConfig = setting(help="the release", factory=ReleaseConfig)


def check_release_data(d: Any) -> None:
    """The data source a release reads: data=table (a file) or data=atlas (the simulator)."""
    if d.name not in ("table", "atlas"):
        raise bad("data", d.name, "a release reads data=table (your microdata) or data=atlas (simulated)")
    check_source(d, ("table", "atlas"), "a release")
    if d.name == "atlas":
        integer("data.n_cells", d.n_cells, 2, "must be an integer >= 2")
        one_of("data.generator", d.generator, ("atlas", "figure2"))
        return
    path = d.path
    if not path:
        raise bad("data.path", path, "data=table needs the path of a CSV, Parquet or .dta file")
    if not isinstance(path, (str, os.PathLike)):
        raise bad("data.path", path, "must be the path of a CSV, Parquet or .dta file (or null)")
    one_of("data.format", d.format, ("auto", "csv", "parquet", "dta"))
    check_delimiter(d.delimiter)
    number_format(d)  # data.thousands / data.decimal: x and y written with separators
    one_of("data.nonfinite", d.nonfinite, ("error", "drop"))


def validate_release_run(cfg: Any) -> None:
    """Every setting of a ``task=release`` run, once, before any row is read. Raises ConfigError."""
    check_common(cfg)
    check_noise_seed_file(cfg.privacy.noise_seed_file)
    check_release_data(cfg.data)
    validate_release(cfg)
    check_release_unit(cfg)


def check_release_unit(cfg: Any) -> None:
    """``data.privacy_unit`` and ``privacy.max_rows_per_unit`` of a release (data=table only): k
    required with a unit, refused without; a private cell selection and a custom statistic are
    refused with a unit (their per-unit bounds are not derived here)."""
    unit = getattr(cfg.data, "privacy_unit", None)
    check_unit_bound(unit, cfg.privacy.max_rows_per_unit)
    if unit is None:
        return
    r = cfg.release
    if r.cell_selection == "private":
        raise bad("release.cell_selection", r.cell_selection, f"declared with data.privacy_unit={unit!r}: the "
                  "private selection's threshold bounds one row's cell, not the up to k cells of one unit; declare "
                  "the cells (release.cell_values or release.cell_keys_file)")
    if r.statistic == "custom":
        raise bad("release.statistic", r.statistic, f"p25 | p75 | slope with data.privacy_unit={unit!r} (a custom "
                  "statistic's MOS has no per-unit bound here)")


def release_unit(cfg: Any) -> UnitBound:
    """The checked release run's unit of privacy (``data.privacy_unit``, ``privacy.max_rows_per_unit``)."""
    return UnitBound.of(getattr(cfg.data, "privacy_unit", None), cfg.privacy.max_rows_per_unit)
