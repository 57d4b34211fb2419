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
``objective=binary`` the score (logit), the probability of label 1 and the predicted 0/1 label;
for ``multinomial`` one probability ``p_<class>`` per declared class and the predicted class's
name (``label``); for ``linear`` the ``prediction`` in the target's original units.
The predictions are computed from the rows given, so they are exactly as private as those rows:
``private/predictions.csv`` unless ``data.public=true`` declares the rows public (then
``predictions.csv`` at the top, publishable). The model's guarantee protects its TRAINING rows
only; it says nothing about the rows scored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError
from dptrain.data.encoding import encode_features, numbers_of
from dptrain.data.files import DataError, locate
from dptrain.data.reading import read_header, read_table
from dptrain.data.schema import Schema
from dptrain.inference.coefficients import linear_layer
from dptrain.models.objectives import build_objective
from dptrain.runfolder.folder import RunFolder
from dptrain.runfolder.tracking import MODEL_FILENAME, finite_epsilon, model_path_in  # noqa: F401
from dptrain.settings.predict import PredictDataConfig, PredictRunConfig, validate_predict, validate_predict_run
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

    def encode(self, rows: Any, *, origin: str = "the rows") -> np.ndarray:
        """The rows encoded with the model's public schema (float32, one row per input row).
        Missing declared columns and non-finite numeric entries are refused by name."""

        df = _frame(rows, origin)
        check_columns(list(df.columns), self.schema, origin)
        numeric = {}
        for spec in self.schema.numeric:  # numbers written as the training file wrote them (data.thousands / decimal)
            v, text = numbers_of(df[spec.name], self.schema)
            if text is not None:
                raise DataError(f"data.numeric.{spec.name}: column {spec.name!r} of {origin} has non-numeric entries; "
                                "allowed: numbers (written as the model's training file wrote them)")
            if not np.isfinite(v).all():
                raise DataError(f"data.numeric.{spec.name}: column {spec.name!r} of {origin} has missing or "
                                "non-finite entries; allowed: a finite number in every row to score")
            numeric[spec.name] = v
        return encode_features(df, self.schema, None, numeric)

    def decision_function(self, rows: Any) -> np.ndarray:
        """The model's output per row (float64): for objective=binary the logit of label 1, for
        multinomial the K class scores (n, K), for linear the prediction on the [0, 1] scale."""
        with torch.no_grad():
            x = torch.from_numpy(self.encode(rows))
            return self.module(x).double().numpy()

    def _columns(self, rows: Any) -> dict[str, Any]:
        if not hasattr(self.objective, "prediction_columns"):
            raise DPTrainError(f"this model's objective {getattr(self.objective, 'name', '?')!r} defines no "
                               "prediction_columns: use decision_function")
        return self.objective.prediction_columns(torch.from_numpy(self.decision_function(rows)))

    def predict_proba(self, rows: Any) -> np.ndarray:
        """Classifiers: (n, 2) P(label 0), P(label 1) (binary) or (n, K) one probability per
        declared class (multinomial), in ``classes_`` order."""
        name = getattr(self.objective, "name", None)
        if name not in ("binary", "multinomial"):
            raise DPTrainError(f"predict_proba needs objective=binary or multinomial; this model's objective is "
                               f"{name!r}: use predict")
        cols = self._columns(rows)
        if name == "binary":
            return np.column_stack([1.0 - cols["probability"], cols["probability"]])
        return np.column_stack([cols[f"p_{c}"] for c in self.objective.class_names])

    def predict(self, rows: Any) -> np.ndarray:
        """Per row: binary the 0/1 label (1: logit > 0, as the training metrics count);
        multinomial the declared name of the most probable class; linear the prediction in the
        target's original units."""
        cols = self._columns(rows)
        return np.asarray(cols["prediction"] if "prediction" in cols else cols["label"])

    def prediction_frame(self, rows: Any, *, keep: list[str] | tuple[str, ...] = (),
                         origin: str = "the rows") -> pd.DataFrame:
        """One row per input row: the ``keep`` columns as given, then the objective's columns
        (binary: ``score``, ``probability`` of label 1, ``label`` 0/1; multinomial: ``p_<class>``
        per declared class, ``label``; linear: ``prediction`` in original units)."""
        df = _frame(rows, origin)
        cols = self._columns(df)
        out = pd.DataFrame({c: df[c].to_numpy() for c in keep})
        for name, values in cols.items():
            out[name] = values
        return out


# ------------------------------------------------------------------------------ task=predict


def _write(folder: RunFolder, frame: pd.DataFrame, *, model: TrainedModel, public: bool, origin: str) -> Path:
    """The predictions, publishable (``public``: the rows are declared public) or private, and
    FILES.txt of a predict run; returns where the predictions went."""
    what = {"binary": "score = logit, probability of label 1, label 0/1",
            "multinomial": "p_<class> = the probability of each declared class, label = the most probable class",
            "linear": "prediction, in the target's original units"}.get(getattr(model.objective, "name", None),
                                                                        "the objective's prediction columns")
    what = f"one prediction per row of {origin} ({what}), computed from those rows"
    if public:
        target = folder.write_text(PREDICTIONS, frame.to_csv(index=False),
                                   what + ": the rows are declared public (data.public=true)")
    else:
        target = folder.write_text(PREDICTIONS, frame.to_csv(index=False),
                                   what + ": as private as those rows (data.public=false)", private=True)
    guarantee = (f"none for the rows scored: the predictions are a function of the rows in {origin}. The model "
                 f"({model.path}) protects its TRAINING rows only: {model.guarantee}")
    covered = public and bool(model.privacy.get("private")) and finite_epsilon(model.privacy.get("epsilon"))
    folder.finish(guarantee=guarantee, finite_guarantee=covered)
    return target


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
    d = conf.data
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
    frame = model.prediction_frame(df, keep=list(d.keep_columns), origin=origin)
    target = _write(RunFolder.of(run_dir), frame, model=model, public=d.public, origin=origin)
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
