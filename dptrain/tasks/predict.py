"""Score new rows with a trained model: the API (:class:`TrainedModel`, :func:`load_model`) and
``task=predict``.

A training run's ``model.pt`` holds the weights, the model's config, the objective's name and
the PUBLIC feature encoder (target, positive label, numeric bounds and transforms, category
lists, feature names), never anything computed from private rows besides the weights, which
the run's guarantee covers. :func:`load_model` rebuilds the model from it; a
:class:`TrainedModel` encodes a DataFrame with that schema (:func:`dptrain.data.encoding.encode_features`:
clipped to the declared bounds, one-hot over the declared categories) and scores it.

The command::

    python -m dptrain task=predict run=<training run folder> data.path=new.csv

checks the settings, loads the model, reads the file's header and refuses a missing declared
column by name BEFORE any row is read, then writes one prediction per input row into its own
run folder, with FILES.txt: the objective's columns (``prediction_columns``): for
``objective=binary`` the score (logit), the probability of label 1 and the predicted ``label`` in
the model's declared labels (data.positive / data.negative, its 0/1 as ``label_01``; 0/1 for a
target declared by neither); for ``multinomial`` one probability ``p_<class>`` per declared class
and the predicted class's name (``label``); for ``linear`` the ``prediction`` in the target's
original units. A missing, infinite or non-numeric entry in a numeric feature column is refused
(``predict.missing=refuse``) or scores its row as NaN (``nan``: kept, prediction columns empty;
how many, in ``private/predict_counts.json`` only); a blank category goes to ``<other>``.
The predictions are computed from the rows given, so they are exactly as private as those rows:
``private/predictions.csv`` unless ``data.public=true`` declares the rows public (then
``predictions.csv`` at the top, publishable). The model's guarantee protects its TRAINING rows
only; it says nothing about the rows scored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError, one_of
from dptrain.data.encoding import encode_features, numbers_of
from dptrain.data.files import DataError, locate
from dptrain.data.reading import read_header, read_table
from dptrain.data.schema import Schema, number_format
from dptrain.inference.coefficients import linear_layer
from dptrain.models.objectives import build_objective
from dptrain.runfolder.folder import RunFolder
from dptrain.runfolder.tracking import MODEL_FILENAME, finite_epsilon, model_path_in  # noqa: F401
from dptrain.settings.predict import (
    MISSING,
    PredictDataConfig,
    PredictRunConfig,
    validate_predict,
    validate_predict_run,
)
from dptrain.training.checkpoint import CheckpointError, _build_module, _read_model_file, schema_from_dict

__all__ = ["PredictDataConfig", "PredictRunConfig", "TrainedModel", "load_model", "run_task", "validate_predict"]

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.csv"


# ------------------------------------------------------------------------------ the API


def _frame(rows: Any, origin: str) -> pd.DataFrame:
    """``rows`` as a DataFrame with stripped column names (as the file readers strip them)."""

    if isinstance(rows, pd.DataFrame):
        df = rows
    elif isinstance(rows, dict):
        df = pd.DataFrame(rows)
    else:
        raise DPTrainError(f"{origin} must be a pandas DataFrame (or a dict of columns) with the model's declared "
                           f"columns, not {type(rows).__name__}; the encoder finds the columns by name")
    names = [str(c).strip() for c in df.columns]
    if len(set(names)) != len(names):
        raise DataError(f"{origin}: duplicate column names (after stripping spaces); allowed: unique column names")
    return df.set_axis(names, axis=1)


def check_columns(columns: list[str], schema: Schema, origin: str) -> None:
    """Refuse, naming every one, the declared feature columns that ``columns`` lack."""
    have = set(columns)
    missing = [(setting, col) for setting, col in schema.declared_features if col not in have]
    if missing:
        named = ", ".join(f"{col!r} ({setting})" for setting, col in missing)
        raise DataError(f"{origin} lacks the declared column(s) {named} that the model was trained on; allowed: "
                        "rows with every declared feature column (names compared after stripping spaces, "
                        "case-sensitive; the target column is not needed)")


@dataclass(eq=False)
class TrainedModel:
    """A trained model with its public feature encoder (from :func:`load_model`).

    ``predict(df)`` (binary: 0/1, 1 = the target equals ``schema.positive``; multinomial: the
    declared class name; linear: the prediction in the target's original units),
    ``predict_proba(df)`` (classifiers: one column per class in ``classes_`` order),
    ``decision_function(df)`` (the model's raw outputs: the logit, the K class scores, the
    prediction on the [0, 1] training scale) take a DataFrame holding the declared feature
    columns (other columns are ignored); ``encode(df)`` is the encoded matrix."""

    module: torch.nn.Module
    schema: Schema
    objective: Any
    guarantee: str
    privacy: dict = field(default_factory=dict)
    path: Path | None = None
    #: the run's coefficient table (``model.pt``'s "coefficients": columns, summary text, claim), or None
    table: dict | None = None

    def coefficients(self) -> pd.DataFrame:
        """The run's coefficient table, the same as coefficients.csv (term, estimate, std_error,
        ci_lower, ci_upper, claimed, reason, method), indexed by term; a model without one (not
        linear, or an objective without coefficients) is refused."""
        if not self.table:
            why = ("it was written before tables were stored in the model file (read coefficients.csv)"
                   if self.table is None and linear_layer(self.module) is not None else
                   "its model is not linear (one Linear layer) or its objective has no coefficient interpretation")
            raise DPTrainError(f"model file {self.path} has no coefficient table: {why}")
        frame = pd.DataFrame(self.table["table"])
        for col in ("estimate", "std_error", "ci_lower", "ci_upper"):
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
        frame["claimed"] = frame["claimed"].astype(bool)
        return frame.set_index("term")

    def conf_int(self) -> pd.DataFrame:
        """The CLAIMED intervals (columns lower, upper; at the run's estimator.level), indexed by
        term; NaN where the run claims none (``coefficients()["reason"]`` says why)."""
        table = self.coefficients()
        return table[["ci_lower", "ci_upper"]].rename(columns={"ci_lower": "lower", "ci_upper": "upper"})

    def summary(self) -> str:
        """The table as the run wrote it (privacy.txt), which terms are claimed and why, and the
        guarantee."""
        table = self.coefficients()
        check = self.table.get("validity_check") or {}
        claims = f"intervals: {check.get('why')}" if check.get("why") else ""
        reasons = [f"  {t}: {r}" for t, r, c in zip(table.index, table["reason"], table["claimed"]) if not c]
        return "\n".join(part for part in (self.table.get("text", ""), claims, *reasons[:20],
                                            f"guarantee: {self.guarantee}") if part)

    @property
    def classes_(self) -> np.ndarray:
        """The classes in ``predict_proba``'s column order: 0, 1 (binary) or the declared names."""
        if self.schema.classes is not None:
            return np.array(self.schema.classes, dtype=object)
        return np.array([0, 1])

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.schema.feature_names

    def encode(self, rows: Any, *, origin: str = "the rows", missing: str = "refuse") -> np.ndarray:
        """The rows encoded with the model's public schema (float32, one row per input row).
        Missing declared columns are refused by name; a missing, infinite or non-numeric entry in a
        numeric feature column is refused (``missing="refuse"``, naming the column) or makes the
        row's encoding all NaN (``missing="nan"``)."""
        return self._encode(rows, origin, missing)[0]

    def _encode(self, rows: Any, origin: str, missing: str) -> tuple[np.ndarray, dict[str, Any]]:
        df = _frame(rows, origin)
        check_columns(list(df.columns), self.schema, origin)
        numeric, bad, counts = _numeric_features(df, self.schema, origin, missing)  # refused, or rows marked
        x = encode_features(df, self.schema, None, numeric)
        x[bad] = np.nan
        return x, counts

    def decision_function(self, rows: Any, *, missing: str = "refuse") -> np.ndarray:
        """The model's output per row (float64): for objective=binary the logit of label 1, for
        multinomial the K class scores (n, K), for linear the prediction on the [0, 1] scale;
        NaN for a row ``missing="nan"`` kept with a missing numeric entry (:meth:`encode`)."""
        return self._outputs(rows, "the rows", missing)[0]

    def _outputs(self, rows: Any, origin: str, missing: str) -> tuple[np.ndarray, dict[str, Any]]:
        x, counts = self._encode(rows, origin, missing)
        bad = np.isnan(x).any(axis=1)  # an encoded row is finite unless _encode marked it
        x[bad] = 0.0
        with torch.no_grad():
            z = self.module(torch.from_numpy(x)).double().numpy()
        z[bad] = np.nan  # whatever the model makes of zeros: the row has no prediction
        return z, counts

    def _scored(self, rows: Any, origin: str, missing: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the objective's prediction columns, a row kept by ``missing="nan"`` empty in each;
        the PRIVATE counts of such entries per numeric column)."""
        if not hasattr(self.objective, "prediction_columns"):
            raise DPTrainError(f"this model's objective {getattr(self.objective, 'name', '?')!r} defines no "
                               "prediction_columns: use decision_function")
        z, counts = self._outputs(rows, origin, missing)
        cols = self.objective.prediction_columns(torch.from_numpy(z))
        bad = np.isnan(z).reshape(len(z), -1).any(axis=1)
        return ({name: _blank(values, bad) for name, values in cols.items()} if bad.any() else cols), counts

    def predict_proba(self, rows: Any, *, missing: str = "refuse") -> np.ndarray:
        """Classifiers: (n, 2) P(label 0), P(label 1) (binary) or (n, K) one probability per
        declared class (multinomial), in ``classes_`` order (NaN: a row kept by ``missing="nan"``)."""
        name = getattr(self.objective, "name", None)
        if name not in ("binary", "multinomial"):
            raise DPTrainError(f"predict_proba needs objective=binary or multinomial; this model's objective is "
                               f"{name!r}: use predict")
        cols = self._scored(rows, "the rows", missing)[0]
        if name == "binary":
            p = np.asarray(cols["probability"], dtype=np.float64)
            return np.column_stack([1.0 - p, p])
        return np.column_stack([np.asarray(cols[f"p_{c}"], dtype=np.float64) for c in self.objective.class_names])

    def predict(self, rows: Any, *, missing: str = "refuse") -> np.ndarray:
        """Per row: binary the 0/1 label (1: logit > 0, as the training metrics count);
        multinomial the declared name of the most probable class; linear the prediction in the
        target's original units (a row kept by ``missing="nan"``: NaN, None for multinomial).
        :meth:`prediction_frame` writes a binary target's declared labels instead of 0/1."""
        cols = self._scored(rows, "the rows", missing)[0]
        return np.asarray(cols["prediction"] if "prediction" in cols else cols["label"])

    def prediction_frame(self, rows: Any, *, keep: list[str] | tuple[str, ...] = (), origin: str = "the rows",
                         missing: str = "refuse") -> pd.DataFrame:
        """One row per input row: the ``keep`` columns as given, then the objective's columns
        (binary: ``score``, ``probability`` of label 1, ``label``: the target's declared label,
        data.positive or data.negative, with ``label_01`` its 0/1, or 0/1 alone for a target
        declared by neither; multinomial: ``p_<class>`` per declared class, ``label``; linear:
        ``prediction`` in original units). A row kept by ``missing="nan"`` has its prediction
        columns empty (NaN)."""
        return self._prediction_frame(rows, keep, origin, missing)[0]

    def _prediction_frame(self, rows: Any, keep: Any, origin: str,
                          missing: str) -> tuple[pd.DataFrame, dict[str, Any]]:
        df = _frame(rows, origin)
        cols, counts = self._scored(df, origin, missing)
        out = pd.DataFrame({c: df[c].to_numpy() for c in keep})
        for name, values in cols.items():
            out[name] = values
        labels = self.schema.target_labels
        if getattr(self.objective, "name", None) == "binary" and labels is not None and "label" in out:
            code = out["label"].astype("Int64")
            out["label"] = code.map({0: labels[0], 1: labels[1]}).astype(object)
            out.insert(out.columns.get_loc("label") + 1, "label_01", code)
        return out, counts


def _blank(values: Any, bad: np.ndarray) -> Any:
    """A prediction column with the rows ``bad`` empty: NaN in a float column, a missing value in
    an integer one (a nullable Int64), None in a column of labels."""
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        return np.where(bad, np.nan, arr)
    if arr.dtype.kind in "iub":
        return pd.Series(arr).astype("Int64").mask(bad).array
    return pd.Series(arr, dtype=object).where(~bad, None).to_numpy()


def _numeric_features(df: pd.DataFrame, schema: Schema, origin: str,
                      missing: str) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, Any]]:
    """(the numeric feature columns as numbers, the rows with a missing, infinite or non-numeric
    entry in any of them, and per column how many of each kind: PRIVATE counts). ``missing``
    "refuse": such an entry is refused, naming the column (never a value or a count); "nan":
    the row is marked, its entries set to the lower bound for the encoder."""
    one_of("predict.missing", missing, MISSING)
    numeric, bad, counts = {}, np.zeros(len(df), dtype=bool), {}
    for spec in schema.numeric:  # numbers written as the training file wrote them (data.thousands / decimal)
        v, text = numbers_of(df[spec.name], schema)
        if missing == "refuse" and text is not None:
            raise DataError(f"data.numeric.{spec.name}: column {spec.name!r} of {origin} has non-numeric entries; "
                            "allowed: numbers (written as the model's training file wrote them, or as data.thousands "
                            "and data.decimal say); predict.missing=nan scores such rows as NaN and keeps them")
        hit = ~np.isfinite(v)
        if missing == "refuse" and hit.any():
            raise DataError(f"data.numeric.{spec.name}: column {spec.name!r} of {origin} has missing or "
                            "non-finite entries; allowed: a finite number in every row to score, or "
                            "predict.missing=nan (such rows scored as NaN and kept)")
        infinite, words = np.isinf(v), np.zeros(len(v), dtype=bool) if text is None else text
        counts[spec.name] = {"missing": int(np.count_nonzero(hit & ~infinite & ~words)),
                             "infinite": int(np.count_nonzero(infinite)), "not_a_number": int(np.count_nonzero(words))}
        numeric[spec.name] = np.where(hit, spec.lower, v) if hit.any() else v
        bad |= hit
    return numeric, bad, {"rows_read": len(df), "rows_scored_as_nan": int(np.count_nonzero(bad)),
                          "numeric_columns": counts}


