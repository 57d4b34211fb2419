"""``task=predict``: a trained run's model applied to new rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import (
    bad,
    flag,
    one_of,
    setting,
)
from dptrain.runfolder.tracking import MODEL_FILENAME, model_path_in
from dptrain.settings.common import TASKS_ALLOWED, RunBase, check_common
from dptrain.settings.data import check_delimiter


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
    keep_columns: list[str] = setting(help="input columns copied into the predictions (e.g. an id)",
                                      allowed="a list of column names of the file", factory=list)


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


def validate_predict(cfg: Any) -> None:
    """Value checks of a predict run, before any row is read: the run folder holds a model.pt,
    the rows' file is named."""
    run = cfg.run
    if not isinstance(run, str) or not run.strip():
        raise bad("run", run, "give the training run folder whose model.pt scores the rows: run=outputs/DATE/TIME")
    if not model_path_in(run).is_file():
        raise bad("run", run, f"the folder has no {MODEL_FILENAME}; allowed: a training run folder (task=train "
                  f"writes {MODEL_FILENAME} at its top level) or the path of a {MODEL_FILENAME}")
    d = cfg.data
    if not isinstance(d.path, str) or not d.path.strip():
        raise bad("data.path", d.path, "give the CSV, Parquet or .dta file of the rows to score")
    one_of("data.format", d.format, ("auto", "csv", "parquet", "dta"))
    check_delimiter(d.delimiter)
    flag("data.public", d.public)
    flag("trust_model_target", cfg.trust_model_target)
    flag("overwrite", cfg.overwrite)
    if not isinstance(d.keep_columns, (list, tuple)) or not all(isinstance(c, str) for c in d.keep_columns):
        raise bad("data.keep_columns", d.keep_columns, "must be a list of column names, e.g. [id]")


def validate_predict_run(cfg: Any) -> None:
    """Every setting of a ``task=predict`` run, once, before any row is read. Raises ConfigError."""
    check_common(cfg)
    validate_predict(cfg)
