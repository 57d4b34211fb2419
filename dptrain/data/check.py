"""The data holder's check of a table against its declared schema (``dptrain check``): every
problem at once, with counts and the setting that handles each. It publishes nothing.

A run may not refuse a table for what one row holds (a refusal is an output: docs/data.md), so it
handles rows outside the declared domain by declared rules and counts them privately. This check
is where the data holder sees why, before the run: per column the labels that are not declared
(case, spacing and accent variants of a declared label marked, with the ``data.label_map`` that
merges them), missing values, numbers written with digit-group separators or decimal commas (the
``data.thousands`` / ``data.decimal`` that read them), values outside the bounds, what the run
would leave out or lump, and id columns whose values repeat (a person on many rows). Unlike a
run's output, the report QUOTES values of the file: it is written under a private folder and shown
to the data holder only.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dptrain.data.encoding import encode_rows, numbers_of, numeric_settings
from dptrain.data.files import DataError
from dptrain.data.labels import cell_label, nfc
from dptrain.data.rules import NUMBER_SHAPES, number_shapes, shape_setting
from dptrain.data.schema import OTHER, Schema
from dptrain.data.units import rows_per_unit, unit_codes

__all__ = ["ID_NAME", "check_table", "format_check", "id_columns", "numeric_problems", "numeric_lines",
           "unit_distribution", "unit_lines"]

#: a column name that reads as an identifier (person_id, id, pid, record_no, ...)
ID_NAME = re.compile(r"(?i)((^|[_\W])(id|ids|pid|uid|person|persnr|record|key)([_\W]|$)|id$)")
SHOWN = 12  # undeclared labels shown per column, most frequent first


def _fold(label: str) -> str:
    """A label without case, surrounding or repeated spaces and accents: 'Süd ' -> 'sud'."""
    text = unicodedata.normalize("NFKD", label)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(text.casefold().split())


def _variant(label: str, declared: Sequence[str]) -> tuple[str, str] | None:
    """(the declared label ``label`` is a variant of, how) or None: the same but for case or
    spaces, the same but for accents, or a close spelling (a typo: difflib ratio >= 0.8)."""
    for d in declared:
        if " ".join(label.casefold().split()) == " ".join(d.casefold().split()):
            return d, "case or spacing"
    for d in declared:
        if _fold(label) == _fold(d):
            return d, "accents"
    close = difflib.get_close_matches(label, list(declared), n=1, cutoff=0.8)
    return (close[0], "a close spelling") if close else None


def _labels(col: pd.Series) -> pd.Series:
    """Each cell's label as a run compares it (stripped, NFC; None when missing or empty)."""
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    as_str = [nfc(cell_label(u)) for u in uniques]
    as_str = [None if s == "" else s for s in as_str] + [None]
    return pd.Series(np.asarray(as_str, dtype=object)[codes])


def _label_column(col: pd.Series, declared: Sequence[str], mapping: dict[str, str]) -> dict[str, Any]:
    """Counts of a column of labels: per declared label, the missing cells, and each undeclared
    label (after data.label_map) with the declared label it may be a variant of."""
    labels = _labels(col).map(lambda s: mapping.get(s, s) if s is not None else None)
    counts = labels.value_counts(dropna=True)
    missing = int(labels.isna().sum())
    number = {str(cell_label(float(d))) if _is_number(d) else d: d for d in declared}
    undeclared = []
    for value, n in counts.items():
        if value in declared or number.get(value) is not None:
            continue
        hit = _variant(str(value), declared)
        undeclared.append({"label": str(value), "rows": int(n), "variant_of": hit[0] if hit else None,
                           "how": hit[1] if hit else None})
    return {"declared": {d: int(counts.get(d, 0)) for d in declared}, "missing": missing,
            "undeclared_rows": sum(u["rows"] for u in undeclared), "undeclared": undeclared[:SHOWN],
            "undeclared_labels": len(undeclared), "relabelled": int(_labels(col).isin(list(mapping)).sum())}


def _is_number(label: str) -> bool:
    try:
        float(label)
    except ValueError:
        return False
    return True


def _target(df: pd.DataFrame, schema: Schema) -> dict[str, Any]:
    col = df[schema.target]
    labels = schema.target_labels
    if schema.target_bounds is not None:
        return {"kind": "continuous", **numeric_problems(col, schema, *schema.target_bounds)}
    if labels is None and schema.positive is not None:  # data.negative not declared yet: show the labels
        found = _label_column(col, [schema.positive], schema.labels_map(schema.target))
        return {"kind": "binary", "negative_missing": True, **found}
    if labels is None:
        v, text = numbers_of(col, dataclasses.replace(schema, thousands=None, decimal="."))
        v = np.asarray(v, dtype=np.float64)
        missing = np.isnan(v) & (True if text is None else ~text)
        return {"kind": "0/1", "declared": {"0": int((v == 0).sum()), "1": int((v == 1).sum())},
                "missing": int(missing.sum()), "undeclared_rows": int((~missing & (v != 0) & (v != 1)).sum()),
                "undeclared": [], "undeclared_labels": 0, "relabelled": 0}
    return {"kind": schema.target_kind, **_label_column(col, labels, schema.labels_map(schema.target))}


