"""Validated configuration schemas.

Two layers of checking, both before any private row is read:

1. *Compose time* (Hydra + OmegaConf structured configs): the dataclasses below are registered
   as the schema of the top-level config, so an unknown key (``privacy.nois_multiplier``) or a
   wrong type (``trainer.epochs=abc``) fails while the config is composed.
2. *Value checks* (:func:`validate`): ranges and combinations that a type cannot express
   (``max_grad_norm > 0``, exactly one of ``noise_multiplier`` / ``target_epsilon``). They raise
   :class:`ConfigError`, whose message names the setting, the value and what is allowed.

Checks that need the data set size N (``delta < 1/N``, ``batch_size <= N``) run in
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


class ConfigError(ValueError):
    """A setting has a value that is not allowed. The message names setting, value and rule."""


def _bad(setting: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{setting}={value!r} is not allowed: {allowed}")


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

    ``name``: ``adult`` (shipped UCI Adult), ``table`` (the user's CSV / Parquet / .dta file)
    or ``synthetic`` (seeded generator for tests). Numeric bounds and category lists are
    public declarations: nothing is fitted on private rows.
    """

    name: str = "adult"
    path: str | None = None
    format: str = "auto"  # auto | csv | parquet | dta
    target: str = "income"
    positive: str | None = None  # label of the positive class (binary target)
    numeric: dict[str, NumericColumn] = field(default_factory=dict)
    categorical: dict[str, list[str]] = field(default_factory=dict)
    nonfinite: str = "error"  # error | drop : policy for NaN / inf in numeric columns
    split_column: str | None = None  # column holding "train"/"test"; else a seeded split
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


@dataclass
class PrivacyConfig:
    """DP-SGD settings. docs/privacy.md states the rules.

    Exactly one of ``noise_multiplier`` (sigma) and ``target_epsilon`` must be set when
    ``enabled``. ``delta: null`` picks a default well below 1/N (see :func:`default_delta`).
    ``accountant`` names the accountant that produces the headline epsilon and calibrates
    sigma; both RDP and PLD are always reported.
    """

    enabled: bool = True
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_grad_norm: float = 1.0
    delta: float | None = None
    accountant: str = "rdp"  # rdp | pld
    calibration_rtol: float = 1e-3
    max_epsilon: float | None = None  # budget: stop at the last step whose epsilon is <= it
    # opt-in reproducible noise: a file holding a secret of >= 128 bits (dptrain.privacy.randomness);
    # null (default): noise and sampler seeded from the OS CSPRNG, fresh for every run
    noise_seed_file: str | None = None


@dataclass
class TrainerConfig:
    """The training loop. ``batch_size`` is the EXPECTED batch size B of Poisson sampling
    (q = B / N); ``epochs`` may be fractional (steps = round(epochs / q))."""

    epochs: float = 5.0
    batch_size: int = 1024
    engine: str = "auto"  # auto | fast | opacus
    eval_every: int = 50  # steps between test-set evaluations
    log_every: int = 10  # steps between TensorBoard scalars
    baseline: bool = True  # fit the non-private sklearn baseline on the same features
    progress: bool = True
    threads: int = 0  # torch threads; 0 leaves torch's default
    checkpoint_every: int = 100  # steps between checkpoints (0: only at the end); always one at the end
    resume: str | None = None  # null (fresh) | auto (this run folder's checkpoint, if any) | PATH
    distributed: bool = False  # one job across torchrun processes (dptrain.distributed)


@dataclass
class DomainConfig:
    """The PUBLIC domain of (x, y); rows are clipped into it (release.clip) or refused."""

    x_lo: float = 0.0
    x_hi: float = 1.0
    y_lo: float = 0.0
    y_hi: float = 1.0


