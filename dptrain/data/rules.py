"""The declared rules for rows outside a table's declared domain, and their PRIVATE counts.

Inside a run nothing is refused for what one row holds (docs/data.md): a refusal is an output, and
a table with one row more or less must run (or be refused) alike. Each row outside the declared
domain is handled by a stated rule, on its own, and counted:

* a binary target's label that is neither ``data.positive`` nor ``data.negative`` (a missing one
  included), a multiclass label outside ``data.classes``, a 0/1 target's entry that is not 0 or 1:
  the row is left out (``data.label_map`` may first map a file's label to a declared one);
* a numeric column's missing, NaN, infinite or non-numeric entry: ``data.nonfinite=drop`` leaves
  the row out (``error`` refuses the table: a refusal that depends on the rows, the user's choice);
* a categorical value outside the declared list: ``data.unlisted=other`` lumps it into the
  column's ``<other>`` slot, ``drop`` leaves the row out;
* a split column's entry that is neither train nor test: the row is left out.

The counts (:class:`RowCounts`: rows read, left out per rule, lumped, mapped, the kinds of
non-numeric text) go to private/data_diagnostics.json and to ONE console line for the data holder
(:func:`counts_line`), never to a publishable file. The console line quotes counts, never a value
of the file; the kinds of non-numeric text are named by their shape ("digits grouped by ','").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["CHECK_HINT", "NUMBER_SHAPES", "RowCounts", "add_counts", "counts_line", "number_shapes",
           "parse_numbers", "shape_setting"]

#: the shapes of non-numeric text in a numeric column, in the order they are tried: (name, regular
#: expression, the setting that reads it). A shape names a pattern, never a value of the file.
NUMBER_SHAPES: tuple[tuple[str, str, str], ...] = (
    ("digits grouped by ',' (like 12,345)", r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", "data.thousands=','"),
    ("digits grouped by '.' with a decimal comma (like 12.345,6)", r"[+-]?\d{1,3}(\.\d{3})+(,\d+)?",
     "data.thousands='.' data.decimal=','"),
    ("a decimal comma (like 3,5)", r"[+-]?\d*,\d+", "data.decimal=','"),
    ("digits grouped by spaces (like 12 345)", r"[+-]?\d{1,3}([ \u00a0\u202f]\d{3})+([.,]\d+)?",
     "data.thousands=' '"),
    ("digits grouped by apostrophes (like 12'345)", r"[+-]?\d{1,3}('\d{3})+(\.\d+)?", "data.thousands=\"'\""),
    ("a currency sign or a percent sign", r".*\d.*", "none: remove the sign in the file"),
)
OTHER_TEXT = ("other text (words, codes, dates)", "none: declare the column under data.categorical if it holds "
              "labels, or clean the file")

#: the pointer to the data holder's check, logged when a rule left out or lumped any row
CHECK_HINT = ("every problem of this table, with counts and the setting that handles each: dptrain check with the "
              "same settings (docs/data.md); nothing of it is published")

_SPACES = " \u00a0\u202f"
_NON_FINITE = ("nan", "inf", "infinity")


def _number_regex(thousands: str | None, decimal: str) -> re.Pattern:
    """A number as text with the declared separators: digits (grouped by threes with
    ``thousands``), an optional fraction after ``decimal``, an optional exponent."""
    t = "[" + re.escape(_SPACES) + "]" if thousands == " " else (re.escape(thousands) if thousands else None)
    whole = r"\d+" if t is None else rf"(?:\d{{1,3}}(?:{t}\d{{3}})+|\d+)"
    d = re.escape(decimal)
    return re.compile(rf"[+-]?(?:{whole}(?:{d}\d*)?|{d}\d+)(?:[eE][+-]?\d+)?")


def _normalised(text: str, thousands: str | None, decimal: str) -> str:
    """``text`` (matched by :func:`_number_regex`) in Python's notation."""
    if thousands == " ":
        for space in _SPACES:
            text = text.replace(space, "")
    elif thousands:
        text = text.replace(thousands, "")
    return text.replace(decimal, ".") if decimal != "." else text


def parse_numbers(col: pd.Series, *, thousands: str | None = None,
                  decimal: str = ".") -> tuple[np.ndarray, np.ndarray | None]:
    """(float64 values with NaN for every entry that is not a finite-or-infinite number, a mask of
    the entries that are text but no number, or None when there is none) of a column of text or
    mixed cells. Only the distinct values are parsed. 'nan', 'inf' and the like are numbers (NaN,
    infinite), a missing cell is NaN and not text."""
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    pattern = _number_regex(thousands, decimal)
    parsed = np.full(len(uniques) + 1, np.nan)  # the last entry: code -1, a missing cell
    text = np.zeros(len(uniques) + 1, dtype=bool)
    for j, u in enumerate(uniques):
        if isinstance(u, (bool, np.bool_, int, float, np.integer, np.floating)):
            parsed[j] = float(u)
            continue
        s = str(u).strip()
        if s == "":
            continue  # an empty text cell is a missing value
        if pattern.fullmatch(s):
            parsed[j] = float(_normalised(s, thousands, decimal))
        elif s.lower().lstrip("+-") in _NON_FINITE:
            parsed[j] = float(s.lower().replace("infinity", "inf"))
        else:
            text[j] = True
    values, not_number = parsed[codes], text[codes]
    return values, (not_number if bool(not_number.any()) else None)


