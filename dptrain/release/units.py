"""Units of privacy in the one-shot releases and the small-cell releases: what one unit (a person,
a household, an establishment: every row with one value of ``data.privacy_unit``) can change, once
each unit's rows are capped at ``k`` (``privacy.max_rows_per_unit``; the rows kept a uniform
random choice drawn from the run's SECRET randomness: :func:`dptrain.data.units.cap_rows_per_unit`).

* **A count table** (task=tabulate, TopDown's levels, a synthesizer's marginals). One unit adds at
  most ``k`` rows, each row one count in one cell: the count vector moves by at most ``k`` in L1 and
  by at most ``k`` in L2 (all ``k`` rows in one cell is the worst case; ``sqrt(k)`` would need the
  unit's rows forced into distinct cells, which nothing here does). :func:`table_sensitivity`.
* **A zCDP release built from sensitivity-1 pieces** (MST, MWEM: Gaussian measurements and
  exponential-mechanism selections of sensitivity 1 per row). Every piece's sensitivity becomes
  ``k``, which is the same as running the whole release at rho / k^2 per row: a rho-zCDP release
  for one row is (k^2 rho)-zCDP for a group of k rows (Bun and Steinke 2016, zCDP's group privacy,
  Proposition 27), and for Gaussian measurements and exponential selections that bound is exact
  (sigma times k, the selection's epsilon over k). :func:`zcdp_row_rho`.
* **Per-cell releases** (task=release: statistics per cell). The whole release is
  (epsilon, delta)-DP for one row (its ``total``: a row changes its own cell's statistics); a unit
  of at most k rows is a group of k rows, so the release is (k epsilon, k e^((k - 1) epsilon)
  delta)-DP for it (group privacy, Dwork and Roth 2014, Theorem 2.2 and its (epsilon, delta)
  form), wherever its rows fall: in one cell, or in up to m = k cells. A bound m < k on the cells
  per unit, or cells that partition the units (m = 1), does not lower it (all k rows in one cell is
  the worst case). The methods run at release.epsilon_per_statistic / k and release.delta / k per row
  (:func:`per_row_spec`), so the epsilon per statistic and unit is release.epsilon_per_statistic;
  :func:`group_privacy` gives the unit's guarantee from what the release spent.

How many rows a unit has, how many units there are and how many rows the cap dropped are private:
:func:`capped` returns the kept rows and the dropped count for ``private/`` files only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dptrain.core.errors import DPTrainError
from dptrain.data.units import cap_rows_per_unit
from dptrain.release.mos import NOT_DP

__all__ = ["UnitBound", "capped", "dataset_units", "group_privacy", "row_budget", "table_sensitivity", "zcdp_row_rho"]

#: the rule every report cites for a per-cell release of a unit of at most k rows
GROUP_RULE = ("group privacy over the whole release ((epsilon, delta)-DP for one row -> (k epsilon, "
              "k e^((k-1) epsilon) delta) for a group of k rows: Dwork and Roth 2014, Theorem 2.2 and its "
              "(epsilon, delta) form): a unit of at most k rows is such a group, in one cell or spread over up to "
              "k cells")
#: the rule for a zCDP release of sensitivity-1 pieces
ZCDP_GROUP_RULE = ("every measurement's and selection's sensitivity is k (at most k rows per unit): the release "
                   "runs at rho / k^2 per row, and a rho-zCDP release for one row is (k^2 rho)-zCDP for k rows "
                   "(zCDP's group privacy, Bun and Steinke 2016, Proposition 27)")


@dataclass(frozen=True)
class UnitBound:
    """The unit of privacy of a release: ``column`` (``data.privacy_unit``; None: one row is the
    unit) and ``k`` (``privacy.max_rows_per_unit``: at most k rows of one unit counted; 1 without
    a unit column)."""

    column: str | None = None
    k: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ValueError(f"UnitBound.k={self.k!r}: must be an integer >= 1")
        if self.column is None and self.k != 1:
            raise ValueError("UnitBound: k > 1 needs a unit column (data.privacy_unit)")

    @classmethod
    def of(cls, column: str | None, k: int | None) -> UnitBound:
        """The bound from the checked settings (``data.privacy_unit``, ``privacy.max_rows_per_unit``)."""
        return cls() if column is None else cls(column, int(k if k is not None else 1))

    @property
    def per_row(self) -> bool:
        return self.column is None

    def neighbours(self, row_words: str) -> str:
        """The neighbour relation in words: ``row_words`` (the per-row relation) without a unit; with
        one, all rows of one unit, at most k counted."""
        if self.per_row:
            return row_words
        return (f"add/remove one {self.column} (all rows of one {self.column}, at most {self.k} counted: "
                "data.privacy_unit, privacy.max_rows_per_unit)")

    def describe(self, **sensitivities: Any) -> dict[str, Any]:
        """The report's ``unit_of_privacy``: the column, k and the sensitivities the release used."""
        if self.per_row:
            return {"column": None, "unit": "one row", "max_rows_per_unit": 1, **sensitivities,
                    "note": "example-level: a person with k rows is protected only by group privacy at k rows "
                            "(declare data.privacy_unit and privacy.max_rows_per_unit for a guarantee per person)"}
        return {"column": self.column, "unit": f"all rows of one {self.column}", "max_rows_per_unit": self.k,
                **sensitivities, "cap": f"at most {self.k} rows per {self.column} counted, a uniform random choice "
                "drawn from the run's secret randomness (how many rows were dropped: private)"}


