"""``task=synthesize``: synthetic microdata from DP marginals (docs/synthesis.md)."""

from __future__ import annotations

from typing import Any

from dptrain.core.validation import bad, integer, one_of
from dptrain.release.oneshot import mechanism_for
from dptrain.release.oneshot.synthesis import SynthesisSettings
from dptrain.release.units import UnitBound
from dptrain.settings.common import (
    check_budget,
    check_common,
    check_table_source,
    check_unit_bound,
)
from dptrain.settings.schemas.tables import (  # the schemas: no torch, no pandas
    SynthesizeConfig,
    SynthesizeRunConfig,  # noqa: F401
)


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
