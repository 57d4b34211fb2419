"""``task=tabulate``: DP counts of every cell of the requested marginals over a declared domain
(docs/tables.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import bad, flag, integer, one_of, setting
from dptrain.release.oneshot import mechanism_for
from dptrain.release.oneshot.tables import SPLITS, TableSettings
from dptrain.release.units import UnitBound
from dptrain.settings.common import (
    TASKS_ALLOWED,
    TableReleaseBase,
    check_budget,
    check_common,
    check_table_source,
    check_unit_bound,
    max_rows_per_unit_setting,
)

#: the largest number of cells one run releases (the domain is declared: every cell gets noise)
MAX_CELLS = 5_000_000


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
