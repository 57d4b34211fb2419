"""``task=tabulate``: DP counts of every cell of the requested marginals over a declared domain
(docs/tables.md)."""

from __future__ import annotations

from typing import Any

from dptrain.core.validation import bad, flag, integer, one_of
from dptrain.release.oneshot import mechanism_for
from dptrain.release.oneshot.tables import SPLITS, TableSettings
from dptrain.release.units import UnitBound
from dptrain.settings.common import (
    check_budget,
    check_common,
    check_table_source,
    check_unit_bound,
)
from dptrain.settings.schemas.tables import (  # the schemas: no torch, no pandas
    TabulateConfig,
    TabulateRunConfig,  # noqa: F401
)

#: the largest number of cells one run releases (the domain is declared: every cell gets noise)
MAX_CELLS = 5_000_000


def validate_tabulate(cfg: Any) -> None:
    """Every setting of a ``task=tabulate`` run, before any row is read. Raises ConfigError."""
    check_common(cfg)
    check_table_source(cfg.data, "a tabulation")
    p = cfg.privacy
    mechanism = mechanism_for("privacy.mechanism", p.mechanism, "tables")
    t = cfg.tabulate
    if integer("tabulate.bins", t.bins, 2, "an integer in 2..200") > 200:
        raise bad("tabulate.bins", t.bins, "an integer in 2..200")
    one_of("tabulate.split", t.split, SPLITS)
    flag("tabulate.consistent", t.consistent)
    flag("tabulate.sparse", t.sparse)
    if t.sparse and (p.mechanism != "laplace" or t.consistent):
        raise bad("tabulate.sparse", t.sparse, "the stability-based histogram needs privacy.mechanism=laplace and "
                  "tabulate.consistent=false (its listed cells are released as noisy counts)")
    check_budget(p, delta=t.sparse or mechanism.uses_delta)
    unit = getattr(cfg.data, "privacy_unit", None)
    check_unit_bound(unit, p.max_rows_per_unit)
    if unit is not None and t.sparse:
        raise bad("tabulate.sparse", t.sparse, f"false with data.privacy_unit={unit!r}: the stability-based "
                  "histogram's threshold bounds one row's cell, not the up to k cells of one unit")
    m = t.marginals
    if not (isinstance(m, int) and not isinstance(m, bool) and m >= 1) and not (
            isinstance(m, (list, tuple)) and m and all(isinstance(s, (list, tuple)) and s and all(
                isinstance(c, str) for c in s) for s in m)):
        raise bad("tabulate.marginals", m, "an integer >= 1 (every k-way marginal) or a list of column lists, e.g. "
                  "[[age, sex], [race]]")
    if t.columns is not None and (not isinstance(t.columns, (list, tuple)) or not t.columns
                                  or not all(isinstance(c, str) for c in t.columns)):
        raise bad("tabulate.columns", t.columns, "a non-empty list of declared column names, or null")


def unit_bound(cfg: Any) -> UnitBound:
    """The checked run's unit of privacy (``data.privacy_unit``, ``privacy.max_rows_per_unit``)."""
    return UnitBound.of(getattr(cfg.data, "privacy_unit", None), cfg.privacy.max_rows_per_unit)


def table_settings(t: TabulateConfig) -> TableSettings:
    """The checked ``tabulate.*`` section as what the table mechanisms read."""
    return TableSettings(split=t.split)
