"""``task=synthesize``: synthetic microdata from DP marginals (docs/synthesis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import bad, integer, one_of, setting
from dptrain.release.oneshot import mechanism_for
from dptrain.release.oneshot.synthesis import SynthesisSettings
from dptrain.release.units import UnitBound
from dptrain.settings.common import (
    TASKS_ALLOWED,
    ReleaseBudget,
    TableReleaseBase,
    check_budget,
    check_common,
    check_table_source,
    check_unit_bound,
    max_rows_per_unit_setting,
)


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


def validate_synthesize(cfg: Any) -> None:
    """Every setting of a ``task=synthesize`` run, before any row is read. Raises ConfigError."""
    check_common(cfg)
    check_table_source(cfg.data, "a synthetic release")
    p, s = cfg.privacy, cfg.synthesize
    check_budget(p)
    check_unit_bound(getattr(cfg.data, "privacy_unit", None), p.max_rows_per_unit)
    mechanism_for("synthesize.method", s.method, "synthesis")
    if integer("synthesize.bins", s.bins, 2, "an integer in 2..200") > 200:
        raise bad("synthesize.bins", s.bins, "an integer in 2..200")
    integer("synthesize.rounds", s.rounds, 1)
    one_of("synthesize.workload", s.workload, (2, 3))


def unit_bound(cfg: Any) -> UnitBound:
    """The checked run's unit of privacy (``data.privacy_unit``, ``privacy.max_rows_per_unit``)."""
    return UnitBound.of(getattr(cfg.data, "privacy_unit", None), cfg.privacy.max_rows_per_unit)


def synthesis_settings(s: SynthesizeConfig) -> SynthesisSettings:
    """The checked ``synthesize.*`` section as what the synthesizers read."""
    return SynthesisSettings(rounds=s.rounds, workload=s.workload)
