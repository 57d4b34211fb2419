"""The PUBLIC schema of a table, declared in the data config and checked before any row is read
(:func:`schema_from_config`): the target and its declared labels (``positive`` and ``negative``,
``classes`` or ``target_bounds``), numeric columns with their bounds, categorical columns with their
labels, the label maps, the rules for rows outside the declared domain (``unlisted``,
``nonfinite``), how numbers are written (``thousands``, ``decimal``) and the split. Raises
ConfigError naming the setting; reads no row."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dptrain.core.dataspec import DataSpec
from dptrain.core.validation import ConfigError, field_of
from dptrain.data.labels import cell_label, nfc

OTHER = "<other>"  # name of the extra one-hot slot: feature "col=<other>"
THOUSANDS = (",", ".", " ", "'")
DECIMALS = (".", ",")


@dataclass(frozen=True)
class NumericSpec:
    """A numeric column's PUBLIC encoding (``data.numeric.<name>``): values clipped into [lower,
    upper], ``log1p`` of value and bounds with ``transform="log1p"``, then scaled to [0, 1]."""

    name: str  # the column
    lower: float  # PUBLIC bounds, in the column's units (never from the rows)
    upper: float
    transform: str = "none"  # none | log1p


@dataclass(frozen=True)
class Schema:
    """The public schema, checked. Built by :func:`schema_from_config`."""

    target: str
    positive: str | None
    numeric: tuple[NumericSpec, ...]
    categorical: tuple[tuple[str, tuple[str, ...]], ...]
    split_column: str | None = None
    nonfinite: str = "drop"  # drop | error: a numeric column's missing, NaN, inf or non-numeric entry
    test_fraction: float = 0.25
    classes: tuple[str, ...] | None = None  # a multiclass target's PUBLIC class list (data.classes)
    target_bounds: tuple[float, float] | None = None  # a continuous target's PUBLIC bounds (data.target_bounds)
    #: the hash split's key columns (data.split_key); None: every column of the file (the raw row)
    split_key: tuple[str, ...] | None = None
    negative: str | None = None  # a binary target's PUBLIC negative label (data.negative, with positive)
    #: data.label_map: per column, (label as the file writes it, the declared label it stands for)
    label_map: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    unlisted: str = "other"  # other | drop: a categorical value outside the declared list
    thousands: str | None = None  # the digit-group separator of numbers written as text
    decimal: str = "."  # the decimal mark of numbers written as text
    #: data.privacy_unit: the column whose value is the unit of privacy (None: one row is the unit)
    privacy_unit: str | None = None

    def labels_map(self, column: str) -> dict[str, str]:
        """data.label_map's entries for ``column`` ({file label: declared label}; {} if none)."""
        return dict(next((pairs for col, pairs in self.label_map if col == column), ()))

    @property
    def target_labels(self) -> tuple[str, ...] | None:
        """The target's declared labels in code order: (negative, positive) of a binary target with
        data.positive, the classes of a multiclass one; None for a 0/1 or a continuous target."""
        if self.classes is not None:
            return tuple(self.classes)
        return (self.negative, self.positive) if self.positive is not None and self.negative is not None else None

    @property
    def text_columns(self) -> list[str] | None:
        """The numeric columns a CSV reader keeps as text, for the encoding to parse with the
        declared data.thousands / data.decimal (None: none declared, numbers read as numbers)."""
        if self.thousands is None and self.decimal == ".":
            return None
        return [s.name for s in self.numeric] + ([self.target] if self.target_bounds is not None else [])

    @property
    def target_kind(self) -> str:
        return "multiclass" if self.classes is not None else ("continuous" if self.target_bounds is not None
                                                              else "binary")

    def data_spec(self, *, extra_features: int = 0) -> Any:
        """The :class:`dptrain.core.dataspec.DataSpec` of this schema (no row is read)."""
        return DataSpec(n_features=len(self.feature_names) + extra_features, target_kind=self.target_kind,
                        class_names=tuple(self.classes or ()), target_bounds=self.target_bounds)

    @property
    def feature_columns(self) -> list[str]:
        return [s.name for s in self.numeric] + [c for c, _ in self.categorical]

    @property
    def columns(self) -> list[str]:
        cols = [self.target] + self.feature_columns
        return (cols + ([self.split_column] if self.split_column else [])
                + ([self.privacy_unit] if self.privacy_unit else []))

    @property
    def read_columns(self) -> list[str] | None:
        """The columns a reader must load: the declared ones and the split's key (None: every
        column, the hash split keyed on the whole raw row)."""
        if self.split_column is None and self.split_key is None and self.privacy_unit is None:
            return None
        return list(dict.fromkeys(self.columns + list(self.split_key or ())))

    @property
    def declared_features(self) -> list[tuple[str, str]]:
        """(setting, column) of the numeric, then the categorical feature columns."""
        return [(f"data.numeric.{s.name}", s.name) for s in self.numeric] + [
            (f"data.categorical.{c}", c) for c, _ in self.categorical]

    @property
    def declared_columns(self) -> list[tuple[str, str]]:
        """(setting, column) of every column the declaration names, in schema order: the target,
        the numeric and categorical features, the split column and the split's key columns."""
        return ([("data.target", self.target)] + self.declared_features
                + ([("data.split_column", self.split_column)] if self.split_column else [])
                + [("data.split_key", c) for c in self.split_key or ()]
                + ([("data.privacy_unit", self.privacy_unit)] if self.privacy_unit else []))

    @property
    def feature_names(self) -> tuple[str, ...]:
        names = [s.name for s in self.numeric]
        for col, cats in self.categorical:
            names += [f"{col}={c}" for c in cats] + [f"{col}={OTHER}"]
        return tuple(names)