@dataclass
class ReleaseConfig:
    """Small-cell regression releases (docs/release.md). ``epsilon`` is PER STATISTIC (theta, SE, N
    each get it; a cell costs 3 epsilon; disjoint cells compose in parallel). The cells come from
    a public declaration (``cell_values`` / ``cell_keys_file``) or a private selection
    (``cell_selection=private``), never from the rows present."""

    x: str = "x"
    y: str = "y"
    cells: list[str] = field(default_factory=lambda: ["cell"])
    statistic: str = "p25"  # p25 | p75 | slope | custom (release.stat_fn, brute-force refits)
    stat_fn: str | None = None  # "package.module:function" f(x, y) -> float, for statistic=custom
    neighbors: str = "add_remove"  # add | add_remove
    noise: str = "laplace"  # laplace | normal
    method: str = "mos"  # what release.csv holds: mos | suppression | ss_laplace | noisy_stats | ...
    epsilon: float = 1.0
    min_n: int = 3  # cells with N < min_n are not released and do not enter chi (N is private!)
    chi_by: list[str] = field(default_factory=list)  # [] = one chi over all cells
    domain: DomainConfig = field(default_factory=DomainConfig)
    clip: bool = True
    # The cells (dptrain.release.cell_domain): a PUBLIC declaration, or a private selection.
    # cell_values: {column: [values]} per release.cells column, the cells are the cross product
    # (null = none declared; typed Any because Hydra cannot add keys to a typed dict in struct mode:
    # validate_release checks it); cell_keys_file: a CSV/Parquet listing the cells.
    cell_values: Any = None
    cell_keys_file: str | None = None
    cell_selection: str = "declared"  # declared | private (stability histogram, selection_epsilon/delta)
    selection_epsilon: float = 1.0  # epsilon of the private cell selection (composed into the totals)
    selection_delta: float = 1e-6  # delta of the private cell selection (composed into the totals)
    # comparisons and figures from EXACT private values -> <run>/private/evaluation/;
    # auto: only for simulated data (data=atlas); true | false
    private_evaluation: str = "auto"
    theil_sen_variant: str = "auto"  # auto | all_pairs | matchings (auto: matchings above the pair limit)
    theil_sen_k: int = 25  # matchings of DP Theil-Sen (each point in at most k pairs: epsilon / k)
    suppression_k: list[int] = field(default_factory=lambda: [5, 10, 20])
    rate_outcome: bool = False  # y is 0/1: suppression also needs N p >= k and N (1 - p) >= k
    delta: float = 1e-6  # for the (epsilon, delta) baselines (DP-GD, DP-SGD)
    tail_epsilons: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0, 8.0])


@dataclass
class LoggerConfig:
    tensorboard: bool = True


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


@dataclass
class Config:
    task: str = "train"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None
    optim: Any = None
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    release: ReleaseConfig = field(default_factory=ReleaseConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)


def sigma_unless_target(sigma: float | None, target_epsilon: float | None) -> float | None:
    """Resolver ``${unless_target:SIGMA,${privacy.target_epsilon}}``: a preset's default noise
    multiplier that steps aside when the user asks for a target epsilon instead, so that
    ``experiment=logit privacy.target_epsilon=1`` works. Setting both explicitly is refused."""
    return None if target_epsilon is not None else sigma


def register_configs() -> None:
    """Register :class:`Config` as the schema that ``conf/config.yaml`` extends, and the
    ``unless_target`` resolver the privacy presets use."""
    ConfigStore.instance().store(name="dptrain_schema", node=Config)
    if not OmegaConf.has_resolver("unless_target"):
        OmegaConf.register_new_resolver("unless_target", sigma_unless_target)


_ENUMS = {
    "task": ("train", "release", "audit"),
    "audit.mutation": ("none", "no_noise"),
    "audit.score": ("logit_delta", "logit"),
    "data.name": ("adult", "table", "synthetic", "atlas"),
    "data.generator": ("atlas", "figure2"),
    "release.statistic": ("p25", "p75", "slope", "custom"),
    "release.neighbors": ("add", "add_remove"),
    "release.noise": ("laplace", "normal"),
    "release.method": ("mos", "suppression_5", "suppression_10", "suppression_20", "ss_laplace",
                       "noisy_stats", "theil_sen", "theil_sen_wide", "dp_gd", "dp_sgd"),
    "release.cell_selection": ("declared", "private"),
    "release.theil_sen_variant": ("auto", "all_pairs", "matchings"),
    "data.format": ("auto", "csv", "parquet", "dta"),
    "data.nonfinite": ("error", "drop"),
    "privacy.accountant": ("rdp", "pld"),
    "trainer.engine": ("auto", "fast", "opacus"),
}


