"""``task=predict``: a trained run's model applied to new rows."""

from __future__ import annotations

from typing import Any

from dptrain.core.validation import (
    bad,
    flag,
    one_of,
)
from dptrain.runfolder.tracking import MODEL_FILENAME, model_path_in
from dptrain.settings.common import check_common
from dptrain.settings.data import check_delimiter
from dptrain.settings.schemas.predict import (  # the schemas: no torch, no pandas
    MISSING,  # noqa: F401
    PredictDataConfig,  # noqa: F401
    PredictOptions,  # noqa: F401
    PredictRunConfig,  # noqa: F401
)


def validate_predict(cfg: Any) -> None:
    """Value checks of a predict run, before any row is read: the run folder holds a model.pt,
    the rows' file is named (data.thousands / data.decimal are checked with the model's, which
    they override: :func:`dptrain.tasks.predict.run_task`)."""
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
    one_of("predict.missing", cfg.predict.missing, MISSING)
    flag("data.public", d.public)
    flag("trust_model_target", cfg.trust_model_target)
    flag("overwrite", cfg.overwrite)
    if not isinstance(d.keep_columns, (list, tuple)) or not all(isinstance(c, str) for c in d.keep_columns):
        raise bad("data.keep_columns", d.keep_columns, "must be a list of column names, e.g. [id]")


def validate_predict_run(cfg: Any) -> None:
    """Every setting of a ``task=predict`` run, once, before any row is read. Raises ConfigError."""
    check_common(cfg)
    validate_predict(cfg)
