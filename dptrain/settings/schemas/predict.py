"""The schema of task=predict; its checks: :mod:`dptrain.settings.predict`."""

from __future__ import annotations

from dataclasses import dataclass

from dptrain.core.validation import setting
from dptrain.settings.schemas.common import TASKS_ALLOWED, RunBase


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
