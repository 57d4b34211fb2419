"""``task=train``: the model, optim, objective, privacy, trainer and logger sections, their
checks, and the checks that need the PUBLIC training-set size N (:func:`validate_against_size`)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
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
    setting,
)
from dptrain.models.objectives import OBJECTIVES, build_objective
from dptrain.models.optimizers import build_optimizer
from dptrain.privacy.accounting import ACCOUNTANTS, SIGMA_RANGE
from dptrain.privacy.accounting import DEFAULT as DEFAULT_ACCOUNTANT
from dptrain.privacy.curves import resolve_loss_bound
from dptrain.privacy.dpsgd.engine import ENGINES
from dptrain.privacy.dpsgd.units import COMBINES
from dptrain.settings.common import (
    DATA_HELP,
    SEED_HELP,
    TASKS_ALLOWED,
    RunBase,
    check_common,
    check_noise_seed_file,
    check_unit_bound,
    max_rows_per_unit_setting,
)
from dptrain.settings.data import check_data
from dptrain.settings.inference import EstimatorConfig


def _build_error(setting_name: str, value: Any, exc: BaseException, allowed: str) -> ConfigError:
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


@dataclass
class ObjectiveConfig:
    """What the model predicts and how it is scored (``objective=NAME``; dptrain.models.objectives)."""

    name: str = setting("binary", help="the objective: binary = one logit, binary cross-entropy, test metrics acc, "
                        "loss, auc; multinomial = K class scores (data.classes), softmax cross-entropy, test metrics "
                        "acc, loss, macro one-vs-rest auc; linear = one output, squared error on a continuous target "
                        "(data.target_bounds), test metrics rmse, r2, mae, loss",
                        allowed="binary | multinomial | linear, or a name a plugin registers in "
                        "dptrain.models.objectives.OBJECTIVES")


def check_objective(o: ObjectiveConfig) -> None:
    OBJECTIVES.get(o.name)


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
    accountant: str = setting(DEFAULT_ACCOUNTANT.name, help="the accountant of the headline epsilon and of "
                              "calibration (RDP and PLD are both always reported)",
                              allowed="rdp | pld, or a name a plugin registers")
    calibration_rtol: float = setting(1e-3, help="relative tolerance on sigma when calibrating to target_epsilon",
                                      allowed="a number in (0, 0.1)")
    max_epsilon: float | None = setting(None, help="a budget: training stops at the last step whose epsilon "
                                        "(headline accountant) is <= it", allowed="a number > 0 | null")
    noise_seed_file: str | None = setting(
        None, help="opt-in reproducible noise: a secret file (python -m dptrain.privacy.randomness PATH) from which "
        "the noise and the sampler are derived; null: fresh from the OS CSPRNG for every run",
        allowed="the path of a secret file outside the run folder | null")
    max_rows_per_unit: int | None = max_rows_per_unit_setting()
    unit_combine: str = setting("mean", help="with data.privacy_unit: how a unit's per-row gradients are combined "
                                "before the combination is clipped to C: mean (recommended: every unit weighs the "
                                "same whatever its number of rows) or sum (a unit with more rows weighs more, up to "
                                "C)", allowed="mean | sum")


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
    average: float = setting(0.0, help="the published model is the mean of the iterates of the last "
                             "(average x steps) steps (Polyak-Ruppert tail averaging: a function of iterates the "
                             "guarantee already covers, so no privacy cost; it averages the noise out of the final "
                             "model); 0: the last iterate", allowed="a number in [0, 1)")
    eval_every: int = setting(50, help="steps between test-set evaluations", allowed="an integer > 0")
    eval_rows: int = setting(1_000_000, help="the test rows each evaluation DURING training uses (the first this "
                             "many, for the TensorBoard test/ curves; 0: every one); the final test metrics always use "
                             "every test row", allowed="an integer >= 0")
    log_every: int = setting(10, help="steps between TensorBoard scalars (with trainer.dp_curves, also between "
                             "releases of the dp/ curve, each paid for in epsilon)", allowed="an integer > 0")
    baseline: bool = setting(False, help="also fit a NON-private sklearn baseline on the same features (its "
                             "numbers stay in private/); off by default: it imports scikit-learn and "
                             "scipy.stats (about a second); fitted on every training row up to 1,000,000, beyond "
                             "that on a random 1,000,000 of them drawn with the seed (baseline/fit_rows says how "
                             "many)",
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


@dataclass
class LoggerConfig:
    """Where a run's curves go."""

    tensorboard: bool = setting(True, help="TensorBoard events in <run>/private/tb (private: diagnostics on "
                                "training rows)", allowed="true | false")


@dataclass
class TrainRunConfig(RunBase):
    """task=train: a DP-SGD (or non-private) training run."""

    task: str = setting("train", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help=SEED_HELP, allowed="an integer >= 0")
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


def sigma_unless_target(sigma: float | None, target_epsilon: float | None) -> float | None:
    """Resolver ``${unless_target:SIGMA,${privacy.target_epsilon}}``: a preset's default noise
    multiplier that steps aside when the user asks for a target epsilon instead, so that
    ``experiment=logit privacy.target_epsilon=1`` works. Setting both explicitly is refused."""
    return None if target_epsilon is not None else sigma


def value_if_private(value: Any, enabled: bool) -> Any:
    """Resolver ``${if_private:VALUE,${privacy.enabled}}``: a preset's target epsilon that steps
    aside when the user switches privacy off (``experiment=linreg privacy=none``)."""
    return value if enabled else None


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