def table_sensitivity(bound: UnitBound) -> dict[str, float]:
    """The L1 and L2 sensitivity of one count table (module docstring): k and k."""
    return {"l1_sensitivity": float(bound.k), "l2_sensitivity": float(bound.k)}


def zcdp_row_rho(rho: float, bound: UnitBound) -> float:
    """The per-row rho that makes a release of sensitivity-1 pieces rho-zCDP per unit: rho / k^2."""
    return float(rho) / float(bound.k) ** 2


def group_privacy(epsilon: float, delta: float, j: int) -> tuple[float, float]:
    """(epsilon, delta)-DP for one row -> for a group of ``j`` rows: (j epsilon,
    j e^((j-1) epsilon) delta) (Dwork and Roth 2014, Theorem 2.2 and its (epsilon, delta) form)."""
    if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or j < 1:
        raise ValueError(f"j={j!r}: must be an integer >= 1")
    return float(j * epsilon), float(j * math.exp((j - 1) * epsilon) * delta)


def row_budget(epsilon: float, delta: float, bound: UnitBound) -> tuple[float, float]:
    """The per-row (epsilon, delta) whose :func:`group_privacy` at k is (``epsilon``, ``delta``) per
    unit: (epsilon / k, delta / (k e^((k-1) epsilon / k)))."""
    k = bound.k
    eps_row = float(epsilon) / k
    return eps_row, float(delta) / (k * math.exp((k - 1) * eps_row))


