"""``task=train``: the model, optim, objective, privacy, trainer and logger sections, their
checks, and the checks that need the PUBLIC training-set size N (:func:`validate_against_size`)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dptrain.core.device import resolve_device
from dptrain.core.validation import (
    ConfigError,
    bad,
    finite_positive,
    flag,
    integer,
    is_finite,
    is_real,
    one_of,
    real,
)
from dptrain.models.objectives import OBJECTIVES, build_objective
from dptrain.models.optimizers import build_optimizer
from dptrain.privacy.accounting import ACCOUNTANTS, SIGMA_RANGE
from dptrain.privacy.curves import resolve_loss_bound
from dptrain.privacy.dpsgd.engine import ENGINES
from dptrain.privacy.dpsgd.units import COMBINES
from dptrain.settings.builders import argument_suggestion, builder_suggestion
from dptrain.settings.common import (
    check_common,
    check_noise_seed_file,
    check_unit_bound,
)
from dptrain.settings.data import check_data
from dptrain.settings.schemas.train import (  # the schemas: no torch, no pandas
    ObjectiveConfig,
    PrivacyConfig,
    TrainerConfig,
    TrainRunConfig,
    sigma_unless_target,  # noqa: F401
    value_if_private,  # noqa: F401
)


def _build_error(setting_name: str, value: Any, exc: BaseException, allowed: str) -> ConfigError:
    cause = exc
    while cause.__cause__ is not None:  # Hydra wraps the constructor's own error
        cause = cause.__cause__
    extra = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
    if extra:  # e.g. optim._target_=torch.optim.AdamW with a leftover key of another optimiser
        key = f"{setting_name}.{extra.group(1)}"
        hint = argument_suggestion(value.get("_target_"), extra.group(1))
        return ConfigError(f"{key}={value.get(extra.group(1))!r} is not allowed: {value.get('_target_')} takes no "
                           f"argument {extra.group(1)!r}{hint}; drop it with ~{key} on the command line; "
                           f"allowed: {allowed}")
    if str(cause).startswith(f"{setting_name}.") and " is not allowed: " in str(cause):
        return ConfigError(str(cause))  # the builder named its own setting (model.activation='rleu' ...)
    missing = builder_suggestion(setting_name, value, cause)
    if missing:
        return ConfigError(missing)
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
        build_optimizer(optim, [torch.nn.Parameter(torch.zeros(1))])
    except Exception as exc:  # noqa: BLE001 - any failure to build is a bad setting
        raise _build_error("optim", dict(optim), exc, f"arguments that {optim['_target_']} accepts") from None


def check_objective(o: ObjectiveConfig) -> None:
    OBJECTIVES.get(o.name)


MAX_TARGET_EPSILON = 100.0  # privacy.target_epsilon


GRAD_NORM_RANGE = (1e-6, 1e6)  # privacy.max_grad_norm (C and sigma * C stay far inside float32)


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


MAX_STEPS = 10_000_000  # steps = round(epochs * N / B): the training loop and the accountants


def check_curves(cfg: Any) -> None:
    """A private run with the dp/ curve needs a loss bound: ``trainer.curve_loss_bound`` or the
    objective's default (a plugin objective may declare none)."""
    t = cfg.trainer
    if cfg.privacy.enabled and t.dp_curves and t.curve_loss_bound is None:
        objective = build_objective(cfg.objective.name)
        if getattr(objective, "curve_loss_bound", None) is None:
            resolve_loss_bound(t.curve_loss_bound, objective, None)  # raises, naming the setting


def check_trainer(t: TrainerConfig) -> None:
    real("trainer.epochs", t.epochs,
         f"must be a finite number > 0 (and give at most {MAX_STEPS:,} steps = epochs * N / B)", lo=0, lo_open=True)
    integer("trainer.batch_size", t.batch_size, 1, "must be an integer > 0 (and <= N)")
    real("trainer.average", t.average, "must be a number in [0, 1) (the share of the last steps whose iterates "
         "are averaged into the published model; 0: the last iterate)", lo=0, hi=1, hi_open=True)
    integer("trainer.eval_every", t.eval_every, 1, "must be an integer > 0")
    integer("trainer.eval_rows", t.eval_rows, 0, "must be an integer >= 0 (0: every test row)")
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

    resolve_device(t.device, distributed=t.distributed)  # a device that does not exist here: refused now
    if t.engine == "nonprivate":
        raise bad("trainer.engine", t.engine, "train without privacy with privacy.enabled=false; allowed engines: "
                  f"auto, {', '.join(ENGINES.names())}")
    if t.engine != "auto":
        ENGINES.get(t.engine)


