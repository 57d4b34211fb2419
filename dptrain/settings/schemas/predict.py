"""The schema of task=predict; its checks: :mod:`dptrain.settings.predict`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dptrain.core.validation import setting
from dptrain.settings.schemas.common import TASKS_ALLOWED, RunBase
from dptrain.settings.schemas.data import DATA_SOURCES

#: predict.missing: what a row with a missing, infinite or non-numeric entry in a numeric feature column gets
MISSING = ("refuse", "nan")

_DECLARED = ("the model's declaration: task=predict encodes the rows with the one stored in run=...'s model.pt "
             "(features, bounds, labels, the target's labels); a different one needs a new model (task=train)")
_SPLIT = "task=predict splits nothing: every row of data.path is scored (data.public says whether they are public)"
_DECLARATION = ("schema", "target", "positive", "negative", "classes", "target_bounds", "exclude", "numeric",
                "categorical")
_GENERATED = ("a setting of a training data source (task=train's data=NAME), not of task=predict: the rows scored are "
              "read from data.path")
#: the training data sources' keys task=predict refuses, with why (the command line's refusal quotes it)
_NOT_FOR_SCORING = {
    "name": "task=predict reads one file, data.path (data.format: its format), whatever the model was trained on",
    "nonfinite": "a missing, infinite or non-numeric entry in a numeric feature column of the rows scored follows "
                 "predict.missing: refuse (the default) or nan (the row is scored as NaN and kept)",
    "unlisted": "a blank or an undeclared label in a categorical feature column is scored through that column's "
                "<other> slot, as data.unlisted=other encodes it in training",
    "label_map": "the model's stored data.label_map applies to the rows scored, as in training; " + _DECLARED,
    **dict.fromkeys(("split_column", "test_fraction", "split_key", "test_public"), _SPLIT),
    **dict.fromkeys(("cache", "sharding"), "not used when scoring: the rows of data.path are read once, in this "
                                           "process"),
}


@dataclass
class PredictDataConfig:
    """The new rows: a CSV / Parquet / .dta file holding the model's declared feature columns
    (the target is not needed; other columns are ignored)."""

    path: str | None = setting(None, help="the file of the rows to score (required); it needs every feature "
                               "column the model declares", allowed="a .csv, .csv.gz/.bz2/.xz, .parquet, .pq or "
                               ".dta file")
    format: str = setting("auto", help="file format; auto: from the file name's suffix",
                          allowed="auto | csv | parquet | dta")
    delimiter: str = setting(",", help="CSV field separator", allowed="one character other than a quote, a line "
                             "break or a space, e.g. ',' ';' or '\\t' (tab)")
    public: bool = setting(False, help="true only when the rows scored are PUBLIC: the predictions are then "
                           "publishable (predictions.csv at the top of the run folder); false: they are as private "
                           "as the rows (private/predictions.csv)", allowed="true | false")
    thousands: str | None = setting(None, help="the digit-group separator of the numbers in the rows' numeric "
                                    "columns, e.g. ',' for 60,366 (null: as the model's training file wrote them, "
                                    "stored in model.pt; '': none)", allowed="null | '' | one of ',' '.' ' ' \"'\" "
                                    "(an apostrophe), other than the decimal mark")
    decimal: str | None = setting(None, help="the decimal mark of the numbers in the rows' numeric columns (null: "
                                  "as the model's training file wrote them, stored in model.pt)",
                                  allowed="null | '.' | ','")
    keep_columns: list[str] = setting(help="input columns copied into the predictions (e.g. an id)",
                                      allowed="a list of column names of the file", factory=list)

    #: the training data sources' other keys, refused with why (dptrain.settings.command_line)
    REFUSED_KEYS: ClassVar[dict[str, str]] = {
        key: _NOT_FOR_SCORING.get(key, _DECLARED if key in _DECLARATION else _GENERATED)
        for source in DATA_SOURCES.values()
        for key in source.__dataclass_fields__ if key not in ("path", "format", "delimiter", "thousands", "decimal")}


@dataclass
class PredictOptions:
    """How task=predict scores the rows."""

    missing: str = setting("refuse", help="a row with a missing, infinite or non-numeric entry in a numeric feature "
                           "column: refuse (the file is refused, naming the column; no prediction is written) or nan "
                           "(the row is kept, its prediction columns empty (NaN); how many such rows, per column: "
                           "private/predict_counts.json, PRIVATE). A blank or undeclared label in a categorical "
                           "column is scored through its <other> slot under either", allowed="refuse | nan")


@dataclass
class PredictRunConfig(RunBase):
    """task=predict: the trained run folder (``run``, holding model.pt) and the new rows."""

    task: str = setting("predict", help="what the run does (a config group)",
                        allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="unused by predict (scoring draws no randomness)", allowed="an integer >= 0")
    run: str | None = setting(None, help="the training run whose model.pt scores the rows (required)",
                              allowed="a training run folder, or the path of its model.pt")
    trust_model_target: bool = setting(False, help="build a model whose model._target_ is not a dptrain.models "
                                       "builder (building it runs that code: only for a file you trust)",
                                       allowed="true | false")
    data: PredictDataConfig = setting(help="the rows to score", factory=PredictDataConfig)
    predict: PredictOptions = setting(help="how the rows are scored", factory=PredictOptions)