def capped(codes: np.ndarray, bound: UnitBound, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(indices of the rows kept, how many were dropped) when each unit (``codes``: one unit code
    >= 0 per row, :func:`dptrain.data.units.unit_codes`) keeps at most k rows, a uniform choice
    drawn from ``rng`` (the run's SECRET randomness). The dropped count is PRIVATE: ``private/``
    files only."""
    codes = np.asarray(codes, dtype=np.int64)
    keep = cap_rows_per_unit(codes, bound.k, rng)
    return keep, int(codes.size - keep.size)


def dataset_units(data: Any) -> np.ndarray:
    """The unit codes of a loaded data set's rows, training rows then test rows (the order of
    ``x_train``, ``x_test``), from the loader's per-row codes (``unit_train``, ``unit_test``: each
    side's units numbered from 0). The split is by unit (all of a unit's rows on one side), so the
    test side's codes are shifted past the training side's: no unit is on both sides."""
    train, test = getattr(data, "unit_train", None), getattr(data, "unit_test", None)
    if train is None or test is None:
        raise DPTrainError("data.privacy_unit: the data loader gave no unit codes for every row (Dataset.unit_train "
                           "and Dataset.unit_test); this release needs them to cap each unit's rows")
    train = np.asarray(train, dtype=np.int64)
    test = np.asarray(test, dtype=np.int64)
    return np.concatenate([train, test + (int(train.max()) + 1 if train.size else 0)])


#: the private file of a release's unit cap (under private/)
UNITS_FILE = "units.json"


def write_unit_facts(folder: Any, bound: UnitBound, dropped: int) -> None:
    """private/units.json: how many rows the cap dropped (a PRIVATE count: it depends on how many
    rows the units have; never in a publishable file, the console or an error). Nothing without a
    unit column."""
    if bound.per_row:
        return
    folder.write_json(UNITS_FILE, {"column": bound.column, "max_rows_per_unit": bound.k, "rows_dropped": dropped,
                                   "note": "PRIVATE: the rows beyond privacy.max_rows_per_unit per unit, left out by "
                                           "a secret uniform choice; never publish"},
                      f"how many rows the cap of {bound.k} rows per {bound.column} dropped (PRIVATE)", private=True)


def per_row_spec(spec: Any, bound: UnitBound) -> Any:
    """A small-cell release's settings (:class:`dptrain.release.spec.ReleaseSpec`) at the per-row
    budget of a unit of at most k rows: ``epsilon`` / k and ``delta`` / k (the per-unit guarantee
    is then :func:`group_privacy` of what each cell spends: :func:`unit_release_facts`)."""
    if bound.per_row:
        return spec
    return replace(spec, epsilon_per_statistic=float(spec.epsilon_per_statistic) / bound.k,
                   delta=float(spec.delta) / bound.k)


def unit_release_facts(facts: dict[str, Any], bound: UnitBound, *, epsilon: float, delta: float) -> dict[str, Any]:
    """release.json's facts of a small-cell release with a unit of privacy: ``unit_of_privacy``
    (the column, k, at most k cells per unit, the rule, the per-row budget the methods ran at and
    the per-unit guarantee: :func:`group_privacy` at k of one cell's total) and a guarantee sentence
    that names the unit first. ``epsilon`` and ``delta``: the run's release.epsilon_per_statistic
    and release.delta, per unit. Without a unit, ``unit_of_privacy`` says that the guarantee is per
    row (a person with k rows: group privacy at k only)."""
    if bound.per_row:  # example-level: say what it means for a person with several rows
        return {**facts, "unit_of_privacy": bound.describe()}
    total = facts.get("total") or {}
    row_eps, row_delta = total.get("epsilon"), total.get("delta")
    out = dict(facts)
    unit = bound.describe(max_cells_per_unit=bound.k, rule=GROUP_RULE, release_epsilon_per_unit=float(epsilon),
                          release_delta_per_unit=float(delta), epsilon_per_row=float(epsilon) / bound.k,
                          delta_per_row=float(delta) / bound.k)
    unit["max_cells_per_unit_note"] = (f"a {bound.column} with at most {bound.k} rows touches at most {bound.k} "
                                       "cells; fewer cells would not lower the bound (all rows in one cell is the "
                                       "worst case), nor would cells that partition the units")
    if row_eps is None:  # exact values (suppression): no guarantee per row, none per unit
        unit.update(epsilon=None, delta=None)
        out["unit_of_privacy"] = unit
        return out
    unit_eps, unit_delta = group_privacy(float(row_eps), float(row_delta or 0.0), bound.k)
    unit.update(epsilon=unit_eps, delta=unit_delta,
                per_row_total={"epsilon": float(row_eps), "delta": float(row_delta or 0.0),
                               "note": "one cell's whole release for one row (the method's fields above are per "
                                       "row: it ran at release.epsilon_per_statistic / k and release.delta / k)"})
    out["unit_of_privacy"] = unit
    how = ("each of its rows replaced" if facts.get("neighbours") == "replace_one" else "all its rows added or "
           "removed")
    head = (f"per {bound.column} (all rows of one {bound.column}, at most {bound.k} counted): "
            f"({unit_eps:.4g}, {unit_delta:.3g})-DP, {how}, by group privacy over its at most {bound.k} rows (the "
            "release's per-row total times k)")
    if facts.get("guarantee") == NOT_DP:  # MOS: say first that it is not DP, per row or per unit
        out["guarantee"] = f"{NOT_DP} Per {bound.column}, conditional on chi only: {head.split(': ', 1)[1]}"
    else:
        out["guarantee"] = f"{head}; per row: {facts.get('guarantee')}"
    return out


def unit_first_line(line: str, total: dict[str, Any], bound: UnitBound) -> str:
    """The release's first console line (:func:`dptrain.release.total.first_line`, of the per-row
    budget the methods run at) with a unit of privacy: the TOTAL per unit first (group privacy at
    k of the per-row total, as release.json's ``unit_of_privacy`` states it), then the per-row line."""
    if bound.per_row or total.get("epsilon") is None:
        return line
    eps, delta = group_privacy(float(total["epsilon"]), float(total.get("delta") or 0.0), bound.k)
    return (f"release: per {bound.column} (all rows of one {bound.column}, at most {bound.k} counted): epsilon "
            f"{eps:g}, delta {delta:g} in all by group privacy over its rows; per row (the methods run at "
            f"release.epsilon_per_statistic / {bound.k}): {line.removeprefix('release: ')}")