Config = TrainRunConfig  # the training run's config (the type most functions take)


def default_delta(n: int) -> float:
    """Default delta: the largest power of ten <= 1/(10 N), i.e. at least ten times below 1/N."""
    return 10.0 ** math.floor(math.log10(1.0 / (10.0 * n)))


def _counted(cfg: Any) -> str:
    """What N counts: training rows, or the units of data.privacy_unit (person-level DP-SGD)."""
    unit = getattr(cfg.data, "privacy_unit", None)
    return "training rows" if unit is None else f"training units of data.privacy_unit={unit}"


def validate_against_size(cfg: Any, n: int) -> float:
    """Checks that need the (public) training-set size N. Returns the delta to use."""
    if n <= 0:
        raise ConfigError("the training data has 0 rows: nothing to train on")
    if cfg.trainer.batch_size > n:
        raise bad("trainer.batch_size", cfg.trainer.batch_size, f"must be <= N = {n} ({_counted(cfg)})")
    steps = cfg.trainer.epochs * n / cfg.trainer.batch_size  # planned_steps() rounds this (may overflow first)
    if not steps <= MAX_STEPS:
        raise bad("trainer.epochs", cfg.trainer.epochs,
                  f"gives {steps:.4g} steps (epochs * N / B with N = {n}, B = {cfg.trainer.batch_size}); "
                  f"allowed: at most {MAX_STEPS:,} steps, i.e. epochs <= {MAX_STEPS * cfg.trainer.batch_size / n:.6g}")
    if not cfg.privacy.enabled:
        return float("nan")
    delta = cfg.privacy.delta if cfg.privacy.delta is not None else default_delta(n)
    if delta >= 1.0 / n:
        raise bad("privacy.delta", delta, f"must be < 1/N = {1.0 / n:.3g} (N = {n} {_counted(cfg)})")
    return delta


def check_person_level(cfg: Any) -> None:
    """data.privacy_unit with the training settings: k required (privacy.max_rows_per_unit),
    privacy.unit_combine, and what person-level DP-SGD does not support refused by name."""
    unit = getattr(cfg.data, "privacy_unit", None)
    check_unit_bound(unit, cfg.privacy.max_rows_per_unit)
    one_of("privacy.unit_combine", cfg.privacy.unit_combine, COMBINES)
    if unit is None:
        return
    if cfg.task != "train":
        raise bad("data.privacy_unit", unit, f"with task={cfg.task}: unsupported (its validation rows and "
                  "canaries are per row); allowed: task=train")
    sharding = getattr(cfg.data, "sharding", "off")
    if cfg.trainer.distributed and sharding != "off":
        raise bad("data.sharding", sharding, f"with data.privacy_unit={unit!r} and trainer.distributed=true: a "
                  "process reading its own row groups may hold part of a unit, and each unit's rows must be "
                  "combined in one process before clipping; allowed: data.sharding=off (every process reads the "
                  "table and takes the units u = rank mod W)")
    if cfg.trainer.engine not in ("auto", "fast", "opacus"):
        raise bad("trainer.engine", cfg.trainer.engine, f"with data.privacy_unit={unit!r}: the engine has no unit step "
                  "(person-level DP-SGD); allowed: auto | fast | opacus")


def check_training(cfg: Any) -> None:
    """The sections every training run has (task=train, audit, tune), one after another."""
    check_data(cfg.data)
    check_model(cfg.model)
    check_optim(cfg.optim)
    check_objective(cfg.objective)
    check_privacy(cfg.privacy)
    check_person_level(cfg)
    check_trainer(cfg.trainer)
    flag("logger.tensorboard", cfg.logger.tensorboard)


def validate_train(cfg: Any) -> None:
    """Every setting of a ``task=train`` run, once, before any row is read. Raises ConfigError."""
    check_common(cfg)
    check_training(cfg)
    check_curves(cfg)
