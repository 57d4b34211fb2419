"""Validated configuration: one schema per task, each section's checks next to its settings.

A run's config holds only its own task's sections: ``task=train`` (the default) composes
``conf/task/train.yaml`` (data, model, optim, objective, privacy, trainer, logger), ``task=audit``
adds ``audit``, ``task=release`` composes data, release and the noise seed file only. The data
section has one schema per source (``data=adult | table | synthetic | atlas``), so a run's
config shows only its own source's keys. Three layers of checking, all before any private row
is read:

1. *Compose time* (Hydra + OmegaConf structured configs): the task's dataclass below is the
   schema of its config, so a misspelt key (``privacy.nois_multiplier``), a wrong type
   (``trainer.epochs=abc``) or another task's section (``model=mlp`` in a release) fails while
   the config is composed.
2. *Known keys* (:func:`unknown_settings`): a key added with ``+`` or ``++`` passes Hydra, so the
   composed config is walked against the schema and any key the schema does not have is
   refused, with the closest valid key suggested (``model`` and ``optim`` are free-form).
3. *Value checks* (:func:`validate`, one pass): each section's ``check_*`` function, next to its
   dataclass; names of extensions (accountant, engine, objective, release method) are checked
   against their registries. They raise :class:`ConfigError`, whose message names the setting,
   the value and what is allowed.

Every setting's meaning and allowed values are field metadata (:func:`dptrain.validation.setting`);
``scripts/settings_reference.py`` writes docs/settings.md from them.

Checks that need the training-set size N (``delta < 1/N``, ``batch_size <= N``) run in
:func:`validate_against_size`, which needs only N: the row count is public in our model (the
accountant's q = B/N uses it), so reading it is not a leak.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dptrain.inference.settings import EstimatorConfig
from dptrain.privacy.accounting import ACCOUNTANTS, SIGMA_RANGE
from dptrain.release.settings import DomainConfig, ReleaseConfig, validate_release  # noqa: F401
from dptrain.tracking import MODEL_FILENAME, model_path_in
from dptrain.validation import (
    ConfigError,
    bad,
    closest,
    finite_positive,
    flag,
    integer,
    is_finite,
    is_real,
    one_of,
    real,
    setting,
)

__all__ = ["DATA_SOURCES", "AuditConfig", "AuditRunConfig", "Config", "ConfigError", "DataConfig", "NumericColumn",
           "ObjectiveConfig", "PredictDataConfig", "PredictRunConfig", "PrivacyConfig", "ReleaseRunConfig",
           "TargetBounds", "TrainRunConfig", "TrainerConfig", "check_tune", "default_delta", "flatten_space",
           "validate_predict", "register_configs", "unknown_settings", "validate", "validate_against_size"]

# ------------------------------------------------------------------------------ data

TEST_PUBLIC_HELP = ("true only when the test rows are PUBLIC data (a published benchmark split, generated data): "
                    "then test metrics are publishable (metrics.json); otherwise they stay in private/")


@dataclass
class NumericColumn:
    """A numeric feature with PUBLIC bounds: values are clipped into [lower, upper], then
    scaled to [0, 1] by those bounds. ``transform: log1p`` applies log(1 + x) after clipping
    (both bounds transformed too), useful for heavy-tailed money columns. Both bounds are
    required: there is no default range."""

    lower: float | None = setting(None, help="PUBLIC lower bound (documentation, domain knowledge; never the rows): "
                                  "smaller values are clipped up to it", allowed="a finite number < upper (required)")
    upper: float | None = setting(None, help="PUBLIC upper bound: larger values are clipped down to it",
                                  allowed="a finite number > lower (required)")
    transform: str = setting("none", help="log1p: log(1 + x) after clipping (bounds too), for heavy tails",
                             allowed="none | log1p (log1p needs lower > -1)")


@dataclass
class TargetBounds:
    """The PUBLIC bounds of a continuous target (``data.target_bounds``): values are clipped into
    [lower, upper] (how many: private/data_diagnostics.json) and scaled to [0, 1] by them for
    training; metrics and predictions are reported back in the original units. Both null (the
    default) declares no continuous target."""

    lower: float | None = setting(None, help="PUBLIC lower bound of the target (documentation, domain knowledge; "
                                  "never the rows)", allowed="a finite number < upper (required with upper)")
    upper: float | None = setting(None, help="PUBLIC upper bound of the target",
                                  allowed="a finite number > lower (required with lower)")


CLASSES_HELP = ("a multiclass target's PUBLIC class list (objective=multinomial): label i is the i-th class; a row "
                "whose label is not declared (or is missing) is refused")
CLASSES_ALLOWED = "a list of at least 2 distinct labels (strings or numbers) | null"
BOUNDS_HELP = ("a continuous target's PUBLIC bounds (objective=linear), e.g. {lower: 1, upper: 99}: the target is "
               "clipped into them and scaled to [0, 1] for training; metrics and predictions in original units")
BOUNDS_ALLOWED = "{lower: L, upper: U} with finite L < U; both null (the default): no continuous target"


@dataclass
class AdultDataConfig:
    """data=adult: the shipped UCI Adult file (SHA-256 checked) with its public UCI schema."""

    name: str = setting("adult", help="the data source; pick it with data=adult (a config group)", allowed="adult")
    schema: str = setting("adult", help="the shipped public schema: target income (label 1: >50K), the original "
                          "UCI split, 5 numeric columns with documented bounds and 8 categorical columns (112 "
                          "features); the file dptrain/data/adult/schema.yaml", allowed="adult")
    test_public: bool = setting(True, help=TEST_PUBLIC_HELP + " (the UCI test file is public)",
                                allowed="true | false")
    target: str | None = setting(None, help="another column of the Adult file as the target (null: the schema's "
                                 "income); it is removed from the features. Declare its kind with data.classes, "
                                 "data.target_bounds or data.positive", allowed="a column of the Adult file | null")
    positive: str | None = setting(None, help="a binary target's positive label (with data.target; null: the "
                                   "schema's >50K for income)", allowed="a label of the target column | null")
    classes: list[Any] | None = setting(None, help=CLASSES_HELP + ", e.g. relationship's six documented categories",
                                        allowed=CLASSES_ALLOWED)
    target_bounds: TargetBounds | None = setting(help=BOUNDS_HELP, allowed=BOUNDS_ALLOWED, factory=TargetBounds)


@dataclass
class TableDataConfig:
    """data=table: your own CSV / Parquet / Stata file and the PUBLIC schema you declare for it."""

    name: str = setting("table", help="the data source; pick it with data=table (a config group)", allowed="table")
    path: str | None = setting(None, help="the file to read (required)",
                               allowed="a .csv, .csv.gz/.bz2/.xz, .parquet, .pq or .dta file, or a folder of "
                               "Parquet files")
    format: str = setting("auto", help="file format; auto: from the file name's suffix",
                          allowed="auto | csv | parquet | dta")
    delimiter: str = setting(",", help="CSV field separator", allowed="one character other than a quote, a line "
                             "break or a space, e.g. ',' ';' or '\\t' (tab)")
    target: str = setting("", help="the label column (required)", allowed="a column of the file")
    positive: str | None = setting(None, help="the label of the positive class: rows whose target equals it get "
                                   "label 1, all others 0; null: the target column must already be numeric 0/1",
                                   allowed="a label of the target column (compared as numbers when both are "
                                   "numeric, else as stripped strings) | null")
    classes: list[Any] | None = setting(None, help=CLASSES_HELP, allowed=CLASSES_ALLOWED)
    target_bounds: TargetBounds | None = setting(help=BOUNDS_HELP, allowed=BOUNDS_ALLOWED, factory=TargetBounds)
    numeric: dict[str, NumericColumn] = setting(
        help="numeric feature columns with PUBLIC bounds, e.g. {age: {lower: 17, upper: 90}}; values are clipped "
        "into [lower, upper] (how many were clipped goes to private/data_diagnostics.json) and scaled to [0, 1]",
        allowed="column: {lower: L, upper: U[, transform: log1p]} (lower and upper required)", factory=dict)
    categorical: dict[str, list[Any]] = setting(
        help="categorical feature columns with their PUBLIC labels, one-hot encoded plus an 'other' slot for "
        "anything else (missing values included), e.g. {sex: [Female, Male]}", allowed="column: [label, ...]; "
        "integer codes may be written as numbers ([1, 2, 3]) and match a numeric column stored as 1.0, 2.0, ...; "
        "quote codes with leading zeros (['01', '02']) when the column holds text", factory=dict)
    nonfinite: str = setting("error", help="NaN / inf / missing values in a numeric column: refuse the file, or "
                             "drop those rows (each row on its own)", allowed="error | drop")
    split_column: str | None = setting(None, help="a column holding train / test; null: each row goes to the test "
                                       "part when a keyed hash of its own content (key from seed) is below "
                                       "test_fraction", allowed="a column of the file | null")
    test_fraction: float = setting(0.25, help="share of rows in the test part of the per-row hash split (about, not "
                                   "exactly)", allowed="a number in (0, 1)")
    test_public: bool = setting(False, help=TEST_PUBLIC_HELP, allowed="true | false")
    sharding: str = setting("auto", help="trainer.distributed=true on a partitioned Parquet data set (a folder of "
                            "Parquet files, or a file with several row groups): each process reads only its own "
                            "row groups (docs/distributed.md); auto: when the data set has at least 2 row groups; "
                            "row_groups: always (refused when it cannot); off: every process reads the whole table",
                            allowed="auto | row_groups | off")


@dataclass
class SyntheticDataConfig:
    """data=synthetic: seeded generated data (tests, smoke runs): features x0..x{n-1} uniform in
    [-1, 1], label y ~ Bernoulli(sigmoid(w'x)) with weights w drawn from the same seed."""

    name: str = setting("synthetic", help="the data source; pick it with data=synthetic (a config group)",
                        allowed="synthetic")
    n_rows: int = setting(4000, help="rows generated (seeded by the run's seed)", allowed="an integer >= 2")
    n_features: int = setting(10, help="feature columns x0..x{n_features-1}", allowed="an integer >= 1")
    numeric: dict[str, NumericColumn] = setting(
        help="bounds of generated columns; a column not listed gets the generator's range [-1, 1]",
        allowed="x<i>: {lower: L, upper: U}", factory=dict)
    test_fraction: float = setting(0.25, help="share of rows in the test part (per-row hash split)",
                                   allowed="a number in (0, 1)")
    test_public: bool = setting(True, help=TEST_PUBLIC_HELP + " (generated rows are nobody's data)",
                                allowed="true | false")


@dataclass
class AtlasDataConfig:
    """data=atlas (task=release): simulated Opportunity-Atlas-like cells, seeded by the run's seed;
    x and y are percentile ranks in the public domain [0, 1]."""

    name: str = setting("atlas", help="the data source; pick it with data=atlas (a config group)", allowed="atlas")
    generator: str = setting("atlas", help="atlas: skewed cell sizes, a cell covariate, 20 states; figure2: the "
                             "paper's Figure 2 design (3 cells for each N = 20..299)", allowed="atlas | figure2")
    n_cells: int = setting(2000, help="cells simulated (generator=atlas)", allowed="an integer >= 2")


#: data source name -> its schema (conf/data/NAME.yaml extends /schema/data/NAME)
DATA_SOURCES: dict[str, type] = {"adult": AdultDataConfig, "table": TableDataConfig,
                                 "synthetic": SyntheticDataConfig, "atlas": AtlasDataConfig}


@dataclass
class DataConfig:
    """Every data setting in one class, for Python callers (``load_dataset(DataConfig(...))``)
    and for reading old run folders; a composed run uses its source's own schema above.

    ``name``: ``adult`` (shipped UCI Adult), ``table`` (the user's CSV / Parquet / .dta file),
    ``synthetic`` (seeded generator for tests) or, for releases, ``atlas`` (simulated cells).
    ``schema``: a shipped public schema by name (``adult``), used instead of the declarations.
    Numeric bounds and category lists are public declarations: nothing is fitted on private rows.
    """

    name: str = "adult"
    schema: str | None = None
    path: str | None = None
    format: str = "auto"  # auto | csv | parquet | dta
    delimiter: str = ","
    target: str = "income"
    positive: str | None = None  # label of the positive class (binary target)
    classes: list[Any] | None = None  # a multiclass target's declared classes
    target_bounds: TargetBounds | None = None  # a continuous target's declared bounds
    numeric: dict[str, NumericColumn] = field(default_factory=dict)
    categorical: dict[str, list[Any]] = field(default_factory=dict)
    nonfinite: str = "error"  # error | drop : policy for NaN / inf in numeric columns
    split_column: str | None = None  # column holding "train"/"test"; else a per-row hash split
    test_fraction: float = 0.25
    test_public: bool = False
    sharding: str = "auto"  # table only: auto | row_groups | off (dptrain.data.shards)
    n_rows: int = 20000  # synthetic only
    n_features: int = 10  # synthetic only
    generator: str = "atlas"  # atlas only: atlas | figure2
    n_cells: int = 2000  # atlas only


TRAIN_DATA = ("adult", "table", "synthetic")


def check_source(d: Any, allowed: tuple[str, ...], purpose: str) -> None:
    """``data.name`` is one of ``allowed`` and matches the source's own schema (data=NAME picks
    both: ``data.name=table`` on top of ``data=adult`` would read Adult's keys as a table's)."""
    one_of("data", d.name, allowed)
    for name, schema in DATA_SOURCES.items():
        if isinstance(d, schema) and d.name != name:
            raise bad("data.name", d.name, f"the source is chosen with the config group data={d.name} (this config "
                      f"was composed from data={name}, whose keys differ); allowed for {purpose}: "
                      + ", ".join(f"data={a}" for a in allowed))


def as_source(d: Any) -> Any:
    """A data section given as a plain mapping (a data config of the user's own --config-dir
    without ``defaults: [/schema/data/NAME@_here_]``) as its source's dataclass, so that its keys
    are checked like a shipped source's; anything else unchanged."""
    if not isinstance(d, Mapping):
        return d
    name = d.get("name")
    one_of("data.name", name, tuple(DATA_SOURCES))
    schema = DATA_SOURCES[name]
    names = [f.name for f in dataclasses.fields(schema)]
    extra = [k for k in d if k not in names]
    if extra:
        raise bad(f"data.{extra[0]}", d[extra[0]], f"not a setting of data={name}; allowed: {', '.join(names)}")
    values = dict(d)
    try:
        if isinstance(values.get("numeric"), Mapping):
            values["numeric"] = {k: NumericColumn(**v) if isinstance(v, Mapping) else v
                                 for k, v in values["numeric"].items()}
        if isinstance(values.get("target_bounds"), Mapping):
            values["target_bounds"] = TargetBounds(**values["target_bounds"])
        return schema(**values)
    except TypeError as err:  # an unknown key of a numeric column
        raise bad("data.numeric", values.get("numeric"), f"each column takes lower, upper, transform ({err})") from None


def check_data(d: Any) -> None:
    """The data settings of a training run; the schema itself is checked by the data module's
    own parser (the one place that reads it), before any row is read."""
    from dptrain.data import schema_from_config

    if d.name == "atlas":
        raise bad("data", d.name, "simulated Atlas cells are for task=release (experiment=mos_atlas)")
    check_source(d, TRAIN_DATA, "training")
    path = getattr(d, "path", None)
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise bad("data.path", path, "must be the path of a CSV, Parquet or .dta file (or null)")
    if d.name == "table" and not path:
        raise bad("data.path", path, "data=table needs the path of a CSV, Parquet or .dta file")
    one_of("data.format", getattr(d, "format", "auto"), ("auto", "csv", "parquet", "dta"))
    check_delimiter(getattr(d, "delimiter", ","))
    one_of("data.nonfinite", getattr(d, "nonfinite", "error"), ("error", "drop"))
    real("data.test_fraction", getattr(d, "test_fraction", 0.25), "must be a number in (0, 1)", lo=0, hi=1,
         lo_open=True, hi_open=True)
    flag("data.test_public", d.test_public)
    one_of("data.sharding", getattr(d, "sharding", "auto"), ("auto", "row_groups", "off"))
    if not isinstance(getattr(d, "numeric", {}), Mapping) or not isinstance(getattr(d, "categorical", {}), Mapping):
        raise bad("data.numeric/data.categorical", (d.numeric, d.categorical),
                  "must map column names to {lower: ..., upper: ...} / to lists of category labels")
    schema_from_config(d)


def check_delimiter(delimiter: Any) -> None:
    """``data.delimiter``: one character that can separate CSV fields (``\\t`` or ``tab``: a tab)."""
    from dptrain.data.table import delimiter_char

    delimiter_char(delimiter)


# ------------------------------------------------------------------------------ model, optimiser


def _build_error(setting_name: str, value: Any, exc: BaseException, allowed: str) -> ConfigError:
    import re

    cause = exc
    while cause.__cause__ is not None:  # Hydra wraps the constructor's own error
        cause = cause.__cause__
    extra = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
    if extra:  # e.g. optim._target_=torch.optim.AdamW with a leftover key of another optimiser
        key = f"{setting_name}.{extra.group(1)}"
        return ConfigError(f"{key}={value.get(extra.group(1))!r} is not allowed: {value.get('_target_')} takes no "
                           f"argument {extra.group(1)!r}; drop it with ~{key} on the command line; allowed: {allowed}")
    return ConfigError(f"{setting_name}={value!r} is not allowed: {type(cause).__name__}: {cause}; allowed: {allowed}")


def check_model(model: Any) -> None:
    """``model``: a mapping with ``_target_`` (model=logit | mlp); an MLP's ``hidden`` widths are
    integers > 0. The model is built once with tiny widths so that a bad argument (an unknown
    activation, an unknown key) is refused here and not after the data is read."""
    if not isinstance(model, Mapping) or not isinstance(model.get("_target_"), str):
        raise bad("model", model, "choose a model: model=logit or model=mlp (a mapping with _target_)")
    probe = dict(model)
    if "hidden" in model:
        hidden = model["hidden"]
        if not isinstance(hidden, (list, tuple)) or any(
                isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in hidden):
            raise bad("model.hidden", hidden, "must be a list of integer layer widths > 0, e.g. [64, 64]")
        probe["hidden"] = [1] * len(hidden)
    try:
        from hydra.utils import instantiate

        instantiate(OmegaConf.create(probe), in_features=1)
    except Exception as exc:  # noqa: BLE001 - any failure to build is a bad setting
        raise _build_error("model", dict(model), exc, "arguments that the model's _target_ accepts "
                           "(model.hidden: widths > 0; model.activation: relu, tanh, gelu, silu, elu, "
                           "leaky_relu)") from None


def check_optim(optim: Any) -> None:
    """``optim``: a mapping with ``_target_`` (a torch.optim class) and ``_partial_: true``;
    ``lr`` a finite number > 0. The optimiser is built once on a dummy parameter, so torch's own
    checks (momentum, betas, weight decay, ...) are refused here, by name."""
    if not isinstance(optim, Mapping) or not isinstance(optim.get("_target_"), str):
        raise bad("optim", optim, "choose an optimiser: optim=sgd or optim=adam (a mapping with _target_)")
    if "lr" in optim:
        real("optim.lr", optim["lr"], "must be a finite number > 0 (the learning rate)", lo=0, lo_open=True)
    if optim.get("_partial_") is not True:
        raise bad("optim._partial_", optim.get("_partial_"), "must be true (the parameters are passed at build time)")
    try:
        import torch

        from dptrain.optimizers import build_optimizer

        build_optimizer(optim, [torch.nn.Parameter(torch.zeros(1))])
    except Exception as exc:  # noqa: BLE001 - any failure to build is a bad setting
        raise _build_error("optim", dict(optim), exc, f"arguments that {optim['_target_']} accepts") from None


# ------------------------------------------------------------------------------ objective


@dataclass
class ObjectiveConfig:
    """What the model predicts and how it is scored (``objective=NAME``; dptrain.objectives)."""

    name: str = setting("binary", help="the objective: binary = one logit, binary cross-entropy, test metrics acc, "
                        "loss, auc; multinomial = K class scores (data.classes), softmax cross-entropy, test metrics "
                        "acc, loss, macro one-vs-rest auc; linear = one output, squared error on a continuous target "
                        "(data.target_bounds), test metrics rmse, r2, mae, loss",
                        allowed="binary | multinomial | linear, or a name a plugin registers in "
                        "dptrain.objectives.OBJECTIVES")


def check_objective(o: ObjectiveConfig) -> None:
    from dptrain.objectives import OBJECTIVES

    OBJECTIVES.get(o.name)


# ------------------------------------------------------------------------------ privacy


@dataclass
class PrivacyConfig:
    """DP-SGD settings (docs/privacy.md).

    Exactly one of ``noise_multiplier`` (sigma) and ``target_epsilon`` must be set when
    ``enabled``. ``delta: null`` picks a default well below 1/N (see :func:`default_delta`).
    ``accountant`` names the accountant that produces the headline epsilon and calibrates
    sigma; RDP and PLD are always reported.
    """

    enabled: bool = setting(True, help="train with DP-SGD; false trains without privacy (no clipping, no noise, "
                            "no epsilon) and says so; the other privacy settings must then be left unset",
                            allowed="true | false")
    noise_multiplier: float | None = setting(
        None, help="sigma: the Gaussian noise's standard deviation is sigma * C; a preset's sigma steps aside when "
        "target_epsilon is set", allowed=f"0 (no noise, NO guarantee) or a number in [{SIGMA_RANGE[0]:g}, "
        f"{SIGMA_RANGE[1]:g}]; exactly one of noise_multiplier and target_epsilon")
    target_epsilon: float | None = setting(None, help="calibrate sigma so that the run ends at this epsilon",
                                           allowed="a number in (0, 100] | null")
    max_grad_norm: float = setting(1.0, help="C: each example's gradient is clipped to this L2 norm (flat, over all "
                                   "parameters)", allowed="a number in [1e-06, 1e+06]")
    delta: float | None = setting(None, help="delta of (epsilon, delta)-DP; null: the largest power of ten <= "
                                  "1/(10 N)", allowed="a number in (0, 1/N) | null")
    accountant: str = setting("rdp", help="the accountant of the headline epsilon and of calibration (RDP and PLD "
                              "are both always reported)", allowed="rdp | pld, or a name a plugin registers")
    calibration_rtol: float = setting(1e-3, help="relative tolerance on sigma when calibrating to target_epsilon",
                                      allowed="a number in (0, 0.1)")
    max_epsilon: float | None = setting(None, help="a budget: training stops at the last step whose epsilon "
                                        "(headline accountant) is <= it", allowed="a number > 0 | null")
    noise_seed_file: str | None = setting(
        None, help="opt-in reproducible noise: a secret file (python -m dptrain.privacy.randomness PATH) from which "
        "the noise and the sampler are derived; null: fresh from the OS CSPRNG for every run",
        allowed="the path of a secret file outside the run folder | null")


MAX_TARGET_EPSILON = 100.0  # privacy.target_epsilon
GRAD_NORM_RANGE = (1e-6, 1e6)  # privacy.max_grad_norm (C and sigma * C stay far inside float32)


def check_noise_seed_file(path: Any) -> None:
    if path is not None and not (isinstance(path, str) and path.strip()):
        raise bad("privacy.noise_seed_file", path, "must be null or the path of a secret seed file")


def check_privacy(p: PrivacyConfig) -> None:
    """Ranges a run's numerics are built for (float32 training, the accountants' domain), and
    exactly one of sigma / target epsilon."""
    flag("privacy.enabled", p.enabled)
    ACCOUNTANTS.get(p.accountant)
    check_noise_seed_file(p.noise_seed_file)
    if not p.enabled:
        for name in ("target_epsilon", "max_epsilon"):
            if getattr(p, name) is not None:
                raise bad(f"privacy.{name}", getattr(p, name), "has no effect with privacy.enabled=false (the run "
                          f"trains without privacy); allowed: drop it (privacy.{name}=null), or train privately "
                          "(privacy=dp, e.g. experiment=logit)")
        return
    s, (lo, hi) = p.noise_multiplier, SIGMA_RANGE
    if s is not None and not (is_real(s) and is_finite(s) and (s == 0 or lo <= s <= hi)):
        raise bad("privacy.noise_multiplier", s,
                  f"must be 0 (no noise: epsilon = inf, NO guarantee) or a number in [{lo:g}, {hi:g}] "
                  "(the range the accountants and float32 training handle; calibration searches it too)")
    if p.target_epsilon is not None:
        real("privacy.target_epsilon", p.target_epsilon,
             f"must be a number in (0, {MAX_TARGET_EPSILON:g}] (an epsilon above {MAX_TARGET_EPSILON:g} protects "
             "nothing; privacy.enabled=false trains without privacy and says so)", lo=0, hi=MAX_TARGET_EPSILON,
             lo_open=True)
    if (s is None) == (p.target_epsilon is None):
        raise ConfigError(
            f"privacy.noise_multiplier={s!r} and privacy.target_epsilon={p.target_epsilon!r}: set exactly one of "
            "them when privacy.enabled=true (a preset's default sigma steps aside for privacy.target_epsilon=E; an "
            "explicit sigma needs privacy.target_epsilon=null)")
    lo, hi = GRAD_NORM_RANGE
    real("privacy.max_grad_norm", p.max_grad_norm,
         f"must be a number in [{lo:g}, {hi:g}] (the per-example clipping norm C > 0)", lo=lo, hi=hi)
    if p.delta is not None:
        real("privacy.delta", p.delta, "must be in (0, 1/N) (or null for the default)", lo=0, hi=1, lo_open=True,
             hi_open=True)
    real("privacy.calibration_rtol", p.calibration_rtol, "must be in (0, 0.1)", lo=0, hi=0.1, lo_open=True,
         hi_open=True)
    if p.max_epsilon is not None:
        finite_positive("privacy.max_epsilon", p.max_epsilon)


# ------------------------------------------------------------------------------ trainer, logger


@dataclass
class TrainerConfig:
    """The training loop. ``batch_size`` is the EXPECTED batch size B of Poisson sampling
    (q = B / N); ``epochs`` may be fractional (steps = round(epochs / q))."""

    epochs: float = setting(5.0, help="passes over the data; steps = round(epochs * N / batch_size)",
                            allowed="a number > 0 (at most 10,000,000 steps)")
    batch_size: int = setting(1024, help="the EXPECTED batch size B of Poisson sampling (q = B / N)",
                              allowed="an integer in [1, N]")
    engine: str = setting("auto", help="how clipped per-example gradients are computed: auto = the fast engine "
                          "when the model allows, else Opacus", allowed="auto | fast | opacus, or a registered name")
    eval_every: int = setting(50, help="steps between test-set evaluations", allowed="an integer > 0")
    log_every: int = setting(10, help="steps between TensorBoard scalars (with trainer.dp_curves, also between "
                             "releases of the dp/ curve, each paid for in epsilon)", allowed="an integer > 0")
    baseline: bool = setting(False, help="also fit a NON-private sklearn baseline on the same features (its "
                             "numbers stay in private/); off by default: it imports scikit-learn and "
                             "scipy.stats (about a second) and fits on every training row",
                             allowed="true | false")
    progress: bool = setting(True, help="show a progress bar", allowed="true | false")
    threads: int = setting(0, help="torch threads; 0 leaves torch's default", allowed="an integer >= 0")
    checkpoint_every: int = setting(100, help="steps between crash-safe checkpoints (one is always written at the "
                                    "end)", allowed="an integer >= 0 (0: only at the end)")
    resume: str | None = setting(None, help="continue a run from its checkpoint (auto: this run folder's, if any)",
                                 allowed="null (a fresh run) | auto | the path of a checkpoint or run folder")
    distributed: bool = setting(False, help="one job across torchrun processes (torchrun ... -m dptrain ... "
                                "trainer.distributed=true); gloo on the CPU, NCCL on GPUs", allowed="true | false")
    device: str = setting("auto", help="where the model, the rows, the Poisson sampler and the noise live: auto = "
                          "the first CUDA device when torch sees one (cuda:LOCAL_RANK in a distributed run), else "
                          "the CPU (docs/devices.md)", allowed="auto | cpu | cuda | cuda:N")
    cuda_graph: bool = setting(True, help="on a CUDA device, replay each step that logs nothing as one CUDA graph "
                               "over a fixed number of rows, B + 3 sqrt(B) + 8, the batch padded with rows of weight "
                               "0 (a larger batch and the logged steps run as usual): the same mechanism with far "
                               "less host work per step; no effect on the CPU, with the Opacus engine or in a "
                               "distributed run (docs/devices.md)", allowed="true | false")
    dp_curves: bool = setting(True, help="log dp/train_loss on the logged steps: the training loss released with "
                              "Gaussian noise, its privacy cost included in epsilon (docs/privacy.md, 'DP curves'); "
                              "no effect without privacy, in task=audit or on subsample_aggregate's parts",
                              allowed="true | false")
    curve_loss_bound: float | None = setting(None, help="L of the dp/ curve: each example's loss is clipped into "
                                             "[0, L] (the curve's sensitivity); null: the objective's default "
                                             "(binary 2, multinomial log(K) + 1, linear 0.5)",
                                             allowed="a finite number > 0 | null")
    curve_budget_share: float = setting(0.05, help="the share of the run's epsilon the dp/ curve may take (with "
                                        "privacy.target_epsilon the gradients get the rest; with an explicit "
                                        "noise_multiplier it comes on top)", allowed="a number in (0, 0.5]")


MAX_STEPS = 10_000_000  # steps = round(epochs * N / B): the training loop and the accountants


def check_curves(cfg: Any) -> None:
    """A private run with the dp/ curve needs a loss bound: ``trainer.curve_loss_bound`` or the
    objective's default (a plugin objective may declare none)."""
    from dptrain.objectives import build_objective
    from dptrain.privacy.curves import resolve_loss_bound

    t = cfg.trainer
    if cfg.privacy.enabled and t.dp_curves and t.curve_loss_bound is None:
        objective = build_objective(cfg.objective)
        if getattr(objective, "curve_loss_bound", None) is None:
            resolve_loss_bound(t, objective, None)  # raises, naming the setting


def check_trainer(t: TrainerConfig) -> None:
    from dptrain.privacy.engine import ENGINES

    real("trainer.epochs", t.epochs,
         f"must be a finite number > 0 (and give at most {MAX_STEPS:,} steps = epochs * N / B)", lo=0, lo_open=True)
    integer("trainer.batch_size", t.batch_size, 1, "must be an integer > 0 (and <= N)")
    integer("trainer.eval_every", t.eval_every, 1, "must be an integer > 0")
    integer("trainer.log_every", t.log_every, 1, "must be an integer > 0")
    integer("trainer.threads", t.threads, 0, "must be an integer >= 0 (0 = torch default)")
    integer("trainer.checkpoint_every", t.checkpoint_every, 0, "must be an integer >= 0 (0: only at the end)")
    for name in ("baseline", "progress", "distributed", "dp_curves"):
        flag(f"trainer.{name}", getattr(t, name))
    if t.curve_loss_bound is not None:
        real("trainer.curve_loss_bound", t.curve_loss_bound, "must be a finite number > 0 (each example's loss is "
             "clipped into [0, L] in the dp/ curve) or null (the objective's default)", lo=0, lo_open=True)
    real("trainer.curve_budget_share", t.curve_budget_share, "must be a number in (0, 0.5] (the share of epsilon "
         "the dp/ curve may take; trainer.dp_curves=false releases no curve)", lo=0, hi=0.5, lo_open=True)
    if t.resume is not None and not str(t.resume).strip():
        raise bad("trainer.resume", t.resume, "must be null, auto, or the path of a checkpoint or run folder")
    from dptrain.device import resolve_device

    resolve_device(t.device, distributed=t.distributed)  # a device that does not exist here: refused now
    if t.engine == "nonprivate":
        raise bad("trainer.engine", t.engine, "train without privacy with privacy.enabled=false; allowed engines: "
                  f"auto, {', '.join(ENGINES.names())}")
    if t.engine != "auto":
        ENGINES.get(t.engine)


@dataclass
class LoggerConfig:
    """Where a run's curves go."""

    tensorboard: bool = setting(True, help="TensorBoard events in <run>/private/tb (private: diagnostics on "
                                "training rows)", allowed="true | false")


# ------------------------------------------------------------------------------ audit


@dataclass
class AuditConfig:
    """The one-run privacy audit (task=audit; :mod:`dptrain.audit`, Steinke, Nasr, Jagielski 2023).

    ``canaries`` (m) records are each added to the training set independently with probability
    1/2; after training they are scored and the auditor guesses "in" for the k highest, "out"
    for the k lowest (k = floor(f m / 2) for each f in ``guess_fractions``; a union bound over
    the list pays for picking the best). ``mutation: no_noise`` switches the noise off while the
    accountant still claims the configured sigma: a deliberately broken run the audit must catch.
    ``seed: null`` derives the canaries' coin flips from the run seed."""

    canaries: int = setting(1000, help="m canary records, each included with probability 1/2 (each adds a "
                            "feature column)", allowed="an integer in [2, 20000]")
    guess_fractions: list[float] = setting(help="the auditor guesses k = f m / 2 in and k out for each f (a union "
                                           "bound over the list)", allowed="numbers in (0, 1]",
                                           factory=lambda: [0.1, 0.2, 0.5, 1.0])
    confidence: float = setting(0.95, help="confidence of the epsilon lower bound", allowed="a number in (0.5, 1)")
    mutation: str = setting("none", help="no_noise: switch the noise off while the accountant still claims sigma "
                            "(a deliberately broken run the audit must catch)", allowed="none | no_noise")
    score: str = setting("logit_delta", help="canary score: logit_delta (white-box: minus the initial canary "
                         "column) or logit (black-box)", allowed="logit_delta | logit")
    seed: int | None = setting(None, help="seed of the canaries' coin flips; null: derived from the run seed",
                               allowed="an integer >= 0 | null")


MAX_CANARIES = 20000  # audit.canaries: each adds a feature column (N x m floats in memory)


def check_audit(cfg: AuditRunConfig) -> None:
    """An audit run: its own settings, and a private run to audit (one fresh run, binary)."""
    a = cfg.audit
    integer("audit.canaries", a.canaries, 2, f"must be an integer in [2, {MAX_CANARIES}] (each canary adds a "
            "feature column)")
    if a.canaries > MAX_CANARIES:
        raise bad("audit.canaries", a.canaries,
                  f"must be an integer in [2, {MAX_CANARIES}] (each canary adds a feature column)")
    if len(a.guess_fractions) == 0:
        raise bad("audit.guess_fractions", list(a.guess_fractions), "give at least one fraction in (0, 1]")
    for f in a.guess_fractions:
        if not (isinstance(f, (int, float)) and 0 < f <= 1):
            raise bad("audit.guess_fractions", list(a.guess_fractions), "every fraction must be in (0, 1]")
        if math.floor(f * a.canaries / 2) < 1:
            raise bad("audit.guess_fractions", list(a.guess_fractions),
                      f"fraction {f} of audit.canaries={a.canaries} gives no guess (need f * m / 2 >= 1)")
    if not (0.5 < a.confidence < 1):
        raise bad("audit.confidence", a.confidence, "must be in (0.5, 1), e.g. 0.95")
    one_of("audit.mutation", a.mutation, ("none", "no_noise"))
    one_of("audit.score", a.score, ("logit_delta", "logit"))
    if not cfg.privacy.enabled:
        raise bad("privacy.enabled", False, "task=audit audits a DP-SGD run: needs privacy.enabled=true "
                  "(audit.mutation=no_noise audits a deliberately broken one)")
    if cfg.trainer.resume is not None:
        raise bad("trainer.resume", cfg.trainer.resume, "must be null for task=audit (an audit is one fresh run)")
    if cfg.objective.name != "binary":
        raise bad("objective", cfg.objective.name, "task=audit scores label-1 canaries: needs objective=binary")


# ------------------------------------------------------------------------------ the tasks' roots

SEED_HELP = ("seeds the model's initialisation, the train/test split and generated data; NEVER the noise or the "
             "sampler (fresh from the OS CSPRNG, or privacy.noise_seed_file)")
PLUGINS_HELP = "modules imported before the config is checked: they register extensions (docs/extending.md)"
OVERWRITE_HELP = ("launch into a run folder that already holds a finished run (privacy.json, release.json or "
                  "audit.json) and replace it; false: such a launch is refused (use a new folder, or "
                  "trainer.resume=auto to continue a training run)")
DATA_HELP = "the data source, a config group: data=adult | table | synthetic (| atlas for task=release)"


@dataclass
class TrainRunConfig:
    """task=train: a DP-SGD (or non-private) training run."""

    task: str = setting("train", help="what the run does (a config group)", allowed="train | audit | release | "
                        "predict | tune")
    seed: int = setting(0, help=SEED_HELP, allowed="an integer >= 0")
    plugins: list[str] = setting(help=PLUGINS_HELP, allowed="a list of importable module names", factory=list)
    overwrite: bool = setting(False, help=OVERWRITE_HELP, allowed="true | false")
    # one schema per source (DATA_SOURCES): each conf/data/NAME.yaml extends its own
    data: Any = setting(None, help=DATA_HELP, allowed="adult | table | synthetic")
    model: Any = setting(None, help="the model, a config group (free-form: the keys its _target_ takes): "
                         "model=logit | mlp", allowed="logit | mlp, or any _target_ building an nn.Module")
    optim: Any = setting(None, help="the optimiser, a config group (free-form: the keys its _target_ takes): "
                         "optim=sgd | adam", allowed="sgd | adam, or any torch.optim class as optim._target_")
    objective: ObjectiveConfig = setting(help="what the model predicts", factory=ObjectiveConfig)
    privacy: PrivacyConfig = setting(help="DP-SGD", factory=PrivacyConfig)
    trainer: TrainerConfig = setting(help="the training loop", factory=TrainerConfig)
    logger: LoggerConfig = setting(help="TensorBoard", factory=LoggerConfig)
    estimator: EstimatorConfig = setting(help="how coefficients and their intervals are estimated (linear models; "
                                         "docs/inference.md), a config group: estimator=dpsgd | subsample_aggregate "
                                         "| ssp", factory=EstimatorConfig)


@dataclass
class AuditRunConfig(TrainRunConfig):
    """task=audit: the training run plus the audit's canaries."""

    task: str = setting("audit", help="what the run does (a config group)", allowed="train | audit | release | "
                        "predict | tune")
    audit: AuditConfig = setting(help="the one-run audit", factory=AuditConfig)


@dataclass
class TuneConfig:
    """task=tune: a private hyperparameter search (:mod:`dptrain.tune`, docs/tuning.md)."""

    space: dict[str, Any] = setting(help="the searched settings and their values, nested like the config: "
                                    "{optim: {lr: [0.5, 1, 2]}, privacy: {max_grad_norm: [0.5, 1]}}; each candidate "
                                    "draws one value per setting uniformly (secret randomness)",
                                    allowed="lists of values of searchable settings (optim.*, model.*, "
                                    "privacy.max_grad_norm, trainer.threads)", factory=dict)
    candidates: str = setting("truncated_negative_binomial", help="the law of the number of candidates K "
                              "(Papernot & Steinke 2022); K stays secret", allowed="truncated_negative_binomial | "
                              "poisson")
    mean: float = setting(10.0, help="the expected number of candidates E[K]", allowed="a number >= 1")
    shape: float = setting(1.0, help="truncated_negative_binomial's shape: 0 logarithmic, 1 geometric; larger: more "
                           "concentrated around the mean, and more privacy spent on the selection",
                           allowed="a number >= 0")
    validation_fraction: float = setting(0.2, help="the share of the training rows (keyed hash of each row) that "
                                         "scores the candidates; the rest trains them", allowed="a number in (0, 0.5]")
    score_noise: float = setting(20.0, help="sd of the Gaussian noise added to the validation score's sum over "
                                 "rows (each row adds at most 1): the score's accuracy is this / validation rows",
                                 allowed="a number > 0")
    max_expected_candidates: int = setting(100, help="a guard: tune.mean above it is refused (a typo could train "
                                           "thousands of models)", allowed="an integer >= 1")


@dataclass
class TuneRunConfig(TrainRunConfig):
    """task=tune: a private search over training settings; ONE model released."""

    task: str = setting("tune", help="what the run does (a config group)", allowed="train | audit | release | "
                        "predict | tune")
    tune: TuneConfig = setting(help="the private search", factory=TuneConfig)


@dataclass
class ReleasePrivacyConfig:
    """The one privacy setting a release run shares with training: opt-in reproducible noise."""

    noise_seed_file: str | None = setting(
        None, help="opt-in reproducible noise: a secret file from which every noise draw is derived; null: fresh "
        "from the OS CSPRNG for every run", allowed="the path of a secret file outside the run folder | null")


@dataclass
class ReleaseRunConfig:
    """task=release: small-cell regression releases (docs/release.md)."""

    task: str = setting("release", help="what the run does (a config group)", allowed="train | audit | release | "
                        "predict | tune")
    seed: int = setting(0, help="seeds the simulator (data=atlas); NEVER the release's noise", allowed="an integer "
                        ">= 0")
    plugins: list[str] = setting(help=PLUGINS_HELP, allowed="a list of importable module names", factory=list)
    overwrite: bool = setting(False, help=OVERWRITE_HELP, allowed="true | false")
    data: Any = setting(None, help="the data source, a config group: data=table (your microdata) | atlas "
                        "(simulated cells)", allowed="table | atlas")
    privacy: ReleasePrivacyConfig = setting(help="opt-in reproducible noise", factory=ReleasePrivacyConfig)
    release: ReleaseConfig = setting(help="the release", factory=ReleaseConfig)


#: the laws of the number of candidates (``tune.candidates``)
LAWS = ("truncated_negative_binomial", "poisson")


#: settings a candidate may NOT vary: they change the mechanism (q, steps, sigma, delta), the data
#: or the task, so the candidates would not share one base event
FIXED_PREFIXES = ("privacy.", "trainer.epochs", "trainer.batch_size", "trainer.resume", "trainer.engine", "data.",
                  "task", "seed", "tune.", "estimator.", "logger.", "objective.", "plugins", "overwrite")


SEARCHABLE_HINT = ("optim.* (lr, momentum, weight_decay...), privacy.max_grad_norm (C does not change the "
                   "privacy of a step), model.* (hidden, activation...), trainer.threads")


def flatten_space(space: Any, prefix: str = "") -> dict[str, list[Any]]:
    """``tune.space`` (nested mappings whose leaves are lists) as {dotted setting: values}."""
    out: dict[str, list[Any]] = {}
    for key, value in (space or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_space(value, prefix=name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = list(value)
        else:
            raise bad(f"tune.space.{name}", value, "must be a list of values to choose from, e.g. [0.1, 0.5, 1.0]")
    return out


def check_tune(cfg: Any) -> None:
    """task=tune's own settings, before any row is read (the candidates' values are checked by
    :func:`candidate_configs`)."""
    t = cfg.tune
    one_of("tune.candidates", t.candidates, LAWS)
    real("tune.mean", t.mean, "must be a number >= 1 (the expected number of candidates)", lo=1.0)
    if t.candidates == "truncated_negative_binomial":
        real("tune.shape", t.shape, "must be a number >= 0 (0: logarithmic, 1: geometric)", lo=0.0)
    real("tune.validation_fraction", t.validation_fraction, "must be in (0, 0.5]", lo=0.0, hi=0.5, lo_open=True)
    real("tune.score_noise", t.score_noise, "must be a number > 0 (noise sd on the score's sum)", lo=0.0,
         lo_open=True)
    integer("tune.max_expected_candidates", t.max_expected_candidates, 1)
    if t.mean > t.max_expected_candidates:
        raise bad("tune.mean", t.mean, f"must be <= tune.max_expected_candidates={t.max_expected_candidates} (a "
                  "guard against a typo that would train thousands of models; raise it to search more)")
    p = cfg.privacy
    if not p.enabled:
        raise bad("privacy.enabled", False, "task=tune is a private search: needs privacy.enabled=true (a "
                  "non-private search is a plain sweep: python -m dptrain -m optim.lr=...)")
    if p.target_epsilon is None:
        raise bad("privacy.target_epsilon", None, "task=tune needs the TOTAL epsilon of the search, selection and "
                  "released model as privacy.target_epsilon=E (sigma is calibrated for the whole search; a fixed "
                  "privacy.noise_multiplier is not allowed)")
    if p.max_epsilon is not None:
        raise bad("privacy.max_epsilon", p.max_epsilon, "must be null for task=tune (every candidate runs the same "
                  "planned steps: the search's accounting needs one base mechanism)")
    if cfg.trainer.resume is not None:
        raise bad("trainer.resume", cfg.trainer.resume, "must be null for task=tune (a search is one fresh run)")
    if cfg.trainer.distributed:
        raise bad("trainer.distributed", True, "must be false for task=tune (the search trains its candidates in "
                  "one process, on every row: a sharded read cannot hold them); allowed: trainer.distributed=false")
    if cfg.estimator.name != "dpsgd":
        raise bad("estimator", cfg.estimator.name, "task=tune tunes DP-SGD training: needs estimator=dpsgd")
    space = flatten_space(t.space)
    if not space:
        raise bad("tune.space", t.space, "is empty: nothing to search; allowed: lists of values per setting, e.g. "
                  "tune=lr_clip or '++tune.space={optim: {lr: [0.5, 1, 2]}, privacy: {max_grad_norm: [0.5, 1]}}'")
    for key, values in space.items():
        if key == "privacy.max_grad_norm":
            pass
        elif any(key == f or key.startswith(f) for f in FIXED_PREFIXES):
            raise bad(f"tune.space.{key}", values, "is not searchable: it changes the privacy mechanism, the data "
                      f"or the task, so the candidates would not share one base event; searchable: {SEARCHABLE_HINT}")
        if len(values) == 0:
            raise bad(f"tune.space.{key}", values, "must list at least one value")


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
class PredictRunConfig:
    """task=predict: the trained run folder (``run``, holding model.pt) and the new rows."""

    task: str = setting("predict", help="what the run does (a config group)",
                        allowed="train | audit | release | predict | tune")
    seed: int = setting(0, help="unused by predict (scoring draws no randomness)", allowed="an integer >= 0")
    plugins: list[str] = setting(help="modules imported first: the module of a custom model or objective",
                                 allowed="a list of importable module names", factory=list)
    overwrite: bool = setting(False, help="launch into a run folder that already holds a finished run and replace "
                              "it", allowed="true | false")
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


def check_release_data(d: Any) -> None:
    """The data source a release reads: data=table (a file) or data=atlas (the simulator)."""
    if d.name not in ("table", "atlas"):
        raise bad("data", d.name, "a release reads data=table (your microdata) or data=atlas (simulated)")
    check_source(d, ("table", "atlas"), "a release")
    path = getattr(d, "path", None)
    if d.name == "table" and not path:
        raise bad("data.path", path, "data=table needs the path of a CSV, Parquet or .dta file")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise bad("data.path", path, "must be the path of a CSV, Parquet or .dta file (or null)")
    if d.name == "atlas":
        integer("data.n_cells", d.n_cells, 2, "must be an integer >= 2")
        one_of("data.generator", d.generator, ("atlas", "figure2"))
        return
    one_of("data.format", getattr(d, "format", "auto"), ("auto", "csv", "parquet", "dta"))
    check_delimiter(getattr(d, "delimiter", ","))
    one_of("data.nonfinite", getattr(d, "nonfinite", "error"), ("error", "drop"))


Config = TrainRunConfig  # the training run's config (the type most functions take)


def _task_schemas() -> dict[str, type]:
    return {"train": TrainRunConfig, "audit": AuditRunConfig, "release": ReleaseRunConfig,
            "predict": PredictRunConfig, "tune": TuneRunConfig}


# ------------------------------------------------------------------------------ known keys


def _schema_of(hint: Any, value: Any) -> tuple[str, Any]:
    """How to walk a value of the annotated type: ("dataclass", cls), ("dict", cls) for a mapping
    of dataclasses, or ("leaf", None). ``Any`` fields (model, optim, data) are free-form unless
    the composed node carries its own schema (data: the source's dataclass)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if dataclasses.is_dataclass(hint):
        return "dataclass", hint
    if typing.get_origin(hint) is dict and len(typing.get_args(hint)) == 2:
        inner = typing.get_args(hint)[1]
        if dataclasses.is_dataclass(inner):
            return "dict", inner
    if hint is Any and isinstance(value, DictConfig):
        node_type = OmegaConf.get_type(value)
        if dataclasses.is_dataclass(node_type):
            return "dataclass", node_type
    return "leaf", None


def _walk(node: Any, schema: type, prefix: str, out: list[tuple[str, list[str]]]) -> None:
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key in list(node.keys()):
        path = f"{prefix}{key}"
        if key not in names:
            out.append((path, [f"{prefix}{n}" for n in names]))
            continue
        value = node._get_node(key) if isinstance(node, DictConfig) else node[key]
        kind, inner = _schema_of(hints[key], value)
        if not isinstance(value, (Mapping, DictConfig)) or kind == "leaf":
            continue
        if kind == "dataclass":
            _walk(value, inner, f"{path}.", out)
        else:
            for item in list(value.keys()):
                sub = value._get_node(item) if isinstance(value, DictConfig) else value[item]
                if isinstance(sub, (Mapping, DictConfig)):
                    _walk(sub, inner, f"{path}.{item}.", out)


def unknown_settings(cfg: Any, schema: type) -> list[tuple[str, list[str]]]:
    """Every key of the composed ``cfg`` (a DictConfig or mapping; its ``hydra`` node is skipped)
    that ``schema`` (a task's root dataclass) does not have, with the valid keys at that level.
    ``+key=value`` and ``++key=value`` add keys Hydra does not check; OmegaConf would even set
    them as attributes of the dataclass objects."""
    out: list[tuple[str, list[str]]] = []
    node = cfg
    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        node = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    _walk(node, schema, "", out)
    return out


def _all_paths(schema: type, prefix: str = "") -> list[str]:
    paths = []
    for f in dataclasses.fields(schema):
        kind, inner = _schema_of(typing.get_type_hints(schema)[f.name], None)
        paths.append(f"{prefix}{f.name}")
        if kind == "dataclass":
            paths += _all_paths(inner, f"{prefix}{f.name}.")
    return paths


def _suggestion(path: str, siblings: list[str], everywhere: list[str], cfg: Any) -> str:
    """" (did you mean X?)": the same name in another section, else the closest key at that
    level, else the closest anywhere; for data, the sources that have the key."""
    section, _, last = path.rpartition(".")
    if section == "data":
        owners = [name for name, schema in DATA_SOURCES.items()
                  if last in {f.name for f in dataclasses.fields(schema)}]
        if owners:
            current = cfg.get("data", {}).get("name") if isinstance(cfg, (Mapping, DictConfig)) else None
            return (f" (a key of {', '.join(f'data={o}' for o in owners)}, not of data={current}: choose the "
                    "source with data=NAME)")
    same = [p for p in everywhere if p.rsplit(".", 1)[-1] == last and p != path]
    best = same[:1] or closest(path, siblings, n=1) or closest(path, everywhere, n=1)
    return f" (did you mean {best[0]}?)" if best else ""


def check_known_keys(cfg: Any) -> None:
    """Refuse any key of the composed config that the task's schema does not have (however it
    was added), naming it and the closest valid key. Runs before anything else."""
    task = cfg.get("task", "train") if isinstance(cfg, (Mapping, DictConfig)) else getattr(cfg, "task", "train")
    schema = _task_schemas().get(task)
    if schema is None:
        return  # validate() refuses the task by name
    unknown = unknown_settings(cfg, schema)
    if not unknown:
        return
    everywhere = _all_paths(schema)
    parts = [f"{path}{_suggestion(path, siblings, everywhere, cfg)}" for path, siblings in unknown]
    level = unknown[0][1]
    raise ConfigError(
        f"{', '.join(parts)}: not a setting of task={task}, refused (a key added with + or ++ is checked too); "
        f"allowed at that level: {', '.join(level)}. Every setting is listed in docs/settings.md "
        "(python -m dptrain --help)")


def validate(cfg: Any) -> None:
    """Check every setting of the run's task once, before any row is read. Raises ConfigError."""
    integer("seed", cfg.seed, 0)
    if not isinstance(cfg.plugins, (list, tuple)) or not all(isinstance(m, str) for m in cfg.plugins):
        raise bad("plugins", cfg.plugins, "must be a list of module names, e.g. [mypackage.my_objective]")
    one_of("task", cfg.task, tuple(_task_schemas()))
    flag("overwrite", getattr(cfg, "overwrite", False))
    if cfg.task != "predict" and isinstance(getattr(cfg, "data", None), Mapping):
        cfg.data = as_source(cfg.data)
    if cfg.task == "release":
        check_noise_seed_file(cfg.privacy.noise_seed_file)
        check_release_data(cfg.data)
        validate_release(cfg)
        return
    if cfg.task == "predict":
        validate_predict(cfg)
        return
    check_data(cfg.data)
    check_model(cfg.model)
    check_optim(cfg.optim)
    check_objective(cfg.objective)
    check_privacy(cfg.privacy)
    check_trainer(cfg.trainer)
    if cfg.task == "train":
        check_curves(cfg)
    flag("logger.tensorboard", cfg.logger.tensorboard)
    if cfg.task == "audit":
        check_audit(cfg)
    if cfg.task == "tune":
        check_tune(cfg)


def default_delta(n: int) -> float:
    """Default delta: the largest power of ten <= 1/(10 N), i.e. at least ten times below 1/N."""
    return 10.0 ** math.floor(math.log10(1.0 / (10.0 * n)))


def validate_against_size(cfg: Any, n: int) -> float:
    """Checks that need the (public) training-set size N. Returns the delta to use."""
    if n <= 0:
        raise ConfigError("the training data has 0 rows: nothing to train on")
    if cfg.trainer.batch_size > n:
        raise bad("trainer.batch_size", cfg.trainer.batch_size, f"must be <= N = {n} (training rows)")
    steps = cfg.trainer.epochs * n / cfg.trainer.batch_size  # planned_steps() rounds this (may overflow first)
    if not steps <= MAX_STEPS:
        raise bad("trainer.epochs", cfg.trainer.epochs,
                  f"gives {steps:.4g} steps (epochs * N / B with N = {n}, B = {cfg.trainer.batch_size}); "
                  f"allowed: at most {MAX_STEPS:,} steps, i.e. epochs <= {MAX_STEPS * cfg.trainer.batch_size / n:.6g}")
    if not cfg.privacy.enabled:
        return float("nan")
    delta = cfg.privacy.delta if cfg.privacy.delta is not None else default_delta(n)
    if delta >= 1.0 / n:
        raise bad("privacy.delta", delta, f"must be < 1/N = {1.0 / n:.3g} (N = {n} training rows)")
    return delta


def sigma_unless_target(sigma: float | None, target_epsilon: float | None) -> float | None:
    """Resolver ``${unless_target:SIGMA,${privacy.target_epsilon}}``: a preset's default noise
    multiplier that steps aside when the user asks for a target epsilon instead, so that
    ``experiment=logit privacy.target_epsilon=1`` works. Setting both explicitly is refused."""
    return None if target_epsilon is not None else sigma


def register_configs() -> None:
    """Register each task's schema (``schema/train``, ``schema/audit``, ``schema/release``,
    ``schema/predict``) that ``conf/task/*.yaml`` extend, each data source's schema
    (``schema/data/NAME``) that ``conf/data/NAME.yaml`` extends, and the ``unless_target``
    resolver the privacy presets use."""
    store = ConfigStore.instance()
    for name, schema in _task_schemas().items():
        store.store(group="schema", name=name, node=schema)
    for name, schema in DATA_SOURCES.items():  # conf/data/NAME.yaml: defaults [/schema/data/NAME@_here_]
        store.store(group="schema/data", name=name, node=schema)
    if not OmegaConf.has_resolver("unless_target"):
        OmegaConf.register_new_resolver("unless_target", sigma_unless_target)


# ------------------------------------------------------------------------------ the command line

#: privacy settings that do nothing when privacy.enabled=false
PRIVATE_ONLY = ("noise_multiplier", "target_epsilon", "max_grad_norm", "delta", "accountant", "calibration_rtol",
                "max_epsilon")


def override_keys(overrides: Any) -> dict[str, str]:
    """``{key: value}`` of command-line overrides (``key=v``, ``+key=v``, ``++key=v``, ``~key``)."""
    out = {}
    for item in overrides or []:
        key, _, value = str(item).lstrip("~+").partition("=")
        out[key.strip().lstrip("/")] = value.strip()
    return out


def _package_yaml(*parts: str) -> dict:
    """A file of the shipped conf/ (dptrain.conf), parsed; {} when it is not there."""
    import importlib.resources

    import yaml

    try:
        node = importlib.resources.files("dptrain.conf").joinpath(*parts)
        return yaml.safe_load(node.read_text(encoding="utf-8")) or {}
    except (FileNotFoundError, OSError, ModuleNotFoundError):
        return {}


def _default_choice(defaults: Any, group: str) -> str | None:
    for entry in defaults or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if key.replace("override ", "").strip().lstrip("/") == group:
                    return value
    return None


def preset_optimiser(choices: Mapping) -> str | None:
    """The optim group the preset (experiment=NAME) or else the task's file picks, from the
    shipped conf/; None when unknown (a preset of the user's own --config-dir)."""
    preset = choices.get("experiment")
    if preset:
        picked = _default_choice(_package_yaml("experiment", f"{preset}.yaml").get("defaults"), "optim")
        if picked:
            return picked
    return _default_choice(_package_yaml("task", f"{choices.get('task') or 'train'}.yaml").get("defaults"), "optim")


def check_optimiser_change(cfg: Any, keys: Mapping[str, str], choices: Mapping) -> None:
    """``experiment=logit optim=adam`` would keep the preset's optim.lr (4.0, tuned for SGD):
    when the optimiser is changed on the command line (``optim=NAME`` or ``optim._target_=...``)
    while the learning rate still comes from a preset or another optimiser's file, ask for an
    explicit ``optim.lr``."""
    changed = [k for k in ("optim", "optim._target_") if k in keys]
    lr = cfg.optim.get("lr") if isinstance(cfg.optim, (Mapping, DictConfig)) else None
    if not changed or "optim.lr" in keys or lr is None:
        return
    if changed == ["optim"]:
        chosen = choices.get("optim")
        own_lr = _package_yaml("optim", f"{chosen}.yaml").get("lr")
        if own_lr == lr or chosen == preset_optimiser(choices):
            return
        source = f"the preset experiment={choices.get('experiment')}" if choices.get("experiment") else "the preset"
        what = f"optim={chosen}"
    else:
        source = f"conf/optim/{choices.get('optim')}.yaml or the preset"
        what = f"optim._target_={keys['optim._target_']}"
    raise ConfigError(
        f"optim.lr={lr!r} is not allowed implicitly: it comes from {source} and was tuned for another optimiser, "
        f"but {what} changed the optimiser on the command line; allowed: set the learning rate for this "
        "optimiser explicitly, e.g. optim.lr=0.01 (conf/optim/adam.yaml's default for Adam)")


def check_privacy_off(cfg: Any, keys: Mapping[str, str]) -> None:
    """Privacy settings given on the command line of a run without privacy do nothing: refused."""
    if cfg.privacy.get("enabled", True) is not False:
        return
    for key, value in keys.items():
        name = key.partition(".")[2]
        if key.startswith("privacy.") and name in PRIVATE_ONLY and value.lower() not in ("null", "none", "~", ""):
            raise ConfigError(f"{key}={value} is not allowed: it has no effect with privacy.enabled=false (this run "
                              "trains without privacy: no clipping, no noise, no epsilon); allowed: drop it, or train "
                              "privately (experiment=logit, or privacy=dp / privacy.enabled=true)")


def check_command_line(cfg: Any, *, overrides: Any, choices: Mapping, multirun: bool) -> None:
    """Settings that would silently do nothing or the wrong thing, judged with the command line
    (Hydra's overrides and its config-group choices): a sweep preset without ``-m``, an optimiser
    changed while the learning rate stays another optimiser's, privacy settings without privacy."""
    keys = override_keys(overrides)
    sweep = choices.get("sweep")
    if sweep and not multirun:
        raise bad("sweep", sweep, "a sweep preset lists the runs of a multirun (hydra.sweeper.params); without -m "
                  f"it would be ONE plain run; allowed: python -m dptrain -m ... sweep={sweep}")
    if cfg.get("task") in ("train", "audit"):
        check_optimiser_change(cfg, keys, choices)
        check_privacy_off(cfg, keys)
