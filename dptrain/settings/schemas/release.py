"""The schema of task=release (small-cell statistics); its checks: :mod:`dptrain.settings.release`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from dptrain.core.validation import setting
from dptrain.settings.schemas.common import TASKS_ALLOWED, RunBase, max_rows_per_unit_setting

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


@dataclass
class ReleaseConfig:
    """Small-cell regression releases (docs/release.md). ``epsilon_per_statistic`` is PER STATISTIC
    (theta, SE, N each get it; a cell costs 3 of it; disjoint cells compose in parallel). The cells come from
    a public declaration (``cell_values`` / ``cell_keys_file``) or a private selection
    (``cell_selection=private``), never from the rows present."""

    #: settings renamed: the old key is refused by name, pointing to the new one and saying why
    #: (:func:`dptrain.settings.command_line.check_known_keys`)
    RENAMED: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({
        "epsilon": ("epsilon_per_statistic", "it is the epsilon of EACH released statistic: theta, its SE and N "
                    "each get it, so a mos or dp_mos cell spends 3 of it by default; the console's first line "
                    "of a release gives the release's total")})

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
    epsilon_per_statistic: float = setting(1.0, help="the epsilon of EACH released statistic (theta, its SE and N "
                                           "each get it: a MOS or DP-MOS cell spends 3 of it by default; disjoint "
                                           "cells compose in parallel); the console's first line gives the "
                                           "release's total for release.method (formerly release.epsilon)",
                                           allowed="a number > 0")
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
    dp_mos_split: Any = setting(help="DP-MOS: the share of release.epsilon_per_statistic each stage spends (n: "
                                "noisy N; se: the noisy Sxx, Syy and sum of x behind the SE; chi: its exponential "
                                "mechanism; test: the stability test; theta); the total is their sum times "
                                "release.epsilon_per_statistic (3 of it by default, as MOS)",
                                allowed="a mapping with exactly n, se, chi, test, theta, each a number > 0",
                                factory=lambda: {"n": 0.25, "se": 0.5, "chi": 0.25, "test": 1.0, "theta": 1.0})
    dp_mos_chi_quantile: float = setting(0.75, help="DP-MOS: the share of eligible cells chi aims to cover (cells "
                                         "above it fail the stability test and are not released)",
                                         allowed="a number in (0, 1]")
    tail_epsilons: list[float] = setting(help="epsilons of the tail-classification figure (private evaluation)",
                                         allowed="numbers > 0", factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0, 8.0])


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