def numeric_problems(col: pd.Series, schema: Schema, lower: float, upper: float) -> dict[str, Any]:
    """Missing, infinite and non-numeric entries (by shape, with the setting that reads them) and
    the values outside [lower, upper] of a numeric column, read with the declared separators."""
    v, text = numbers_of(col, schema)
    v = np.asarray(v, dtype=np.float64)
    out = {"missing": int((np.isnan(v) & (True if text is None else ~text)).sum()),
           "infinite": int(np.isinf(v).sum()), "not_a_number": 0, "shapes": {},
           "below_lower": int((v < lower).sum()), "above_upper": int((v > upper).sum()), "bounds": [lower, upper]}
    if text is not None:
        out["not_a_number"] = int(text.sum())
        out["shapes"] = {name: {"entries": n, "setting": shape_setting(name)}
                         for name, n in number_shapes(col, text).items()}
    return out


def id_columns(df: pd.DataFrame, schema: Schema) -> dict[str, Any]:
    """Columns that identify a person (data.split_key's, or a name like person_id): how many
    distinct values, how many repeat and the most rows one value has."""
    declared = set(schema.columns)
    names = list(schema.split_key or ()) + [c for c in df.columns if ID_NAME.search(str(c)) and c not in declared
                                            and c not in (schema.split_key or ())]
    out = {}
    for name in names:
        if name not in df.columns:
            continue
        per = df[name].value_counts(dropna=True)
        many = per[per > 1]
        out[name] = {"distinct": int(len(per)), "repeated_ids": int(len(many)),
                     "rows_of_repeated_ids": int(many.sum()), "most_rows_per_id": int(per.max()) if len(per) else 0}
    return out


def _run_counts(df: pd.DataFrame, schema: Schema, seed: int) -> dict[str, Any]:
    """What a run with these settings would do (the run's own rules and counts): rows read, left
    out per rule, lumped, relabelled, the training and test rows."""
    try:
        rows = encode_rows(df, dataclasses.replace(schema, nonfinite="drop"), seed=seed)
    except DataError:  # rows without a unit id (reported under the unit): the other counts as if per row
        rows = encode_rows(df, dataclasses.replace(schema, nonfinite="drop", privacy_unit=None), seed=seed)
    return {**rows.facts["rows"], "clipped": rows.facts["clipped"]}


def check_table(df: pd.DataFrame, schema: Schema, *, seed: int = 0) -> dict[str, Any]:
    """Every problem of ``df`` against ``schema`` (module docstring), as one JSON-ready report
    with the settings that handle them (``settings``: command-line overrides to add)."""
    numeric = {spec.name: numeric_problems(df[spec.name], schema, spec.lower, spec.upper)
               for setting, spec in numeric_settings(schema) if setting.startswith("data.numeric")}
    categorical = {col: _label_column(df[col], cats, schema.labels_map(col)) for col, cats in schema.categorical}
    report = {"rows": int(len(df)), "columns": [str(c) for c in df.attrs.get("file_columns", df.columns)],
              "target": {"column": schema.target, **_target(df, schema)}, "numeric": numeric,
              "categorical": categorical, "ids": id_columns(df, schema), "unlisted": schema.unlisted,
              "nonfinite": schema.nonfinite}
    if schema.split_column is not None:
        split = _labels(df[schema.split_column]).str.lower()
        report["split_column"] = {"column": schema.split_column,
                                  "not_train_or_test": int((~split.isin(["train", "test"])).sum())}
    if schema.privacy_unit is not None:
        report["units"] = {"column": schema.privacy_unit, **unit_distribution(df[schema.privacy_unit])}
    report["run"] = _run_counts(df, schema, seed) if schema.target_labels is not None or schema.positive is None \
        else None
    report["settings"] = suggested_settings(report, schema)
    return report


def _quoted(label: str) -> str:
    return json.dumps(label, ensure_ascii=False)


#: a key Hydra's command-line grammar takes unquoted (a dict key cannot be quoted there)
_HYDRA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def _shell(override: str) -> str:
    """A command-line override as the shell must receive it (Hydra reads ',' or ' ' only quoted)."""
    return f'"{override}"' if not re.search(r'["$`\\]', override) else "'" + override.replace("'", "'\\''") + "'"