def _finite_positive(setting: str, value: Any) -> None:
    if not _is_real(value) or not _is_finite(value) or value <= 0:
        raise _bad(setting, value, "must be a finite number > 0")


#: Ranges a run's numerics are built for (float32 training, the accountants' domain). Values
#: outside them crashed deep inside torch / dp-accounting, overflowed, or ran for hours.
SIGMA_RANGE = (1e-2, 1e6)  # privacy.noise_multiplier: 0 (no noise) or in here; calibration's search range
MAX_TARGET_EPSILON = 100.0  # privacy.target_epsilon
GRAD_NORM_RANGE = (1e-6, 1e6)  # privacy.max_grad_norm (C and sigma * C stay far inside float32)
MAX_STEPS = 10_000_000  # steps = round(epochs * N / B): the training loop and the accountants


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except (OverflowError, TypeError, ValueError):  # 10**400, ...
        return False


def _real(setting: str, value: Any, allowed: str, *, lo: float = -math.inf, hi: float = math.inf,
          lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a float if it is a finite real number in the interval, else ConfigError."""
    ok = _is_real(value) and _is_finite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        raise _bad(setting, value, allowed)
    return float(value)


def _integer(setting: str, value: Any, lo: int, allowed: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise _bad(setting, value, allowed or f"must be an integer >= {lo}")
    return int(value)


def _flag(setting: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _bad(setting, value, "must be true or false")


def _field(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, Mapping) else getattr(obj, name, default)


def validate_settings(cfg: Config) -> None:
    """Type and range of every single setting :func:`validate` relies on. Hydra enforces the
    declared types when it composes a config, but a Config built in Python may hold anything,
    and ``model`` / ``optim`` are free-form: a wrong type must be a ConfigError naming the
    setting, never a TypeError from a comparison or a crash inside torch later."""
    _integer("seed", cfg.seed, 0)
    d = cfg.data
    if d.path is not None and not isinstance(d.path, (str, os.PathLike)):
        raise _bad("data.path", d.path, "must be the path of a CSV, Parquet or .dta file (or null)")
    if not isinstance(d.target, str):
        raise _bad("data.target", d.target, "must be the name of the label column")
    _real("data.test_fraction", d.test_fraction, "must be a number in (0, 1)", lo=0, hi=1, lo_open=True, hi_open=True)
    numeric = d.numeric if d.numeric is not None else {}
    categorical = d.categorical if d.categorical is not None else {}
    if not isinstance(numeric, Mapping):
        raise _bad("data.numeric", numeric, "must map column names to {lower: ..., upper: ...}")
    if not isinstance(categorical, Mapping):
        raise _bad("data.categorical", categorical, "must map column names to lists of category labels")
    for col, spec in numeric.items():
        if spec is None or isinstance(spec, (str, bytes, bool, numbers.Number, list, tuple)):
            raise _bad(f"data.numeric.{col}", spec, "must be {lower: ..., upper: ...} (optionally transform: log1p)")
        for bound in ("lower", "upper"):
            _real(f"data.numeric.{col}.{bound}", _field(spec, bound), "must be a finite number (a public bound)")
    for col, cats in categorical.items():
        if not isinstance(cats, (list, tuple)):
            raise _bad(f"data.categorical.{col}", cats, "must be a list of category labels")
        for c in cats:
            if c is not None and not isinstance(c, (str, numbers.Number)):
                raise _bad(f"data.categorical.{col}", list(cats), "every label must be a string or a number")
    if cfg.task == "release":
        return
    p, t = cfg.privacy, cfg.trainer
    _flag("privacy.enabled", p.enabled)
    if p.enabled:
        s = p.noise_multiplier
        lo, hi = SIGMA_RANGE
        if s is not None and not (_is_real(s) and _is_finite(s) and (s == 0 or lo <= s <= hi)):
            raise _bad("privacy.noise_multiplier", s,
                       f"must be 0 (no noise: epsilon = inf, NO guarantee) or a number in [{lo:g}, {hi:g}] "
                       "(the range the accountants and float32 training handle; calibration searches it too)")
        if p.target_epsilon is not None:
            _real("privacy.target_epsilon", p.target_epsilon,
                  f"must be a number in (0, {MAX_TARGET_EPSILON:g}] (an epsilon above {MAX_TARGET_EPSILON:g} "
                  "protects nothing; privacy.enabled=false trains without privacy and says so)",
                  lo=0, hi=MAX_TARGET_EPSILON, lo_open=True)
        lo, hi = GRAD_NORM_RANGE
        _real("privacy.max_grad_norm", p.max_grad_norm,
              f"must be a number in [{lo:g}, {hi:g}] (the per-example clipping norm C > 0)", lo=lo, hi=hi)
        if p.delta is not None:
            _real("privacy.delta", p.delta, "must be in (0, 1/N) (or null for the default)",
                  lo=0, hi=1, lo_open=True, hi_open=True)
        _real("privacy.calibration_rtol", p.calibration_rtol, "must be in (0, 0.1)", lo=0, hi=0.1,
              lo_open=True, hi_open=True)
    _real("trainer.epochs", t.epochs,
          f"must be a finite number > 0 (and give at most {MAX_STEPS:,} steps = epochs * N / B)", lo=0, lo_open=True)
    _integer("trainer.batch_size", t.batch_size, 1, "must be an integer > 0 (and <= N)")
    _integer("trainer.eval_every", t.eval_every, 1, "must be an integer > 0")
    _integer("trainer.log_every", t.log_every, 1, "must be an integer > 0")
    _integer("trainer.threads", t.threads, 0, "must be an integer >= 0 (0 = torch default)")
    for name in ("baseline", "progress"):
        _flag(f"trainer.{name}", getattr(t, name))
    _flag("logger.tensorboard", cfg.logger.tensorboard)
    validate_model(cfg.model)
    validate_optim(cfg.optim)


def _build_error(setting: str, value: Any, exc: BaseException, allowed: str) -> ConfigError:
    cause = exc
    while cause.__cause__ is not None:  # Hydra wraps the constructor's own error
        cause = cause.__cause__
    return ConfigError(f"{setting}={value!r} is not allowed: {type(cause).__name__}: {cause}; allowed: {allowed}")


def validate_model(model: Any) -> None:
    """``model``: a mapping with ``_target_`` (model=logit | mlp); an MLP's ``hidden`` widths are
    integers > 0. The model is built once with tiny widths so that a bad argument (an unknown
    activation, an unknown key) is refused here and not after the data is read."""
    if not isinstance(model, Mapping) or not isinstance(model.get("_target_"), str):
        raise _bad("model", model, "choose a model: model=logit or model=mlp (a mapping with _target_)")
    probe = dict(model)
    if "hidden" in model:
        hidden = model["hidden"]
        if not isinstance(hidden, (list, tuple)) or any(
                isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in hidden):
            raise _bad("model.hidden", hidden, "must be a list of integer layer widths > 0, e.g. [64, 64]")
        probe["hidden"] = [1] * len(hidden)
    try:
        from hydra.utils import instantiate

        instantiate(OmegaConf.create(probe), in_features=1)
    except Exception as exc:  # noqa: BLE001 - any failure to build is a bad setting
        raise _build_error("model", dict(model), exc, "arguments that the model's _target_ accepts "
                           "(model.hidden: widths > 0; model.activation: relu, tanh, gelu, silu, elu, leaky_relu)") from None


def validate_optim(optim: Any) -> None:
    """``optim``: a mapping with ``_target_`` (a torch.optim class) and ``_partial_: true``;
    ``lr`` a finite number > 0. The optimiser is built once on a dummy parameter, so torch's own
    checks (momentum, betas, weight decay, ...) are refused here, by name."""
    if not isinstance(optim, Mapping) or not isinstance(optim.get("_target_"), str):
        raise _bad("optim", optim, "choose an optimiser: optim=sgd or optim=adam (a mapping with _target_)")
    if "lr" in optim:
        _real("optim.lr", optim["lr"], "must be a finite number > 0 (the learning rate)", lo=0, lo_open=True)
    if optim.get("_partial_") is not True:
        raise _bad("optim._partial_", optim.get("_partial_"), "must be true (the parameters are passed at build time)")
    try:
        import torch
        from hydra.utils import instantiate

        instantiate(OmegaConf.create(dict(optim)))(params=[torch.nn.Parameter(torch.zeros(1))])
    except Exception as exc:  # noqa: BLE001 - any failure to build is a bad setting
        raise _build_error("optim", dict(optim), exc, f"arguments that {optim['_target_']} accepts") from None


def validate(cfg: Config) -> None:
    """Check values and combinations that types cannot express. Raises :class:`ConfigError`."""
    validate_settings(cfg)
    for setting, allowed in _ENUMS.items():
        obj: Any = cfg
        for part in setting.split("."):
            obj = getattr(obj, part)
        if obj not in allowed:
            raise _bad(setting, obj, f"must be one of {', '.join(allowed)}")
    if cfg.task == "release":
        validate_release(cfg)
        return
    if cfg.task == "audit":
        validate_audit(cfg)
    p, t, d = cfg.privacy, cfg.trainer, cfg.data
    if d.name == "atlas":
        raise _bad("data", d.name, "simulated Atlas cells are for task=release (experiment=mos_atlas)")
    if p.enabled:
        has_sigma = p.noise_multiplier is not None
        has_target = p.target_epsilon is not None
        if has_sigma == has_target:
            raise ConfigError(
                "privacy.noise_multiplier="
                f"{p.noise_multiplier!r} and privacy.target_epsilon={p.target_epsilon!r}: "
                "set exactly one of them when privacy.enabled=true (a preset's default sigma steps "
                "aside for privacy.target_epsilon=E; an explicit sigma needs privacy.target_epsilon=null)"
            )
        if has_sigma:
            s = p.noise_multiplier
            if not math.isfinite(s) or s < 0:
                raise _bad("privacy.noise_multiplier", s, "must be a finite number >= 0")
        else:
            _finite_positive("privacy.target_epsilon", p.target_epsilon)
        _finite_positive("privacy.max_grad_norm", p.max_grad_norm)
        if p.delta is not None and not (math.isfinite(p.delta) and 0 < p.delta < 1):
            raise _bad("privacy.delta", p.delta, "must be in (0, 1/N) (or null for the default)")
        if not (0 < p.calibration_rtol < 0.1):
            raise _bad("privacy.calibration_rtol", p.calibration_rtol, "must be in (0, 0.1)")
        if p.max_epsilon is not None:
            _finite_positive("privacy.max_epsilon", p.max_epsilon)
    _finite_positive("trainer.epochs", t.epochs)
    if t.checkpoint_every < 0:
        raise _bad("trainer.checkpoint_every", t.checkpoint_every, "must be an integer >= 0 (0: only at the end)")
    if t.resume is not None and not str(t.resume).strip():
        raise _bad("trainer.resume", t.resume, "must be null, auto, or the path of a checkpoint or run folder")
    if t.batch_size <= 0:
        raise _bad("trainer.batch_size", t.batch_size, "must be an integer > 0 (and <= N)")
    for name in ("eval_every", "log_every"):
        if getattr(t, name) <= 0:
            raise _bad(f"trainer.{name}", getattr(t, name), "must be an integer > 0")
    if t.threads < 0:
        raise _bad("trainer.threads", t.threads, "must be >= 0 (0 = torch default)")
    if d.name == "table" and not d.path:
        raise _bad("data.path", d.path, "data=table needs the path of a CSV, Parquet or .dta file")
    if not (0 < d.test_fraction < 1):
        raise _bad("data.test_fraction", d.test_fraction, "must be in (0, 1)")
    for col, spec in d.numeric.items():
        lo, hi = spec.lower, spec.upper
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise _bad(f"data.numeric.{col}", f"[{lo}, {hi}]", "bounds must be finite with lower < upper")
        if spec.transform not in ("none", "log1p"):
            raise _bad(f"data.numeric.{col}.transform", spec.transform, "must be none or log1p")
        if spec.transform == "log1p" and lo <= -1:
            raise _bad(f"data.numeric.{col}.lower", lo, "log1p needs lower > -1")
    for col, cats in d.categorical.items():
        if len(cats) == 0:
            raise _bad(f"data.categorical.{col}", list(cats), "a category list must not be empty")
    if not d.numeric and not d.categorical and d.name != "synthetic":
        raise _bad("data.numeric/data.categorical", "{}", "declare at least one feature column")


def validate_release(cfg: Config) -> None:
    """Value checks of a release run (task=release), before any row is read (and before the cell
    declaration file is opened)."""
    r, d = cfg.release, cfg.data
    _finite_positive("release.epsilon", r.epsilon)
    if not (0 < r.delta < 1):
        raise _bad("release.delta", r.delta, "must be in (0, 1)")
    if not r.cells:
        raise _bad("release.cells", list(r.cells), "name at least one cell column")
    dom = r.domain
    for lo, hi, name in ((dom.x_lo, dom.x_hi, "x"), (dom.y_lo, dom.y_hi, "y")):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise _bad(f"release.domain.{name}", f"[{lo}, {hi}]", "bounds must be finite with lo < hi")
    if (r.statistic == "custom") != bool(r.stat_fn):
        raise _bad("release.stat_fn", r.stat_fn, "set it (module:function) exactly when release.statistic=custom")
    if r.min_n < 3:
        raise _bad("release.min_n", r.min_n, "must be >= 3 (OLS and its SE need at least 3 rows)")
    if any(k <= 0 for k in r.suppression_k):
        raise _bad("release.suppression_k", list(r.suppression_k), "thresholds must be integers > 0")
    for e in r.tail_epsilons:
        _finite_positive("release.tail_epsilons", e)
    if d.name not in ("table", "atlas"):
        raise _bad("data", d.name, "a release reads data=table (your microdata) or data=atlas (simulated)")
    if d.name == "table" and not d.path:
        raise _bad("data.path", d.path, "data=table needs the path of a CSV, Parquet or .dta file")
    if d.name == "atlas" and d.n_cells < 2:
        raise _bad("data.n_cells", d.n_cells, "must be >= 2")
    # Where the cells come from, before any row is read: a public declaration (release.cell_values or
    # release.cell_keys_file; for data=atlas the simulator's own public design), or
    # release.cell_selection=private. Cells taken from the rows present are refused: whether a cell
    # is listed would tell whether anyone is in it.
    cells = list(r.cells)
    has_values, has_file = r.cell_values is not None, r.cell_keys_file is not None
    if has_values and has_file:
        raise _bad("release.cell_keys_file", r.cell_keys_file,
                   "declare the cells once: release.cell_values OR release.cell_keys_file, not both")
    if r.cell_selection == "private":
        if has_values or has_file:
            raise _bad("release.cell_selection", "private", "select cells privately only when none are declared; "
                       "with release.cell_values / release.cell_keys_file set release.cell_selection=declared")
        _finite_positive("release.selection_epsilon", r.selection_epsilon)
        if not (_is_real(r.selection_delta) and 0 < r.selection_delta < 1):
            raise _bad("release.selection_delta", r.selection_delta, "must be in (0, 1), e.g. 1e-6")
    elif not (has_values or has_file or d.name == "atlas"):
        raise ConfigError(
            "release.cell_values=null and release.cell_keys_file=null: the release is refused (no row was read). "
            "The list of cells must not come from the rows present: a cell that appears only when someone is in "
            "it would reveal them. Allowed: declare the public cells, release.cell_values={COLUMN: [v1, v2, ...]} "
            "for each release.cells column (the cells are the cross product), or release.cell_keys_file=PATH "
            "(a CSV/Parquet with one column per release.cells column, one row per cell); or set "
            "release.cell_selection=private (cells selected with (release.selection_epsilon, "
            "release.selection_delta)-DP, composed into the release's totals)")
    if has_values:
        vals = r.cell_values
        if not isinstance(vals, Mapping) or set(map(str, vals)) != set(cells):
            got = sorted(map(str, vals)) if isinstance(vals, Mapping) else vals
            raise _bad("release.cell_values", got, f"give a list of values for exactly the release.cells columns {cells}")
        for col, values in vals.items():
            if not isinstance(values, (list, tuple)) or len(values) == 0:
                raise _bad(f"release.cell_values.{col}", values, "must be a non-empty list of values")
            for v in values:
                if v is None or not isinstance(v, (str, numbers.Number)):
                    raise _bad(f"release.cell_values.{col}", list(values), "every value must be a string or a number")
    if has_file and not (isinstance(r.cell_keys_file, str) and r.cell_keys_file.strip()):
        raise _bad("release.cell_keys_file", r.cell_keys_file, "must be the path of a CSV or Parquet file")
    if str(r.private_evaluation).strip().lower() not in ("auto", "true", "false"):
        raise _bad("release.private_evaluation", r.private_evaluation,
                   "must be auto (only for simulated data), true or false")
    _integer("release.theil_sen_k", r.theil_sen_k, 1, "must be an integer >= 1 (matchings of DP Theil-Sen)")


MAX_CANARIES = 20000  # audit.canaries: each adds a feature column (N x m floats in memory)


def validate_audit(cfg: Config) -> None:
    """Value checks of an audit run (task=audit), before any row is read; the training
    settings are checked by :func:`validate` as for task=train."""
    a = cfg.audit
    if not (2 <= a.canaries <= MAX_CANARIES):
        raise _bad("audit.canaries", a.canaries,
                   f"must be an integer in [2, {MAX_CANARIES}] (each canary adds a feature column)")
    if len(a.guess_fractions) == 0:
        raise _bad("audit.guess_fractions", list(a.guess_fractions), "give at least one fraction in (0, 1]")
    for f in a.guess_fractions:
        if not (isinstance(f, (int, float)) and 0 < f <= 1):
            raise _bad("audit.guess_fractions", list(a.guess_fractions), "every fraction must be in (0, 1]")
        if math.floor(f * a.canaries / 2) < 1:
            raise _bad("audit.guess_fractions", list(a.guess_fractions),
                       f"fraction {f} of audit.canaries={a.canaries} gives no guess (need f * m / 2 >= 1)")
    if not (0.5 < a.confidence < 1):
        raise _bad("audit.confidence", a.confidence, "must be in (0.5, 1), e.g. 0.95")
    if not cfg.privacy.enabled:
        raise _bad("privacy.enabled", False, "task=audit audits a DP-SGD run: needs privacy.enabled=true "
                   "(audit.mutation=no_noise audits a deliberately broken one)")
    if getattr(cfg.trainer, "resume", None) is not None:
        raise _bad("trainer.resume", cfg.trainer.resume, "must be null for task=audit (an audit is one fresh run)")


def default_delta(n: int) -> float:
    """Default delta: the largest power of ten <= 1/(10 N), i.e. at least ten times below 1/N."""
    return 10.0 ** math.floor(math.log10(1.0 / (10.0 * n)))


def validate_against_size(cfg: Config, n: int) -> float:
    """Checks that need the (public) training-set size N. Returns the delta to use."""
    if n <= 0:
        raise ConfigError("the training data has 0 rows: nothing to train on")
    if cfg.trainer.batch_size > n:
        raise _bad("trainer.batch_size", cfg.trainer.batch_size, f"must be <= N = {n} (training rows)")
    if cfg.task != "release":
        steps = cfg.trainer.epochs * n / cfg.trainer.batch_size  # fit() runs max(1, round(this)) steps
        if not steps <= MAX_STEPS:
            raise _bad("trainer.epochs", cfg.trainer.epochs,
                       f"gives {steps:.4g} steps (epochs * N / B with N = {n}, B = {cfg.trainer.batch_size}); "
                       f"allowed: at most {MAX_STEPS:,} steps, i.e. epochs <= "
                       f"{MAX_STEPS * cfg.trainer.batch_size / n:.6g}")
    if not cfg.privacy.enabled:
        return float("nan")
    delta = cfg.privacy.delta if cfg.privacy.delta is not None else default_delta(n)
    if delta >= 1.0 / n:
        raise _bad("privacy.delta", delta, f"must be < 1/N = {1.0 / n:.3g} (N = {n} training rows)")
    return delta
