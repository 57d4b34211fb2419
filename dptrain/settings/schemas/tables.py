"""The schemas of the one-shot table releases (task=tabulate, synthesize, topdown, lodes); their
checks: :mod:`dptrain.settings.tabulate`, ``.synthesize``, ``.topdown``, ``.lodes``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import setting
from dptrain.settings.schemas.common import (
    TASKS_ALLOWED,
    ReleaseBudget,
    RunBase,
    TableReleaseBase,
    max_rows_per_unit_setting,
)


@dataclass
class TabulatePrivacyConfig:
    """The release's budget and mechanism."""

    mechanism: str = setting("gaussian", help="the noise: gaussian (discrete Gaussian, zCDP, reported as (epsilon, "
                             "delta) by the RDP accountant) | laplace (discrete Laplace, pure epsilon, delta 0); "
                             "both from OpenDP's exact samplers", allowed="gaussian | laplace")
    epsilon: float = setting(1.0, help="the whole release's epsilon (every marginal together)",
                             allowed="a number in (0, 100]")
    delta: float = setting(1e-6, help="the release's delta: gaussian, or tabulate.sparse (a one-row cell is listed "
                           "with probability <= delta / the number of marginals)", allowed="a number in (0, 1e-3]")
    max_rows_per_unit: int | None = max_rows_per_unit_setting()

@dataclass
class TabulateConfig:
    """What is tabulated and how it is post-processed."""

    marginals: Any = setting(2, help="the marginals released: k (every k-way marginal of the columns) or a list of "
                             "column lists, e.g. [[age, sex], [race]]", allowed="an integer >= 1 | a list of lists "
                             "of column names")
    columns: list[str] | None = setting(None, help="the columns tabulated; null: every declared column and the "
                                        "target", allowed="a list of declared column names | null")
    bins: int = setting(8, help="equal-width bins of each numeric column within its PUBLIC bounds (on its "
                        "transformed scale, e.g. log1p)", allowed="an integer in 2..200")
    split: str = setting("cells", help="how the budget is shared: cells (more to marginals with more cells, the "
                         "least total squared error) | equal", allowed="cells | equal")
    consistent: bool = setting(True, help="post-process into nonnegative integers that agree on the total and on "
                               "every 1-way margin (1- and 2-way marginals); false: the raw noisy counts",
                               allowed="true | false")
    sparse: bool = setting(False, help="a domain too large to list: the stability-based histogram releases only the "
                           "observed cells whose noisy count clears a threshold (a one-row cell with probability <= "
                           "privacy.delta); needs privacy.mechanism=laplace and tabulate.consistent=false",
                           allowed="true | false")


@dataclass
class TabulateRunConfig(TableReleaseBase):
    """task=tabulate: DP marginals of a table over its declared domain (docs/tables.md)."""

    task: str = setting("tabulate", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="seeds data=synthetic's generator; NEVER the noise (OpenDP's CSPRNG)",
                        allowed="an integer >= 0")
    privacy: TabulatePrivacyConfig = setting(help="the budget and the mechanism", factory=TabulatePrivacyConfig)
    tabulate: TabulateConfig = setting(help="the marginals", factory=TabulateConfig)


@dataclass
class SynthesizePrivacyConfig(ReleaseBudget):
    """The release's budget (selection, measurements and the noisy N together) and the bound on
    rows per unit of privacy."""

    max_rows_per_unit: int | None = max_rows_per_unit_setting()


@dataclass
class SynthesizeConfig:
    """The synthesizer and the domain it works on."""

    method: str = setting("mst", help="mst: a spanning tree of 2-way marginals (select, measure, generate) | mwem: "
                          "multiplicative weights over the workload of marginals", allowed="mst | mwem")
    bins: int = setting(8, help="equal-width bins of each numeric column within its PUBLIC bounds; synthetic values "
                        "are drawn uniformly within their bin", allowed="an integer in 2..200")
    rounds: int = setting(30, help="mwem: the number of select-measure-update rounds", allowed="an integer >= 1")
    workload: int = setting(3, help="mwem: the largest marginal order in its workload (2: every 2-way marginal; 3: "
                            "and every 3-way); the evaluation uses 2- and 3-way", allowed="2 | 3")


@dataclass
class SynthesizeRunConfig(TableReleaseBase):
    """task=synthesize: a synthetic file with the input's declared schema (docs/synthesis.md)."""

    task: str = setting("synthesize", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="seeds data=synthetic's generator; NEVER the noise, the selections or the sampling "
                        "(the operating system's CSPRNG)", allowed="an integer >= 0")
    privacy: SynthesizePrivacyConfig = setting(help="the budget", factory=SynthesizePrivacyConfig)
    synthesize: SynthesizeConfig = setting(help="the synthesizer", factory=SynthesizeConfig)


