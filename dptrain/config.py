"""Validated configuration: one schema per task, each section's checks next to its settings.

A run's config holds only its own task's sections: ``task=train`` (the default) composes
``conf/task/train.yaml`` (data, model, optim, objective, privacy, trainer, logger), ``task=audit``
adds ``audit``, ``task=release`` composes data, release and the noise seed file only. Two layers
of checking, both before any private row is read:

1. *Compose time* (Hydra + OmegaConf structured configs): the task's dataclass below is the
   schema of its config, so an unknown key (``privacy.nois_multiplier``), a wrong type
   (``trainer.epochs=abc``) or another task's section (``model=mlp`` in a release) fails while
   the config is composed.
2. *Value checks* (:func:`validate`, one pass): each section's ``check_*`` function, next to its
   dataclass; names of extensions (accountant, engine, objective, release method) are checked
   against their registries. They raise :class:`ConfigError`, whose message names the setting,
   the value and what is allowed.

Checks that need the training-set size N (``delta < 1/N``, ``batch_size <= N``) run in
:func:`validate_against_size`, which needs only N: the row count is public in our model (the
accountant's q = B/N uses it), so reading it is not a leak.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from dptrain.privacy.accounting import ACCOUNTANTS, SIGMA_RANGE
from dptrain.release.settings import DomainConfig, ReleaseConfig, validate_release  # noqa: F401
from dptrain.validation import ConfigError, bad, finite_positive, flag, integer, is_finite, is_real, one_of, real

__all__ = ["AuditConfig", "AuditRunConfig", "Config", "ConfigError", "DataConfig", "NumericColumn",
           "ObjectiveConfig", "PrivacyConfig", "ReleaseRunConfig", "TrainRunConfig", "TrainerConfig",
           "default_delta", "register_configs", "validate", "validate_against_size"]

# ------------------------------------------------------------------------------ data


@dataclass
class NumericColumn:
    """A numeric feature with PUBLIC bounds: values are clipped into [lower, upper], then
    scaled to [0, 1] by those bounds. ``transform: log1p`` applies log(1 + x) after clipping
    (both bounds transformed too), useful for heavy-tailed money columns."""

    lower: float = 0.0
    upper: float = 1.0
    transform: str = "none"  # none | log1p


@dataclass
class DataConfig:
    """Where the rows come from and the public schema used to encode them.

    ``name``: ``adult`` (shipped UCI Adult), ``table`` (the user's CSV / Parquet / .dta file),
    ``synthetic`` (seeded generator for tests) or, for releases, ``atlas`` (simulated cells).
    Numeric bounds and category lists are public declarations: nothing is fitted on private rows.
    """

    name: str = "adult"
    path: str | None = None
    format: str = "auto"  # auto | csv | parquet | dta
    target: str = "income"
    positive: str | None = None  # label of the positive class (binary target)
    numeric: dict[str, NumericColumn] = field(default_factory=dict)
    categorical: dict[str, list[str]] = field(default_factory=dict)
    nonfinite: str = "error"  # error | drop : policy for NaN / inf in numeric columns
    split_column: str | None = None  # column holding "train"/"test"; else a per-row hash split
    test_fraction: float = 0.25
    # true only when the test rows are PUBLIC (e.g. a published benchmark split, generated data):
    # then test metrics are publishable (metrics.json); otherwise they stay in private/
    test_public: bool = False
    # synthetic generator only
    n_rows: int = 20000
    n_features: int = 10
    # atlas (simulated Opportunity-Atlas-like cells, docs/release.md) only
    generator: str = "atlas"  # atlas (skewed sizes, covariate, states) | figure2 (the paper's design)
    n_cells: int = 2000


TRAIN_DATA = ("adult", "table", "synthetic")


def check_data(d: DataConfig) -> None:
    """The data settings of a training run; the schema itself is checked by the data module's
    own parser (the one place that reads it), before any row is read."""
    from dptrain.data import _synthetic_schema, schema_from_config

    if d.name == "atlas":
        raise bad("data", d.name, "simulated Atlas cells are for task=release (experiment=mos_atlas)")
    one_of("data.name", d.name, TRAIN_DATA)
    if d.path is not None and not isinstance(d.path, (str, os.PathLike)):
        raise bad("data.path", d.path, "must be the path of a CSV, Parquet or .dta file (or null)")
    if d.name == "table" and not d.path:
        raise bad("data.path", d.path, "data=table needs the path of a CSV, Parquet or .dta file")
    one_of("data.format", d.format, ("auto", "csv", "parquet", "dta"))
    one_of("data.nonfinite", d.nonfinite, ("error", "drop"))
    real("data.test_fraction", d.test_fraction, "must be a number in (0, 1)", lo=0, hi=1, lo_open=True, hi_open=True)
    flag("data.test_public", d.test_public)
    if not isinstance(d.numeric, Mapping) or not isinstance(d.categorical, Mapping):
        raise bad("data.numeric/data.categorical", (d.numeric, d.categorical),
                  "must map column names to {lower: ..., upper: ...} / to lists of category labels")
    if d.name == "synthetic":
        _, _, numeric = _synthetic_schema(d)
        schema_from_config(d, numeric=numeric)
    else:
        schema_from_config(d)


# ------------------------------------------------------------------------------ model, optimiser


def _build_error(setting: str, value: Any, exc: BaseException, allowed: str) -> ConfigError:
    cause = exc
    while cause.__cause__ is not None:  # Hydra wraps the constructor's own error
        cause = cause.__cause__
    return ConfigError(f"{setting}={value!r} is not allowed: {type(cause).__name__}: {cause}; allowed: {allowed}")


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
        from hydra.utils import instantiate

        instantiate(OmegaConf.create(dict(optim)))(params=[torch.nn.Parameter(torch.zeros(1))])
    except Exception as exc:  # noqa: BLE001 - any failure to build is a bad setting
        raise _build_error("optim", dict(optim), exc, f"arguments that {optim['_target_']} accepts") from None


# ------------------------------------------------------------------------------ objective


@dataclass
class ObjectiveConfig:
    """What the model predicts and how it is scored (``objective=NAME``; dptrain.objectives)."""

    name: str = "binary"


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

    enabled: bool = True
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_grad_norm: float = 1.0
    delta: float | None = None
    accountant: str = "rdp"  # a name in dptrain.privacy.accounting.ACCOUNTANTS: rdp | pld | ...
    calibration_rtol: float = 1e-3
    max_epsilon: float | None = None  # budget: stop at the last step whose epsilon is <= it
    # opt-in reproducible noise: a file holding a secret of >= 128 bits (dptrain.privacy.randomness);
    # null (default): noise and sampler seeded from the OS CSPRNG, fresh for every run
    noise_seed_file: str | None = None


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

    epochs: float = 5.0
    batch_size: int = 1024
    engine: str = "auto"  # auto | a name in dptrain.privacy.engine.ENGINES: fast | opacus | ...
    eval_every: int = 50  # steps between test-set evaluations
    log_every: int = 10  # steps between TensorBoard scalars
    baseline: bool = True  # fit the non-private sklearn baseline on the same features
    progress: bool = True
    threads: int = 0  # torch threads; 0 leaves torch's default
    checkpoint_every: int = 100  # steps between checkpoints (0: only at the end); always one at the end
    resume: str | None = None  # null (fresh) | auto (this run folder's checkpoint, if any) | PATH
    distributed: bool = False  # one job across torchrun processes (dptrain.distributed)


MAX_STEPS = 10_000_000  # steps = round(epochs * N / B): the training loop and the accountants


def check_trainer(t: TrainerConfig) -> None:
    from dptrain.privacy.engine import ENGINES

    real("trainer.epochs", t.epochs,
         f"must be a finite number > 0 (and give at most {MAX_STEPS:,} steps = epochs * N / B)", lo=0, lo_open=True)
    integer("trainer.batch_size", t.batch_size, 1, "must be an integer > 0 (and <= N)")
    integer("trainer.eval_every", t.eval_every, 1, "must be an integer > 0")
    integer("trainer.log_every", t.log_every, 1, "must be an integer > 0")
    integer("trainer.threads", t.threads, 0, "must be an integer >= 0 (0 = torch default)")
    integer("trainer.checkpoint_every", t.checkpoint_every, 0, "must be an integer >= 0 (0: only at the end)")
    for name in ("baseline", "progress", "distributed"):
        flag(f"trainer.{name}", getattr(t, name))
    if t.resume is not None and not str(t.resume).strip():
        raise bad("trainer.resume", t.resume, "must be null, auto, or the path of a checkpoint or run folder")
    if t.engine == "nonprivate":
        raise bad("trainer.engine", t.engine, "train without privacy with privacy.enabled=false; allowed engines: "
                  f"auto, {', '.join(ENGINES.names())}")
    if t.engine != "auto":
        ENGINES.get(t.engine)


@dataclass
class LoggerConfig:
    tensorboard: bool = True


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

    canaries: int = 1000
    guess_fractions: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.5, 1.0])
    confidence: float = 0.95
    mutation: str = "none"  # none | no_noise (deliberately broken: NO guarantee)
    score: str = "logit_delta"  # logit_delta (white-box: minus the initial canary column) | logit
    seed: int | None = None


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


@dataclass
class TrainRunConfig:
    """task=train: a DP-SGD (or non-private) training run."""

    task: str = "train"
    seed: int = 0
    plugins: list[str] = field(default_factory=list)  # modules imported first: they register extensions
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None
    optim: Any = None
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


@dataclass
class AuditRunConfig(TrainRunConfig):
    """task=audit: the training run plus the audit's canaries."""

    task: str = "audit"
    audit: AuditConfig = field(default_factory=AuditConfig)


@dataclass
class ReleasePrivacyConfig:
    """The one privacy setting a release run shares with training: opt-in reproducible noise."""

    noise_seed_file: str | None = None


@dataclass
class ReleaseRunConfig:
    """task=release: small-cell regression releases (docs/release.md)."""

    task: str = "release"
    seed: int = 0
    plugins: list[str] = field(default_factory=list)
    data: DataConfig = field(default_factory=lambda: DataConfig(name="atlas"))
    privacy: ReleasePrivacyConfig = field(default_factory=ReleasePrivacyConfig)
    release: ReleaseConfig = field(default_factory=ReleaseConfig)


Config = TrainRunConfig  # the training run's config (the type most functions take)
TASK_SCHEMAS = {"train": TrainRunConfig, "audit": AuditRunConfig, "release": ReleaseRunConfig}


def validate(cfg: Any) -> None:
    """Check every setting of the run's task once, before any row is read. Raises ConfigError."""
    integer("seed", cfg.seed, 0)
    if not isinstance(cfg.plugins, (list, tuple)) or not all(isinstance(m, str) for m in cfg.plugins):
        raise bad("plugins", cfg.plugins, "must be a list of module names, e.g. [mypackage.my_objective]")
    one_of("task", cfg.task, tuple(TASK_SCHEMAS))
    if cfg.task == "release":
        check_noise_seed_file(cfg.privacy.noise_seed_file)
        validate_release(cfg)
        return
    check_data(cfg.data)
    check_model(cfg.model)
    check_optim(cfg.optim)
    check_objective(cfg.objective)
    check_privacy(cfg.privacy)
    check_trainer(cfg.trainer)
    flag("logger.tensorboard", cfg.logger.tensorboard)
    if cfg.task == "audit":
        check_audit(cfg)


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
    """Register each task's schema (``schema/train``, ``schema/audit``, ``schema/release``) that
    ``conf/task/*.yaml`` extend, and the ``unless_target`` resolver the privacy presets use."""
    store = ConfigStore.instance()
    for name, schema in TASK_SCHEMAS.items():
        store.store(group="schema", name=name, node=schema)
    if not OmegaConf.has_resolver("unless_target"):
        OmegaConf.register_new_resolver("unless_target", sigma_unless_target)
