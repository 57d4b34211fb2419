"""The settings of a release run (``release.*``) and their checks, before any row is read.

See docs/release.md for what each setting means for privacy. ``validate_release`` takes the
run's whole config (it also checks the ``data`` choice that a release can read).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from dptrain.core.errors import ReleaseError
from dptrain.core.validation import (
    ConfigError,
    bad,
    integer,
    one_of,
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
    check_common,
    check_noise_seed_file,
    check_unit_bound,
)
from dptrain.settings.data import check_delimiter, check_source
from dptrain.settings.schemas.release import (  # the schemas: no torch, no pandas
    STATISTIC_SETTINGS,
    ReleaseConfig,
    ReleaseRunConfig,  # noqa: F401
)

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
    _finite_positive("release.epsilon_per_statistic", r.epsilon_per_statistic)
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
        epsilon_per_statistic=float(r.epsilon_per_statistic), delta=float(r.delta), neighbors=r.neighbors,
        noise=r.noise, min_n=int(r.min_n),
        chi_by=tuple(r.chi_by), dp_mos_split=MappingProxyType({str(k): v for k, v in dict(r.dp_mos_split).items()}),
        dp_mos_chi_quantile=float(r.dp_mos_chi_quantile), suppression_k=tuple(r.suppression_k),
        rate_outcome=bool(r.rate_outcome), theil_sen_variant=r.theil_sen_variant, theil_sen_k=int(r.theil_sen_k),
        tail_epsilons=tuple(float(e) for e in r.tail_epsilons), y=r.y)


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