# ------------------------------------------------------------------------------ task=predict


COUNTS = "predict_counts.json"  # under private/: how many rows predict.missing=nan scored as NaN (PRIVATE)


def _what(model: TrainedModel) -> str:
    """The prediction columns in words, for FILES.txt."""
    labels = model.schema.target_labels
    binary = ("score = logit, probability of label 1, label 0/1" if labels is None else
              f"score = logit, probability of {labels[1]!r} (data.positive), label = {labels[1]!r} or {labels[0]!r} "
              "(the model's declared labels), label_01 = 1 for data.positive, 0 for data.negative")
    return {"binary": binary,
            "multinomial": "p_<class> = the probability of each declared class, label = the most probable class",
            "linear": "prediction, in the target's original units"}.get(getattr(model.objective, "name", None),
                                                                        "the objective's prediction columns")


def _write(folder: RunFolder, frame: pd.DataFrame, *, model: TrainedModel, public: bool, origin: str,
           counts: dict[str, Any] | None) -> Path:
    """The predictions, publishable (``public``: the rows are declared public) or private, the
    PRIVATE counts of predict.missing=nan (``counts``; written whenever that policy is chosen, so
    that the folder's file list does not tell whether a row had a missing value), and FILES.txt
    of a predict run; returns where the predictions went."""
    what = f"one prediction per row of {origin} ({_what(model)}), computed from those rows"
    if counts is not None:
        what += "; a row with a missing or non-numeric numeric feature: prediction columns empty (predict.missing=nan)"
    if public:
        target = folder.write_text(PREDICTIONS, frame.to_csv(index=False),
                                   what + ": the rows are declared public (data.public=true)")
    else:
        target = folder.write_text(PREDICTIONS, frame.to_csv(index=False),
                                   what + ": as private as those rows (data.public=false)", private=True)
    if counts is not None:
        folder.write_json(COUNTS, counts, "counts about the rows scored: rows read, rows scored as NaN by "
                          "predict.missing=nan, and per numeric column its missing, infinite and non-numeric entries",
                          private=True)
    guarantee = (f"none for the rows scored: the predictions are a function of the rows in {origin}. The model "
                 f"({model.path}) protects its TRAINING rows only: {model.guarantee}")
    covered = public and bool(model.privacy.get("private")) and finite_epsilon(model.privacy.get("epsilon"))
    folder.finish(guarantee=guarantee, finite_guarantee=covered)
    return target