def _number(setting: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{setting}={value!r} is not allowed: must be a number")
    return float(value)


def numeric_spec(name: str, spec: Any, *, setting: str | None = None) -> NumericSpec:
    """Normalise one ``data.numeric.<name>`` entry (NumericColumn, DictConfig or mapping);
    ``setting`` names it in errors (default ``data.numeric.<name>``)."""
    setting = setting or f"data.numeric.{name}"
    if spec is None or not (isinstance(spec, Mapping) or hasattr(spec, "lower")):
        raise ConfigError(f"{setting}={spec!r} is not allowed: give {{lower: ..., upper: ...}} (optionally "
                          "transform: log1p)")
    for bound in ("lower", "upper"):  # no default range: a silent [0, 1] clips every age to 1
        if field_of(spec, bound) is None:
            raise ConfigError(f"{setting}.{bound} is missing: declare both PUBLIC bounds, e.g. "
                              f"'++{setting}={{lower: 0, upper: 100}}'; allowed: finite numbers with lower < upper "
                              "(from documentation or domain knowledge, never from the rows)")
    lo = _number(f"{setting}.lower", field_of(spec, "lower"))
    hi = _number(f"{setting}.upper", field_of(spec, "upper"))
    for bound, value in (("lower", lo), ("upper", hi)):
        if not math.isfinite(value):
            raise ConfigError(f"{setting}.{bound}={value!r} is not allowed: must be a finite number (a public bound)")
    transform = field_of(spec, "transform", "none") or "none"
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError(f"{setting}='[{lo}, {hi}]' is not allowed: bounds must be finite with lower < upper")
    if transform not in ("none", "log1p"):
        raise ConfigError(f"{setting}.transform={transform!r} is not allowed: must be none or log1p")
    if transform == "log1p" and lo <= -1:
        raise ConfigError(f"{setting}.lower={lo!r} is not allowed: log1p needs lower > -1")
    return NumericSpec(name, lo, hi, transform)


def schema_from_config(decl: Mapping[str, Any], *, numeric: Mapping[str, Any] | None = None,
                       require_negative: bool = True) -> Schema:
    """Check a schema declaration (the mapping :func:`dptrain.data.declaration` reads from a run's
    data settings, or a Python caller's) and return it normalised. Raises ConfigError.
    ``require_negative=False`` accepts a binary target declared by its positive label alone (a
    model file written before data.negative existed: its schema encodes features only)."""
    target = field_of(decl, "target")
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(f"data.target={target!r} is not allowed: name the label column of the table")
    target = target.strip()
    positive, negative = _binary_labels(decl)
    nums = [numeric_spec(str(k).strip(), v)
            for k, v in (numeric if numeric is not None else (field_of(decl, "numeric") or {})).items()]
    cats = [(str(col).strip(), _label_list(f"data.categorical.{str(col).strip()}", lst))
            for col, lst in (field_of(decl, "categorical") or {}).items()]
    if not nums and not cats:
        raise ConfigError("data.numeric/data.categorical='{}' is not allowed: declare at least one feature column")
    seen: dict[str, str] = {}
    for setting, col in ([(f"data.numeric.{s.name}", s.name) for s in nums]
                         + [(f"data.categorical.{c}", c) for c, _ in cats]):
        if col in seen:
            raise ConfigError(f"{setting} is not allowed: column {col!r} is also declared as {seen[col]}")
        if col == target:
            raise ConfigError(f"{setting} is not allowed: column {col!r} is the target (data.target); "
                              "a label cannot be a feature")
        seen[col] = setting
    split = field_of(decl, "split_column")
    split = str(split).strip() if split is not None and str(split).strip() else None
    if split is not None and (split in seen or split == target):
        raise ConfigError(f"data.split_column={split!r} is not allowed: it is also the target or a feature column")
    frac = field_of(decl, "test_fraction", 0.25)
    if split is None and not (isinstance(frac, (int, float)) and 0 < frac < 1):
        raise ConfigError(f"data.test_fraction={frac!r} is not allowed: must be in (0, 1)")
    classes, bounds = _target_declaration(decl, positive)
    if positive is not None and negative is None and require_negative:
        raise ConfigError(f"data.positive={positive!r} is not allowed alone: declare the negative label too, "
                          "data.negative=LABEL (e.g. data.negative=no); rows whose target is neither label (a variant "
                          "such as 'Yes', a missing value) are left out and counted, never read as negatives, and "
                          "data.label_map merges variants ('++data.label_map={COLUMN: {Yes: yes}}')")
    unit = _privacy_unit(decl, target, seen, split)
    key = _unit_split_key(_split_key(decl, split), unit, split)
    labels = tuple(classes) if classes is not None else ((negative, positive) if negative is not None else None)
    (nonfinite, unlisted), (thousands, decimal) = _rules(decl), number_format(decl)
    return Schema(target, positive, tuple(nums), tuple(cats), split, nonfinite, float(frac), classes, bounds, key,
                  negative=negative, label_map=_label_map(decl, target, labels, cats), unlisted=unlisted,
                  thousands=thousands, decimal=decimal, privacy_unit=unit)


def _privacy_unit(decl: Mapping[str, Any], target: str, features: Mapping[str, str], split: str | None) -> str | None:
    """data.privacy_unit checked: a column name that is not the target, a feature or the split
    column (a unit id is never a model input: it would single out a unit)."""
    unit = field_of(decl, "privacy_unit")
    if unit is None:
        return None
    if not isinstance(unit, str) or not unit.strip():
        raise ConfigError(f"data.privacy_unit={unit!r} is not allowed: must be the name of the column whose value is "
                          "the unit of privacy (e.g. person_id), or null (one row is the unit)")
    unit = unit.strip()
    if unit == target:
        raise ConfigError(f"data.privacy_unit={unit!r} is not allowed: it is the target (data.target); the unit "
                          "column is an id, never the label")
    if unit in features:
        raise ConfigError(f"data.privacy_unit={unit!r} is not allowed: it is also declared as {features[unit]}; the "
                          "unit column is an id, never a model feature (remove it from the features)")
    if unit == split:
        raise ConfigError(f"data.privacy_unit={unit!r} is not allowed: it is also data.split_column")
    return unit


def _split_key(decl: Mapping[str, Any], split: str | None) -> tuple[str, ...] | None:
    """data.split_key checked: a non-empty list of column names, not with data.split_column."""
    key = field_of(decl, "split_key")
    if key is None:
        return None
    if isinstance(key, (str, bytes)) or not hasattr(key, "__iter__") or not list(key) or not all(
            isinstance(c, str) and c.strip() for c in key):
        raise ConfigError(f"data.split_key={key!r} is not allowed: must be a non-empty list of column names "
                          "(e.g. [person_id]) or null (every column of the file)")
    if split is not None:
        raise ConfigError(f"data.split_key={list(key)!r} is not allowed with data.split_column={split!r}: the "
                          "split column decides the split; allowed: one of them")
    return tuple(dict.fromkeys(str(c).strip() for c in key))


def _unit_split_key(key: tuple[str, ...] | None, unit: str | None,
                    split: str | None) -> tuple[str, ...] | None:
    """The hash split's key with a unit of privacy: the unit itself (all of a unit's rows on one
    side); another data.split_key, or a data.split_column (which may cut a unit), is refused."""
    if unit is None:
        return key
    if split is not None:
        raise ConfigError(f"data.split_column={split!r} is not allowed with data.privacy_unit={unit!r}: a split "
                          "column may put rows of one unit on both sides; allowed: the hash split keyed on the unit "
                          "(data.split_column=null)")
    if key is not None and key != (unit,):
        raise ConfigError(f"data.split_key={list(key)!r} is not allowed with data.privacy_unit={unit!r}: the split "
                          f"is by unit (all of a unit's rows on one side); allowed: [{unit}] or null (the same)")
    return (unit,)


def _rules(decl: Mapping[str, Any]) -> tuple[str, str]:
    """(data.nonfinite, data.unlisted), checked."""
    nonfinite = field_of(decl, "nonfinite", "drop") or "drop"
    if nonfinite not in ("drop", "error"):
        raise ConfigError(f"data.nonfinite={nonfinite!r} is not allowed: must be one of drop, error")
    unlisted = field_of(decl, "unlisted", "other") or "other"
    if unlisted not in ("other", "drop"):
        raise ConfigError(f"data.unlisted={unlisted!r} is not allowed: must be one of other (the column's {OTHER} "
                          "slot), drop (the row is left out)")
    return nonfinite, unlisted


def number_format(decl: Any) -> tuple[str | None, str]:
    """(data.thousands, data.decimal) of a declaration or of a release's data settings, checked: a
    separator among :data:`THOUSANDS` (or None) and a decimal mark among :data:`DECIMALS`, not the
    same character."""
    thousands, decimal = field_of(decl, "thousands"), field_of(decl, "decimal", ".")
    thousands = None if thousands in (None, "") else thousands
    decimal = "." if decimal in (None, "") else decimal
    if thousands is not None and thousands not in THOUSANDS:
        raise ConfigError(f"data.thousands={thousands!r} is not allowed: must be one of ',', '.', ' ', \"'\" (the "
                          "digit-group separator of numbers written as text) or null")
    if decimal not in DECIMALS:
        raise ConfigError(f"data.decimal={decimal!r} is not allowed: must be '.' or ','")
    if thousands == decimal:
        raise ConfigError(f"data.thousands={thousands!r} and data.decimal={decimal!r} are not allowed together: the "
                          "digit-group separator and the decimal mark must differ")
    return thousands, decimal


def _declared_label(setting: str, value: Any) -> str | None:
    """One declared label as the stripped NFC string it is compared with (None for null). A
    boolean is refused: YAML reads an unquoted yes / no / on / off as true / false."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{setting}={value!r} is not allowed: a label read as a boolean (YAML reads an unquoted yes, "
                          "no, on, off, true, false as one); allowed: the label quoted, e.g. 'no' (or 'True' / "
                          "'False' for a column of booleans)")
    if not isinstance(value, (str, int, float)):
        raise ConfigError(f"{setting}={value!r} is not allowed: a label must be a string or a number")
    return nfc(cell_label(value))


def _binary_labels(decl: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(data.positive, data.negative), checked: no negative without a positive, distinct (that
    a positive needs its negative is checked after the target's kind)."""
    positive = _declared_label("data.positive", field_of(decl, "positive"))
    negative = _declared_label("data.negative", field_of(decl, "negative"))
    if negative is not None and positive is None:
        raise ConfigError(f"data.negative={negative!r} is not allowed without data.positive: declare both labels of "
                          "a binary target (or neither, for a target of 0/1)")
    if positive is not None and positive == negative:
        raise ConfigError(f"data.negative={negative!r} is not allowed: it is also data.positive; allowed: the other "
                          "label of the target")
    return positive, negative


def _label_map(decl: Mapping[str, Any], target: str, target_labels: tuple[str, ...] | None,
               cats: list[tuple[str, tuple[str, ...]]]) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """data.label_map checked: for the target (with declared labels) or a categorical column, each
    file label mapped to one of that column's declared labels. Raises ConfigError."""
    raw = field_of(decl, "label_map") or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"data.label_map={raw!r} is not allowed: must map columns to {{file label: declared "
                          "label}}, e.g. {answer: {'Yes': yes}}")
    declared = dict(cats) | ({target: target_labels} if target_labels is not None else {})
    out = []
    for col, pairs in raw.items():
        col = str(col).strip()
        setting = f"data.label_map.{col}"
        if col not in declared:
            raise ConfigError(f"{setting} is not allowed: {col!r} is neither the target with declared labels "
                              "(data.positive and data.negative, or data.classes) nor a data.categorical column; "
                              f"allowed: {', '.join(repr(c) for c in declared) or 'none declared'}")
        if not isinstance(pairs, Mapping) or not pairs:
            raise ConfigError(f"{setting}={pairs!r} is not allowed: must map labels as the file writes them to "
                              "declared labels, e.g. {'Yes': yes}")
        mapped: dict[str, str] = {}
        for src, dst in pairs.items():
            a, b = _declared_label(f"{setting} key", src), _declared_label(f"{setting}.{src}", dst)
            if a is None or b not in declared[col] or a in declared[col] or a in mapped:
                raise ConfigError(f"{setting}.{src}={dst!r} is not allowed: map a label the file writes (not a "
                                  f"declared label, each once) to a declared label of {col!r}: "
                                  + ", ".join(repr(c) for c in declared[col][:8]))
            mapped[a] = b
        out.append((col, tuple(mapped.items())))
    return tuple(out)


