"""The schemas of the training tasks (task=train, audit, tune) and the resolvers their presets use;
their checks: :mod:`dptrain.settings.train`, :mod:`dptrain.settings.audit`, :mod:`dptrain.settings.tune`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import setting
from dptrain.privacy.accounting import DEFAULT as DEFAULT_ACCOUNTANT
from dptrain.privacy.accounting import SIGMA_RANGE
from dptrain.settings.inference import EstimatorConfig
from dptrain.settings.schemas.common import DATA_HELP, SEED_HELP, TASKS_ALLOWED, RunBase, max_rows_per_unit_setting


@dataclass
class ObjectiveConfig:
    """What the model predicts and how it is scored (``objective=NAME``; dptrain.models.objectives)."""

    name: str = setting("binary", help="the objective: binary = one logit, binary cross-entropy, test metrics acc, "
                        "loss, auc; multinomial = K class scores (data.classes), softmax cross-entropy, test metrics "
                        "acc, loss, macro one-vs-rest auc; linear = one output, squared error on a continuous target "
                        "(data.target_bounds), test metrics rmse, r2, mae, loss",
                        allowed="binary | multinomial | linear, or a name a plugin registers in "
                        "dptrain.models.objectives.OBJECTIVES")


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


def sigma_unless_target(sigma: float | None, target_epsilon: float | None) -> float | None:
    """Resolver ``${unless_target:SIGMA,${privacy.target_epsilon}}``: a preset's default noise
    multiplier that steps aside when the user asks for a target epsilon instead, so that
    ``experiment=logit privacy.target_epsilon=1`` works. Setting both explicitly is refused."""
    return None if target_epsilon is not None else sigma


def value_if_private(value: Any, enabled: bool) -> Any:
    """Resolver ``${if_private:VALUE,${privacy.enabled}}``: a preset's target epsilon that steps
    aside when the user switches privacy off (``experiment=linreg privacy=none``)."""
    return value if enabled else None


@dataclass
class AuditConfig:
    """The one-run privacy audit (task=audit; :mod:`dptrain.tasks.audit`, Steinke, Nasr, Jagielski 2023).

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


@dataclass
class AuditRunConfig(TrainRunConfig):
    """task=audit: the training run plus the audit's canaries."""

    task: str = setting("audit", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    audit: AuditConfig = setting(help="the one-run audit", factory=AuditConfig)


@dataclass
class TuneConfig:
    """task=tune: a private hyperparameter search (:mod:`dptrain.tasks.tune`, docs/tuning.md)."""

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

    task: str = setting("tune", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    tune: TuneConfig = setting(help="the private search", factory=TuneConfig)
