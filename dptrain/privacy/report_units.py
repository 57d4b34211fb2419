"""What a training run's privacy report says about its unit of privacy (dptrain.privacy.report):
per unit with ``data.privacy_unit`` (person-level DP-SGD: the guarantee, neighbours, clipping and
noise name the unit column and k), or per row with the group-privacy levels of a person with k
rows (:mod:`dptrain.privacy.group`)."""

from __future__ import annotations

import math
from typing import Any

from dptrain.privacy.group import group_section

__all__ = ["group_lines", "group_of_example_level", "n_unit", "unit_fields", "unit_guarantee", "unit_not_covered",
           "who"]


def unit_guarantee(unit: dict[str, Any], eps: float, delta: float) -> str:
    """The guarantee sentence of a person-level run."""
    col, k = unit["column"], unit["max_rows_per_unit"]
    return (f"({eps:.4g}, {delta:.3g})-DP per {col} (all rows of one {col}, at most {k} counted), "
            f"add/remove-one-{col} neighbours, for the final model and every intermediate iterate")


def unit_not_covered(item: str, unit: dict[str, Any]) -> str:
    """A 'not covered' item of a per-row report as a person-level report states it: N counts
    units (a row without a unit id is left out and counted, like any row outside the declared
    domain: no refusal of its own)."""
    if item.startswith("the training-set size N"):
        return UNIT_NOT_COVERED.format(col=unit["column"], k=unit["max_rows_per_unit"])
    return item


def unit_fields(mechanism: dict[str, Any]) -> dict[str, Any]:
    """The report's unit of privacy, neighbours, clipping and noise: per unit with
    data.privacy_unit (person-level DP-SGD), else per row."""
    unit = mechanism.get("unit_of_privacy")
    if not unit:
        return {"unit_of_privacy": "one example (one row of the training table)", "neighbours": "add/remove",
                "clipping": "flat per-example L2 clipping over all parameters",
                "noise": "Gaussian N(0, sigma^2 C^2) added once per step to the clipped sum, divided by the "
                "expected batch size"}
    col, k, how = unit["column"], unit["max_rows_per_unit"], unit["combine"]
    return {"unit_of_privacy": f"one {col}: all rows of one {col}, at most {k} counted (a secret uniform choice "
            f"among its rows, drawn once before training)", "unit_column": col, "max_rows_per_unit": k,
            "unit_combine": how, "neighbours": f"add/remove all rows of one {col}",
            "clipping": f"each sampled {col}'s per-row gradients combined ({how}), the combination clipped to C "
            "(flat L2 over all parameters)",
            "noise": f"Gaussian N(0, sigma^2 C^2) added once per step to the sum over {col}s, divided by the "
            f"expected number of {col}s per batch; N, B and q count {col}s"}


UNIT_NOT_COVERED = ("the number of rows of each {col}, the number of training rows and how many rows the cap of "
                    "{k} per {col} dropped: private (private/data_diagnostics.json); the number of {col}s N is "
                    "treated as public, as the accountant's q = B/N requires")


def group_of_example_level(mechanism: dict[str, Any], eps: float, private: bool, history: Any) -> dict[str, Any] | None:
    """An example-level private run's group-privacy levels (None per unit, or without noise)."""
    if mechanism.get("unit_of_privacy") or not private or not math.isfinite(eps):
        return None
    return group_section(eps, mechanism["delta"], history)


def n_unit(report: dict[str, Any]) -> str:
    """What N counts in privacy.txt: ' <column>s' per unit, '' per row."""
    return f" {report['unit_column']}s" if report.get("unit_column") else ""


def who(report: dict[str, Any]) -> str:
    """Whom the plain-words sentence protects: one row, or all rows of one unit."""
    col = report.get("unit_column")
    if col:
        return f"all rows of any one {col} (at most {report['max_rows_per_unit']} of its rows counted)"
    return "any one person's row"


def group_lines(report: dict[str, Any]) -> list[str]:
    """privacy.txt's group-privacy lines of an example-level report."""
    group = report.get("group_privacy")
    if not group:
        return []
    lines = ["", f"PER ROW, NOT PER PERSON: {group['statement']}:"]
    for lv in group["levels"]:
        lines.append(f"  k = {lv['k']:>2d} rows: ({lv['epsilon']:.4g}, {lv['delta']:.3g})-DP   [{lv['rule']}]")
    return lines