def number_shapes(col: pd.Series, rows: np.ndarray) -> dict[str, int]:
    """{shape name: entries} of the non-numeric text in ``col`` at the boolean mask ``rows``
    (:data:`NUMBER_SHAPES`; anything else is 'other text')."""
    out: dict[str, int] = {}
    texts = pd.Series(col[rows]).astype(str).str.strip().value_counts()
    for value, n in texts.items():
        text = str(value)
        name = next((s[0] for s in NUMBER_SHAPES if re.fullmatch(s[1], text) and (
            "sign" not in s[0] or re.search("[$€£¥%]", text))), OTHER_TEXT[0])
        out[name] = out.get(name, 0) + int(n)
    return out


def shape_setting(name: str) -> str:
    """The setting that reads the non-numeric text of shape ``name``."""
    return next((s[2] for s in NUMBER_SHAPES if s[0] == name), OTHER_TEXT[1])


def add_counts(a: Any, b: Any) -> Any:
    """The sum of two counts (integers, or mappings of counts with the same or other keys): the
    counts of the union of disjoint parts of a table (a sharded read's processes)."""
    if isinstance(a, Mapping):
        return {k: add_counts(a.get(k, 0 if not isinstance(b.get(k), Mapping) else {}),
                              b.get(k, 0 if not isinstance(a.get(k), Mapping) else {})) for k in {**a, **b}}
    return int(a) + int(b)


class RowCounts:
    """The rows a read keeps and the PRIVATE counts of every rule (module docstring): ``leave_out``
    marks rows a rule leaves out (and counts them over every row read), ``mapped`` counts the rows
    data.label_map relabelled (over every row read), ``lumped`` the kept rows whose categorical
    value went to <other> (set by the encoding); :meth:`as_dict` gives the private diagnostics'
    ``rows`` section."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.out = np.zeros(n, dtype=bool)
        self.left: dict[str, dict[str, Any]] = {}
        self.lumped: dict[str, dict[str, int]] = {}  # counted over the kept rows by the encoding
        self.mapped: dict[str, int] = {}
        self.shapes: dict[str, dict[str, int]] = {}

    def leave_out(self, group: str, key: str, what: str, rows: np.ndarray) -> None:
        """Rows (a boolean mask) that the rule ``group`` (target, numeric, categorical,
        split_column) leaves out for ``what`` in column ``key``."""
        entry = self.left.setdefault(group, {}).setdefault(key, {})
        entry[what] = entry.get(what, 0) + int(np.count_nonzero(rows))
        self.out |= rows

    def count_mapped(self, column: str, mapped: np.ndarray, codes: np.ndarray, *, declared: bool) -> None:
        """The rows whose label in ``column`` data.label_map changed (``mapped``: per distinct
        value, indexed by ``codes``); recorded for every column with a declared map."""
        if declared:
            self.mapped[column] = int(np.count_nonzero(mapped[codes])) if mapped.any() else 0

    def kept(self) -> np.ndarray:
        """Indices of the rows no rule left out (sorted)."""
        return np.flatnonzero(~self.out) if self.out.any() else np.arange(self.n)

    def as_dict(self, *, train: int, test: int) -> dict[str, Any]:
        left = int(np.count_nonzero(self.out))
        return {"read": self.n, "kept": self.n - left, "left_out": left,
                "train": int(train), "test": int(test), "left_out_by": self.left, "lumped": self.lumped,
                "mapped": dict(self.mapped), "not_a_number": self.shapes}


_GROUP_SETTING = {"target": "the declared target labels", "numeric": "data.nonfinite=drop",
                  "categorical": "data.unlisted=drop", "split_column": "data.split_column: train / test",
                  "privacy_unit": "data.privacy_unit (a row without a unit id)"}


def _parts(counts: Mapping[str, Mapping[str, int]]) -> list[str]:
    out = []
    for key, whats in counts.items():
        shown = ", ".join(f"{n} {w.replace('_', ' ')}" for w, n in whats.items() if n)
        if shown:
            out.append(f"{key} {shown}")
    return out


def counts_line(rows: Mapping[str, Any], clipped: Mapping[str, Mapping[str, int]] | None = None) -> str:
    """The ONE console line of a read's counts for the data holder (PRIVATE: it never goes to a
    publishable file; the run's log, private/dptrain.log, keeps it)."""
    parts = [f"{rows['read']} rows read, {rows['kept']} used, {rows['left_out']} left out"]
    for group, setting in _GROUP_SETTING.items():
        shown = _parts(rows["left_out_by"].get(group, {}))
        if shown:
            parts.append(f"left out by {setting}: " + "; ".join(shown))
    lumped = _parts(rows.get("lumped", {}))
    if lumped:
        parts.append("lumped into <other> (data.unlisted=other): " + "; ".join(lumped))
    mapped = [f"{c} {n}" for c, n in rows.get("mapped", {}).items() if n]
    if mapped:
        parts.append("relabelled by data.label_map: " + ", ".join(mapped))
    for col, shapes in rows.get("not_a_number", {}).items():
        for name, n in shapes.items():
            parts.append(f"{col}: {n} entries {name} ({shape_setting(name)})")
    hit = [f"{c} {v['below_lower'] + v['above_upper']}" for c, v in (clipped or {}).items()
           if v["below_lower"] or v["above_upper"]]
    if hit:
        parts.append("clipped into the declared bounds: " + ", ".join(hit))
    return "data (PRIVATE counts, for the data holder; in private/data_diagnostics.json): " + "; ".join(parts)