def _label_map_setting(maps: dict[str, dict[str, str]]) -> str:
    """data.label_map as a command-line override, or (when a key cannot be written there) as the
    line of a data config file."""
    if all(_HYDRA_KEY.fullmatch(k) for c, m in maps.items() for k in [c, *m]):
        body = ", ".join(f"{c}: {{" + ", ".join(f"{a}: {_quoted(b)}" for a, b in m.items()) + "}"
                         for c, m in maps.items())
        return f"'++data.label_map={{{body}}}'"
    body = ", ".join(f"{_quoted(c)}: {{" + ", ".join(f"{_quoted(a)}: {_quoted(b)}" for a, b in m.items()) + "}"
                     for c, m in maps.items())
    return f"label_map: {{{body}}}   (in a data config file: a label here cannot be a command-line key)"


def suggested_settings(report: dict[str, Any], schema: Schema) -> list[str]:
    """The command-line settings that read or merge what the report found: data.thousands /
    data.decimal for numbers written with separators, data.label_map for variants of declared
    labels (with the maps already declared), data.negative when only data.positive is declared,
    data.split_key for an id column whose values repeat."""
    out: list[str] = []
    shapes = {name for col in report["numeric"].values() for name in col["shapes"]}
    for name in (s[0] for s in NUMBER_SHAPES):
        if name in shapes and shape_setting(name).startswith("data."):
            out += [_shell(s) for s in shape_setting(name).split() if _shell(s) not in out]
    maps: dict[str, dict[str, str]] = {col: dict(pairs) for col, pairs in schema.label_map}
    columns = {**report["categorical"]}
    if report["target"].get("undeclared"):
        columns[schema.target] = report["target"]
    added = False
    for col, found in columns.items():
        for u in found.get("undeclared", []):
            if u["variant_of"] is not None and u["how"] in ("case or spacing", "accents"):
                maps.setdefault(col, {})[u["label"]] = u["variant_of"]
                added = True
    if added:  # with the maps already declared: the setting replaces them
        out.append(_label_map_setting(maps))
    if report["target"].get("negative_missing"):
        others = [u["label"] for u in report["target"]["undeclared"] if u["variant_of"] is None]
        out.append(_shell(f"data.negative={_quoted(others[0]) if others else 'LABEL'}"))
    repeated = [c for c, v in report["ids"].items() if v["repeated_ids"]]
    if repeated and schema.split_key is None and schema.split_column is None:
        out.append(f"data.split_key=[{repeated[0]}]")
    return out


def _label_lines(name: str, setting: str, found: dict[str, Any], rule: str) -> list[str]:
    lines = []
    if found["missing"]:
        lines.append(f"  {name}: {found['missing']} rows missing -> {rule}")
    if found["undeclared_rows"]:
        lines.append(f"  {name}: {found['undeclared_rows']} rows with {found['undeclared_labels']} label(s) not in "
                     f"{setting} -> {rule}")
        for u in found["undeclared"]:
            hint = (f" (a variant of {u['variant_of']!r}: {u['how']}; data.label_map merges it)"
                    if u["variant_of"] else "")
            lines.append(f"      {u['label']!r}: {u['rows']} rows{hint}")
    return lines


def numeric_lines(name: str, found: dict[str, Any], nonfinite: str, bounds: str = "") -> list[str]:
    """The lines of one numeric column's problems (``bounds``: the setting of its bounds)."""
    rule = "row left out (data.nonfinite=drop)" if nonfinite == "drop" else "the run is REFUSED (data.nonfinite=error)"
    lines = [f"  {name}: {found[k]} rows {k.replace('_', ' ')} -> {rule}" for k in ("missing", "infinite") if found[k]]
    for shape, v in found["shapes"].items():
        lines.append(f"  {name}: {v['entries']} entries written as {shape} -> {rule} unless read with {v['setting']}")
    lo, hi = found["bounds"]
    for k, bound in (("below_lower", f"below {lo:g}"), ("above_upper", f"above {hi:g}")):
        if found[k]:
            lines.append(f"  {name}: {found[k]} values {bound} -> clipped into the bounds "
                         f"({bounds or f'data.numeric.{name}.lower/upper'})")
    return lines