def _label_list(setting: str, lst: Any, *, what: str = "category", null_hint: str = "missing values go to the "
                "other slot") -> tuple[str, ...]:
    """A declared list of labels (a categorical column's categories, a target's classes) as
    stripped strings: non-empty, no null, no duplicates. Raises ConfigError naming ``setting``."""
    if lst is None or isinstance(lst, (str, bytes, Mapping)) or not hasattr(lst, "__iter__"):
        raise ConfigError(f"{setting}={lst!r} is not allowed: must be a list of {what} labels")
    if any(c is not None and not isinstance(c, (str, int, float)) for c in lst):
        raise ConfigError(f"{setting}={list(lst)!r} is not allowed: every label must be a string or a number")
    items = tuple(_declared_label(setting, c) for c in lst)
    if len(items) == 0:
        raise ConfigError(f"{setting}=[] is not allowed: a {what} list must not be empty")
    if any(c is None for c in items):
        raise ConfigError(f"{setting} is not allowed: a {what} label is null ({null_hint})")
    if len(set(items)) != len(items):
        raise ConfigError(f"{setting} is not allowed: the list has {len(items) - len(set(items))} "
                          "duplicate label(s) (compared as stripped strings)")
    return items


def _target_declaration(decl: Mapping[str, Any],
                        positive: str | None) -> tuple[tuple[str, ...] | None, tuple[float, float] | None]:
    """(classes, target bounds) of a multiclass / continuous target, or (None, None) for a binary
    one. At most one of data.positive, data.classes, data.target_bounds. Raises ConfigError."""
    classes, bounds = field_of(decl, "classes"), field_of(decl, "target_bounds")
    if bounds is not None and field_of(bounds, "lower") is None and field_of(bounds, "upper") is None:
        bounds = None  # {lower: null, upper: null}, the settings' default: no continuous target
    given = [n for n, v in (("data.positive", positive), ("data.classes", classes),
                            ("data.target_bounds", bounds)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} are not allowed together: declare ONE kind of target: "
                          "data.positive (binary), data.classes (multiclass) or data.target_bounds (continuous)")
    if classes is not None:
        classes = _label_list("data.classes", classes, what="class",
                              null_hint="a missing target is left out, not a class")
        if len(classes) < 2:
            raise ConfigError(f"data.classes={list(classes)!r} is not allowed: a multiclass target needs at least "
                              "2 declared classes")
    if bounds is not None:
        spec = numeric_spec("target_bounds", bounds, setting="data.target_bounds")
        if spec.transform != "none":
            raise ConfigError(f"data.target_bounds.transform={spec.transform!r} is not allowed: the target takes "
                              "lower and upper only")
        bounds = (spec.lower, spec.upper)
    return classes, bounds