def _with_number_format(model: TrainedModel, d: PredictDataConfig) -> TrainedModel:
    """The model reading numbers as data.thousands / data.decimal say (null: as its training file
    wrote them, stored in model.pt), checked together (ConfigError naming them)."""
    if d.thousands is None and d.decimal is None:
        return model
    thousands, decimal = number_format({"thousands": model.schema.thousands if d.thousands is None else d.thousands,
                                        "decimal": model.schema.decimal if d.decimal is None else d.decimal})
    return replace(model, schema=replace(model.schema, thousands=thousands, decimal=decimal))


def _read_rows(model: TrainedModel, d: PredictDataConfig) -> tuple[pd.DataFrame, str]:
    """The rows of data.path (the declared feature columns and data.keep_columns), read only after
    the header has every one of them; and the file's name for messages."""
    table = locate(d.path, d.format)
    origin = table.origin
    header = read_header(table, delimiter=d.delimiter)  # no row is read before the columns are checked
    check_columns(header, model.schema, origin)
    missing_keep = [c for c in d.keep_columns if c not in header]
    if missing_keep:
        raise ConfigError(f"data.keep_columns={list(d.keep_columns)!r} is not allowed: {origin} has no column(s) "
                          f"{', '.join(map(repr, missing_keep))}")
    wanted = [*model.schema.feature_columns, *[c for c in d.keep_columns if c not in model.schema.feature_columns]]
    df = read_table(table, columns=wanted, delimiter=d.delimiter, text_columns=model.schema.text_columns,
                    required=[*model.schema.declared_features, *(("data.keep_columns", c) for c in d.keep_columns)])
    return df, origin


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=predict: settings checked, model loaded, header checked, THEN the rows read, scored
    and written (module docstring). Returns 0.0 (a sweeper's objective has no meaning here; the
    number of rows scored is a count of private rows and is not returned)."""

    conf: PredictRunConfig = OmegaConf.to_object(cfg)
    validate_predict_run(conf)
    model = load_model(conf.run, trust_model_target=conf.trust_model_target)
    if Path(run_dir).resolve() == model.path.parent.resolve():
        raise ConfigError(f"hydra.run.dir={str(run_dir)!r} is not allowed: it is the training run folder of run="
                          f"{conf.run!r}; allowed: a new folder for the predictions (the default)")
    d, missing = conf.data, conf.predict.missing
    model = _with_number_format(model, d)
    df, origin = _read_rows(model, d)
    frame, counts = model._prediction_frame(df, list(d.keep_columns), origin, missing)
    if missing == "nan":  # PRIVATE counts: the file under private/ only; the console line holds none
        log.info("predict.missing=nan: a row with a missing, infinite or non-numeric entry in a numeric feature "
                 "column is kept with empty prediction columns; how many: private/%s (PRIVATE)", COUNTS)
    target = _write(RunFolder.of(run_dir), frame, model=model, public=d.public, origin=origin,
                    counts=counts if missing == "nan" else None)
    log.info("scored the rows of %s with %s; predictions in %s (%s; FILES.txt says why)", origin, model.path,
             target, "publishable: data.public=true" if d.public else "PRIVATE: computed from the rows given")
    return 0.0


def load_model(path: str | Path, *, trust_model_target: bool = False) -> Any:
    """Load a trained model (a run folder or its ``model.pt``) with its public feature encoder:
    a :class:`dptrain.tasks.predict.TrainedModel` whose ``predict(df)``, ``predict_proba(df)`` and
    ``decision_function(df)`` encode a DataFrame with the stored schema and score it. Read with
    ``weights_only=True``; a model whose ``_target_`` is not a dptrain builder is built only
    with ``trust_model_target=True``."""
    path = model_path_in(path)
    state = _read_model_file(path)
    schema = schema_from_dict(state["schema"], path)
    objective = build_objective(state["objective"])
    spec = schema.data_spec()
    try:
        objective.check_data(spec)  # and keeps the declared classes / target bounds for predictions
    except DPTrainError as err:
        raise CheckpointError(f"model file {path} is inconsistent: {err}") from None
    module = _build_module(state, path, objective=objective, spec=spec, trust_model_target=trust_model_target)
    return TrainedModel(module=module, schema=schema, objective=objective, guarantee=str(state["guarantee"]),
                        privacy=dict(state.get("privacy") or {}), path=path, table=state.get("coefficients"))