def format_check(report: dict[str, Any], origin: str) -> str:
    """The report as text for the data holder (PRIVATE: it quotes values of the file)."""
    t = report["target"]
    lines = [f"dptrain check of {origin}: {report['rows']} rows (PRIVATE: this report quotes values and counts "
             "of the file; it is for the data holder and is never published)", "", "Target"]
    setting = "data.classes" if t["kind"] == "multiclass" else "data.positive / data.negative"
    if t.get("negative_missing"):
        lines.append(f"  {t['column']}: data.negative is not declared: a run refuses data.positive alone; the labels "
                     "below are candidates")
    lines.append(f"  {t['column']}: " + ", ".join(f"{k!r} {v} rows" for k, v in t.get("declared", {}).items()))
    lines += _label_lines(t["column"], setting, t, "row left out (never read as a negative)") if "missing" in t \
        else []
    lines += ["", "Numeric columns"] + [x for name, f in report["numeric"].items()
                                        for x in numeric_lines(name, f, report["nonfinite"])]
    rule = {"other": f"lumped into {OTHER} (data.unlisted=other)", "drop": "row left out (data.unlisted=drop)"}
    lines += ["", "Categorical columns"] + [x for name, f in report["categorical"].items()
                                            for x in _label_lines(name, f"data.categorical.{name}", f,
                                                                  rule[report["unlisted"]])]
    if "split_column" in report and report["split_column"]["not_train_or_test"]:
        s = report["split_column"]
        lines += ["", f"  {s['column']}: {s['not_train_or_test']} rows neither train nor test -> row left out"]
    lines += ["", "Id columns (a person on many rows)"] + ([] if report["ids"] else [
        "  none found (a column named like person_id, or data.split_key's)"])
    declared = (report.get("units") or {}).get("column")
    for name, v in report["ids"].items():
        lines.append(f"  {name}: {v['distinct']} distinct values, {v['repeated_ids']} repeat "
                     f"({v['rows_of_repeated_ids']} rows; at most {v['most_rows_per_id']} rows per id): "
                     + ("the declared unit of privacy (below)" if name == declared else
                        "example-level DP protects a person with k rows only at the group-privacy level for k rows; "
                        f"data.privacy_unit={name} (with privacy.max_rows_per_unit=k) makes the guarantee per person "
                        "and splits by person"))
    return "\n".join(lines + unit_lines(report.get("units")) + _run_lines(report))


#: the caps k whose kept share of rows the check reports
CAPS = (1, 2, 3, 5, 10, 20)


def unit_distribution(col: pd.Series) -> dict[str, Any]:
    """Rows per unit of data.privacy_unit's column (PRIVATE counts, for the data holder): units,
    rows without an id, quantiles of the rows per unit and, per cap k, the rows a cap would keep."""
    codes = unit_codes(col, missing="drop")
    per_unit = rows_per_unit(codes)
    if per_unit.size == 0:
        return {"units": 0, "missing_ids": int((codes < 0).sum())}
    q = np.quantile(per_unit, [0.5, 0.9, 0.99])
    return {"units": int(per_unit.size), "missing_ids": int((codes < 0).sum()), "rows": int(per_unit.sum()),
            "rows_per_unit": {"median": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
                              "max": int(per_unit.max()), "mean": float(per_unit.mean())},
            "kept_by_cap": {str(k): int(np.minimum(per_unit, k).sum()) for k in CAPS}}


def unit_lines(units: dict[str, Any] | None) -> list[str]:
    """privacy_unit's lines of the check (PRIVATE counts)."""
    if not units:
        return []
    lines = ["", "Unit of privacy (data.privacy_unit): rows per unit"]
    if units["missing_ids"]:
        lines.append(f"  {units['missing_ids']} rows without a unit id -> left out by the run (counted privately)")
    if not units["units"]:
        return lines
    r = units["rows_per_unit"]
    lines.append(f"  {units['units']} units, {units['rows']} rows: rows per unit median {r['median']:g}, 90% "
                 f"{r['p90']:g}, 99% {r['p99']:g}, max {r['max']}, mean {r['mean']:.3g}")
    lines.append("  rows kept by privacy.max_rows_per_unit=k: " + ", ".join(
        f"k={k}: {n} ({n / units['rows']:.1%})" for k, n in units["kept_by_cap"].items()))
    return lines


def _run_lines(report: dict[str, Any]) -> list[str]:
    lines = [""]
    run = report["run"]
    if run is not None:
        lines += [f"A run with these settings: {run['read']} rows read, {run['kept']} used ({run['train']} training, "
                  f"{run['test']} test), {run['left_out']} left out; lumped into {OTHER}: "
                  + (", ".join(f"{c} {sum(v.values())}" for c, v in run["lumped"].items() if sum(v.values()))
                     or "none")]
        if run["train"] == 0:
            lines.append("  NO training row: the run would be refused")
    settings = report["settings"]
    lines += ["", "Settings that read or merge what is above (add them to the run and check again):" if settings
              else "No setting to add: the declared rules handle every row (they are counted in each run)."]
    lines += [f"  {s}" for s in settings]
    return lines