@dataclass
class TopDownConfig:
    """The simulated geography, the budget split over its levels and the invariants."""

    states: int = setting(4, help="states of the simulated nation", allowed="an integer >= 1")
    counties: int = setting(300, help="counties in all (right-skewed populations)", allowed="an integer >= states")
    population: int = setting(4_000_000, help="the nation's population", allowed="an integer >= 1000")
    shares: list[float] = setting(help="the share of rho of each level: nation, state, county, tract",
                                  allowed="four numbers >= 0, at least one > 0", factory=lambda: [0.1, 0.2, 0.3, 0.4])
    invariants: str = setting("states", help="totals released exactly by policy: none | nation | states (each "
                              "state's population, and so the nation's)", allowed="none | nation | states")
    max_persons_per_unit: int = setting(1, help="the unit of privacy: a group of at most this many persons (a "
                                        "household; the simulated geography has one row per person and no unit "
                                        "column, so nothing is capped): each level's L2 sensitivity is this number "
                                        "and every sigma this many times larger; 1: one person",
                                        allowed="an integer >= 1")

@dataclass
class TopDownPrivacyConfig(ReleaseBudget):
    """The release's budget (the invariants are outside it: exact by policy)."""

    epsilon: float = setting(5.0, help="the release's epsilon (the invariants are outside it: exact by policy)",
                             allowed="a number in (0, 100]")


@dataclass
class TopDownRunConfig(RunBase):
    """task=topdown: noisy counts at every level of a simulated geography, made consistent top down."""

    task: str = setting("topdown", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="seeds the geography simulator (PUBLIC); NEVER the noise", allowed="an integer >= 0")
    privacy: TopDownPrivacyConfig = setting(help="the budget", factory=TopDownPrivacyConfig)
    topdown: TopDownConfig = setting(help="the geography and the budget split", factory=TopDownConfig)


#: the ER-EE mechanisms dptrain registers (dptrain.release.oneshot.er_ee; their names, without
#: importing it and pandas; tests/test_light_check.py checks the list against the registry)
ER_EE_BUILTINS = ("log_laplace", "smooth_gamma", "smooth_laplace", "laplace_worker", "employer_laplace")


@dataclass
class LodesConfig:
    """The simulated jobs, the mechanisms' settings and which table is published."""

    establishments: int = setting(25_000, help="establishments of the simulated state (527000: the national scale)",
                                  allowed="an integer >= 100")
    alpha: float = setting(0.1, help="ER-EE: an establishment's size is protected up to a factor 1 + alpha",
                           allowed="a number in (0, 1]")
    employer_cap: int = setting(1000, help="employer_laplace: the PUBLIC size cap (sizes clipped to it)",
                                allowed="an integer >= 1")
    marginals: str = setting("finest", help="the tables released: finest (place x sector x ownership) | all (its 7 "
                             "marginals: each of the three, each pair, and the finest; the epsilon and delta are "
                             "shared evenly among them, sequential composition)", allowed="finest | all")
    median: bool = setting(False, help="also release each NAICS sector's median establishment size by the smooth-"
                           "sensitivity median (Nissim, Raskhodnikova and Smith; replace-one establishment, sizes in "
                           "the public [1, 30000]) at lodes.median_epsilon", allowed="true | false")
    median_epsilon: float = setting(1.0, help="the sector medians' epsilon (it adds to the tables')",
                                    allowed="a number in (0, 100]")
    publish: str = setting("log_laplace", help="the mechanism whose table is written at the top of the run folder; "
                           "the others go under private/ (publishing two tables composes their guarantees)",
                           allowed=" | ".join(ER_EE_BUILTINS) + " (or a plugin's)")


@dataclass
class LodesPrivacyConfig(ReleaseBudget):
    """The budget of each mechanism's table (delta: smooth_laplace's)."""

    epsilon: float = setting(4.0, help="each table's epsilon", allowed="a number in (0, 100]")


@dataclass
class LodesRunConfig(RunBase):
    """task=lodes: jobs by place x NAICS sector x ownership on the simulated jobs data."""

    task: str = setting("lodes", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="seeds the jobs simulator (PUBLIC); NEVER the noise", allowed="an integer >= 0")
    privacy: LodesPrivacyConfig = setting(help="the budget", factory=LodesPrivacyConfig)
    lodes: LodesConfig = setting(help="the data and the mechanisms", factory=LodesConfig)
