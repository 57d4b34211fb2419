"""``task=topdown``: Census-style TopDown on the simulated geography (docs/tables.md)."""

from __future__ import annotations

from dataclasses import dataclass

from dptrain.core.validation import bad, integer, one_of, setting
from dptrain.release.oneshot.topdown import GeographySettings
from dptrain.release.tables.topdown import INVARIANTS
from dptrain.settings.common import (
    TASKS_ALLOWED,
    ReleaseBudget,
    RunBase,
    check_budget,
    check_common,
)


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


def validate_topdown(cfg: TopDownRunConfig) -> None:
    """Every setting of a ``task=topdown`` run. Raises ConfigError."""
    check_common(cfg)
    t, p = cfg.topdown, cfg.privacy
    integer("topdown.states", t.states, 1)
    if integer("topdown.counties", t.counties, 1) < t.states:
        raise bad("topdown.counties", t.counties, f"at least topdown.states={t.states}")
    integer("topdown.population", t.population, 1000)
    shares = list(t.shares)
    if len(shares) != 4 or any(not isinstance(s, (int, float)) or s < 0 for s in shares) or sum(shares) <= 0:
        raise bad("topdown.shares", shares, "four numbers >= 0 (nation, state, county, tract), at least one > 0")
    one_of("topdown.invariants", t.invariants, INVARIANTS)
    check_budget(p)
    integer("topdown.max_persons_per_unit", t.max_persons_per_unit, 1, "an integer >= 1 (persons per unit of privacy)")


def geography_settings(t: TopDownConfig) -> GeographySettings:
    """The checked ``topdown.*`` section as what the geography mechanisms read."""
    return GeographySettings(shares=tuple(float(s) for s in t.shares), invariants=t.invariants,
                             max_persons_per_unit=int(t.max_persons_per_unit))
