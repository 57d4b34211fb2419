"""``task=topdown``: Census-style TopDown on the simulated geography (docs/tables.md)."""

from __future__ import annotations

from dptrain.core.validation import bad, integer, one_of
from dptrain.release.oneshot.topdown import GeographySettings
from dptrain.release.tables.topdown import INVARIANTS
from dptrain.settings.common import (
    check_budget,
    check_common,
)
from dptrain.settings.schemas.tables import (  # the schemas: no torch, no pandas
    TopDownConfig,
    TopDownRunConfig,
)


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
