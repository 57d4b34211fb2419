"""The settings of a release run (``release.*``) and their checks, before any row is read.

See docs/release.md for what each setting means for privacy. ``validate_release`` takes the
run's whole config (it also checks the ``data`` choice that a release can read).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dptrain.validation import ConfigError
from dptrain.validation import bad as _bad
from dptrain.validation import finite_positive as _finite_positive
from dptrain.validation import integer as _integer
from dptrain.validation import is_real as _is_real
from dptrain.validation import one_of as _one_of


@dataclass
class DomainConfig:
    """The PUBLIC domain of (x, y); rows are clipped into it (release.clip) or refused."""

    x_lo: float = 0.0
    x_hi: float = 1.0
    y_lo: float = 0.0
    y_hi: float = 1.0


@dataclass
class ReleaseConfig:
    """Small-cell regression releases (docs/release.md). ``epsilon`` is PER STATISTIC (theta, SE, N
    each get it; a cell costs 3 epsilon; disjoint cells compose in parallel). The cells come from
    a public declaration (``cell_values`` / ``cell_keys_file``) or a private selection
    (``cell_selection=private``), never from the rows present."""

    x: str = "x"
    y: str = "y"
    cells: list[str] = field(default_factory=lambda: ["cell"])
    statistic: str = "p25"  # p25 | p75 | slope | custom (release.stat_fn, brute-force refits)
    stat_fn: str | None = None  # "package.module:function" f(x, y) -> float, for statistic=custom
    neighbors: str = "add_remove"  # add | add_remove
    noise: str = "laplace"  # laplace | normal
    method: str = "mos"  # what release.csv holds: a name registered in dptrain.release.methods.RELEASE_METHODS
    epsilon: float = 1.0
    min_n: int = 3  # cells with N < min_n are not released and do not enter chi (N is private!)
    chi_by: list[str] = field(default_factory=list)  # [] = one chi over all cells
    domain: DomainConfig = field(default_factory=DomainConfig)
    clip: bool = True
    # The cells (dptrain.release.cell_domain): a PUBLIC declaration, or a private selection.
    # cell_values: {column: [values]} per release.cells column, the cells are the cross product
    # (null = none declared; typed Any because Hydra cannot add keys to a typed dict in struct mode:
    # validate_release checks it); cell_keys_file: a CSV/Parquet listing the cells.
    cell_values: Any = None
    cell_keys_file: str | None = None
    cell_selection: str = "declared"  # declared | private (stability histogram, selection_epsilon/delta)
    selection_epsilon: float = 1.0  # epsilon of the private cell selection (composed into the totals)
    selection_delta: float = 1e-6  # delta of the private cell selection (composed into the totals)
    # comparisons and figures from EXACT private values -> <run>/private/evaluation/;
    # auto: only for simulated data (data=atlas); true | false
    private_evaluation: str = "auto"
    theil_sen_variant: str = "auto"  # auto | all_pairs | matchings (auto: matchings above the pair limit)
    theil_sen_k: int = 25  # matchings of DP Theil-Sen (each point in at most k pairs: epsilon / k)
    suppression_k: list[int] = field(default_factory=lambda: [5, 10, 20])
    rate_outcome: bool = False  # y is 0/1: suppression also needs N p >= k and N (1 - p) >= k
    delta: float = 1e-6  # for the (epsilon, delta) baselines (DP-GD, DP-SGD)
    tail_epsilons: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0, 8.0])


STATISTIC_SETTINGS = ("p25", "p75", "slope", "custom")


def validate_release(cfg: Any) -> None:
    """Value checks of a release run (task=release), before any row is read (and before the cell
    declaration file is opened): the run's seed and data source, the ``release.*`` settings
    (``release.method`` against the registry of release methods) and where the cells come from."""
    _integer("seed", cfg.seed, 0)
    seed_file = cfg.privacy.noise_seed_file
    if seed_file is not None and not (isinstance(seed_file, str) and seed_file.strip()):
        raise _bad("privacy.noise_seed_file", seed_file, "must be null or the path of a secret seed file")
    check_release_settings(cfg.release)
    check_release_data(cfg.data)
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
    from dptrain.release.methods import RELEASE_METHODS  # registers the built-in methods

    _finite_positive("release.epsilon", r.epsilon)
    if not (0 < r.delta < 1):
        raise _bad("release.delta", r.delta, "must be in (0, 1)")
    if not r.cells:
        raise _bad("release.cells", list(r.cells), "name at least one cell column")
    dom = r.domain
    for lo, hi, name in ((dom.x_lo, dom.x_hi, "x"), (dom.y_lo, dom.y_hi, "y")):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise _bad(f"release.domain.{name}", f"[{lo}, {hi}]", "bounds must be finite with lo < hi")
    _one_of("release.statistic", r.statistic, STATISTIC_SETTINGS)
    if (r.statistic == "custom") != bool(r.stat_fn):
        raise _bad("release.stat_fn", r.stat_fn, "set it (module:function) exactly when release.statistic=custom")
    _one_of("release.neighbors", r.neighbors, ("add", "add_remove"))
    _one_of("release.noise", r.noise, ("laplace", "normal"))
    RELEASE_METHODS.get(r.method)
    _one_of("release.cell_selection", r.cell_selection, ("declared", "private"))
    _one_of("release.theil_sen_variant", r.theil_sen_variant, ("auto", "all_pairs", "matchings"))
    if r.min_n < 3:
        raise _bad("release.min_n", r.min_n, "must be >= 3 (OLS and its SE need at least 3 rows)")
    if any(k <= 0 for k in r.suppression_k):
        raise _bad("release.suppression_k", list(r.suppression_k), "thresholds must be integers > 0")
    unregistered = [k for k in r.suppression_k if f"suppression_{k}" not in RELEASE_METHODS]
    if unregistered:
        known = [n.removeprefix("suppression_") for n in RELEASE_METHODS if n.startswith("suppression_")]
        raise _bad("release.suppression_k", list(r.suppression_k),
                   f"thresholds of registered methods suppression_K: {', '.join(known)} (a plugin can register "
                   "another: RELEASE_METHODS.register('suppression_K', Suppression(K)))")
    for e in r.tail_epsilons:
        _finite_positive("release.tail_epsilons", e)


def check_release_data(d: Any) -> None:
    """The data source a release reads: data=table (a file) or data=atlas (the simulator)."""
    if d.name not in ("table", "atlas"):
        raise _bad("data", d.name, "a release reads data=table (your microdata) or data=atlas (simulated)")
    if d.name == "table" and not d.path:
        raise _bad("data.path", d.path, "data=table needs the path of a CSV, Parquet or .dta file")
    if d.path is not None and not isinstance(d.path, (str, os.PathLike)):
        raise _bad("data.path", d.path, "must be the path of a CSV, Parquet or .dta file (or null)")
    if d.name == "atlas" and d.n_cells < 2:
        raise _bad("data.n_cells", d.n_cells, "must be >= 2")
    _one_of("data.generator", d.generator, ("atlas", "figure2"))
    _one_of("data.format", d.format, ("auto", "csv", "parquet", "dta"))
    _one_of("data.nonfinite", d.nonfinite, ("error", "drop"))


def check_cell_source(r: ReleaseConfig, d: Any) -> None:
    """Where the cells come from, before any row is read: a public declaration (release.cell_values
    or release.cell_keys_file; for data=atlas the simulator's own public design), or
    release.cell_selection=private. Cells taken from the rows present are refused: whether a cell
    is listed would tell whether anyone is in it."""
    has_values, has_file = r.cell_values is not None, r.cell_keys_file is not None
    if has_values and has_file:
        raise _bad("release.cell_keys_file", r.cell_keys_file,
                   "declare the cells once: release.cell_values OR release.cell_keys_file, not both")
    if r.cell_selection == "private":
        if has_values or has_file:
            raise _bad("release.cell_selection", "private", "select cells privately only when none are declared; "
                       "with release.cell_values / release.cell_keys_file set release.cell_selection=declared")
        _finite_positive("release.selection_epsilon", r.selection_epsilon)
        if not (_is_real(r.selection_delta) and 0 < r.selection_delta < 1):
            raise _bad("release.selection_delta", r.selection_delta, "must be in (0, 1), e.g. 1e-6")
    elif not (has_values or has_file or d.name == "atlas"):
        raise ConfigError(
            "release.cell_values=null and release.cell_keys_file=null: the release is refused (no row was read). "
            "The list of cells must not come from the rows present: a cell that appears only when someone is in "
            "it would reveal them. Allowed: declare the public cells, release.cell_values={COLUMN: [v1, v2, ...]} "
            "for each release.cells column (the cells are the cross product), or release.cell_keys_file=PATH "
            "(a CSV/Parquet with one column per release.cells column, one row per cell); or set "
            "release.cell_selection=private (cells selected with (release.selection_epsilon, "
            "release.selection_delta)-DP, composed into the release's totals)")


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
