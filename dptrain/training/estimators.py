"""scikit-learn estimators trained with dptrain's DP-SGD: :class:`DPLogisticRegression`,
:class:`DPLinearRegression`, :class:`DPMultinomialLogisticRegression`, :class:`DPMLPClassifier`,
and :class:`PublicBoundsScaler` (a scaler that learns nothing from the rows).

::

    from dptrain.training.estimators import DPLogisticRegression

    clf = DPLogisticRegression(bounds=(0, 1), epsilon=1.0, delta=1e-5, batch_size=1024, epochs=10, lr=4.0)
    clf.fit(X, y)                      # Poisson-sampled DP-SGD: dptrain's mechanism, engine, accountant
    clf.predict(X_new); clf.epsilon_; clf.privacy_report_["guarantee"]
    clf.conf_int(); clf.bse_; print(clf.summary())   # intervals: two private Newton steps after DP-SGD

``fit`` runs the same DP-SGD as ``python -m dptrain`` (:class:`dptrain.training.private.PrivateTraining`:
the mechanism, its engine, a Poisson sampler and noise seeded from the OS CSPRNG, the
accountant). ``random_state`` seeds the model's initialisation only, never the noise or the
batches. The guarantee, (epsilon_, delta_)-DP for the rows of ``X`` under add/remove-one-row
neighbours, covers the fitted model (``model_``, ``coef_``, every prediction made from it) and,
for the linear models, the intervals.

The linear models of one output (:class:`DPLogisticRegression`, :class:`DPLinearRegression`)
spend ``interval_share`` (default 0.25; 0: none) of the target epsilon on intervals, as the
command line's ``estimator.interval_share`` does (:mod:`dptrain.privacy.newton`): DP-SGD is
calibrated to (1 - share) of ``epsilon``; then one Gaussian mechanism releases the gradient and
Hessian at DP-SGD's model and the gradient, Hessian and score covariance after one Newton step,
its noise multiplier the smallest that keeps the composition within ``epsilon`` (with a given
``noise_multiplier``: within DP-SGD's epsilon / (1 - share)); the accountant records it, so
``epsilon_`` and ``privacy_report_`` include it. ``coef_`` and ``intercept_`` are the two-step
estimate; ``conf_int()``, ``bse_`` and ``summary()`` its sandwich intervals (privacy noise
included), in the units of X (and y).

The feature bounds are REQUIRED and must be PUBLIC (documentation, domain knowledge, a public
data set): each feature is clipped to its ``bounds`` and scaled to [0, 1] by them, like the
command line's ``data.numeric`` bounds. There is no default: bounds taken from the rows (their
min / max) fall outside the guarantee. For the same reason a data-fitted preprocessing step
before the estimator (``StandardScaler``, ``MinMaxScaler``, ``OneHotEncoder(categories="auto")``,
imputers fitted on the rows) is outside the guarantee: use :class:`PublicBoundsScaler`, or
transformers whose parameters you declare (``OneHotEncoder(categories=[...])``,
``FunctionTransformer``). The labels are DECLARED too: ``classes`` (default ``(0, 1)``; the
multinomial model has no default) is the public label set, ``classes_`` is always that
declaration (never ``np.unique(y)``: which labels occur in the private rows is itself private),
and a row whose label is not declared is left out of the fit (a stated rule, like a regression's row
whose y is not a finite number): ``rows_left_out_`` counts them (PRIVATE: a warning tells the data
holder how many); refusing would tell a data set with one such row from its neighbour without it.
A regression's target range is declared as ``target_bounds`` (no default): y is clipped to it.

The hyperparameters are the fields of the estimator's config dataclass
(:class:`DPClassifierConfig`, :class:`DPLogisticConfig`, :class:`DPMLPConfig`,
:class:`DPMultinomialConfig`, :class:`DPRegressionConfig`): ``__init__`` takes them as keyword
arguments, and ``get_params`` / ``set_params`` / ``clone`` see them as scikit-learn expects.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError, bad, integer, is_finite, is_real, real
from dptrain.models.networks import logit, mlp
from dptrain.models.optimizers import eager_class
from dptrain.privacy import newton
from dptrain.privacy.accounting import DEFAULT
from dptrain.privacy.budget import INTERVALS, Budget
from dptrain.privacy.events import gaussian_event
from dptrain.privacy.newton_terms import MAX_HESSIAN_NOISE, predict_claims, reference_design, reference_statistics
from dptrain.settings.train import MAX_TARGET_EPSILON
from dptrain.training.private import DPConfig, PrivateTraining, planned_mechanism, training_report

__all__ = ["DPClassifierConfig", "DPEstimatorConfig", "DPLinearRegression", "DPLogisticConfig",
           "DPLogisticRegression", "DPMLPClassifier", "DPMLPConfig", "DPMultinomialConfig",
           "DPMultinomialLogisticRegression", "DPRegressionConfig", "PublicBoundsScaler", "public_bounds"]

# ------------------------------------------------------------------------------ public bounds


def _columns(X: Any) -> list[str] | None:
    if isinstance(X, pd.DataFrame) and all(isinstance(c, str) for c in X.columns):
        return [str(c) for c in X.columns]
    return None


def _as_matrix(X: Any, setting: str = "X") -> np.ndarray:
    """X as a 2-D float64 array; non-numeric columns and non-finite entries refused by name
    (no value is quoted: the rows are private)."""
    if isinstance(X, pd.DataFrame):
        bad_cols = [str(c) for c in X.columns if not pd.api.types.is_numeric_dtype(X[c].dtype)]
        if bad_cols:
            raise DPTrainError(f"{setting}: column(s) {', '.join(map(repr, bad_cols))} are not numeric; allowed: "
                               "numbers (encode categories first with a DECLARED list, e.g. "
                               "OneHotEncoder(categories=[[...]]): categories found in the rows are outside the "
                               "guarantee)")
    try:
        a = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise DPTrainError(f"{setting} must be numeric (a 2-D array or DataFrame of numbers)") from None
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise DPTrainError(f"{setting} must be 2-D (rows, features) with at least one row and one feature")
    if not np.isfinite(a).all():
        raise DPTrainError(f"{setting} has missing or non-finite entries; allowed: finite numbers (impute with a "
                           "PUBLIC value first; an imputer fitted on the rows is outside the guarantee)")
    return a


def public_bounds(bounds: Any, n_features: int, columns: list[str] | None, *,
                  setting: str = "bounds") -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) arrays of the declared PUBLIC bounds: ``(lo, hi)`` with scalars (every
    feature) or arrays of one entry per feature, or ``{column: (lo, hi)}`` for a DataFrame's
    columns. Refused by name: missing, not finite, lower >= upper, the wrong length, columns
    missing from the mapping."""
    if bounds is None:
        raise ConfigError(f"{setting}=None is not allowed: declare the PUBLIC range of every feature, e.g. "
                          f"{setting}=(0, 1) for all, {setting}=(lower_array, upper_array) per feature, or "
                          f"{setting}={{column: (lo, hi)}} for a DataFrame. It must not come from the training rows "
                          "(their min/max would fall outside the guarantee)")
    if isinstance(bounds, Mapping):
        if columns is None:
            raise bad(setting, "{...}", "a mapping of column names needs X as a DataFrame with those columns")
        missing = [c for c in columns if c not in bounds]
        extra = [str(k) for k in bounds if k not in columns]
        if missing or extra:
            raise bad(setting, "{...}", f"must name exactly X's columns; missing: {missing}, not in X: {extra}")
        pairs = [bounds[c] for c in columns]
        if any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in pairs):
            raise bad(setting, "{...}", "every value must be a pair (lower, upper)")
        bounds = ([p[0] for p in pairs], [p[1] for p in pairs])
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise bad(setting, bounds, "must be a pair (lower, upper) of numbers or of per-feature arrays, or a mapping")
    try:
        lo, hi = (np.broadcast_to(np.asarray(b, dtype=np.float64), (n_features,)).copy() for b in bounds)
    except (TypeError, ValueError):
        raise bad(setting, bounds, f"lower and upper must be numbers or arrays of {n_features} numbers "
                  f"(one per feature)") from None
    if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo < hi).all()):
        raise bad(setting, bounds, "every bound must be finite with lower < upper")
    return lo, hi


def scale(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Clip to [lo, hi] and scale to [0, 1] by the bounds (nothing learnt from the rows)."""
    return (np.clip(a, lo, hi) - lo) / (hi - lo)


def _check_width(est: Any, a: np.ndarray, X: Any) -> None:
    if a.shape[1] != est.n_features_in_:
        raise DPTrainError(f"X has {a.shape[1]} features, but {type(est).__name__} was fitted with "
                           f"{est.n_features_in_}")
    names = getattr(est, "feature_names_in_", None)
    if names is not None and _columns(X) is not None and list(_columns(X)) != list(names):
        raise DPTrainError("X's columns are not the columns (in the order) the estimator was fitted with")


class PublicBoundsScaler(TransformerMixin, BaseEstimator):
    """Clip every feature to its declared PUBLIC ``bounds`` and scale it to [0, 1]: the DP-safe
    replacement of MinMaxScaler / StandardScaler, whose parameters are fitted on the rows (and so
    are outside any DP guarantee). ``fit`` learns nothing from X but its width and column names.
    ``bounds``: as :func:`public_bounds`."""

    def __init__(self, bounds: Any = None) -> None:
        self.bounds = bounds

    def fit(self, X: Any, y: Any = None) -> PublicBoundsScaler:
        a = _as_matrix(X)
        self.n_features_in_ = a.shape[1]
        if _columns(X) is not None:
            self.feature_names_in_ = np.array(_columns(X), dtype=object)
        self.lower_, self.upper_ = public_bounds(self.bounds, a.shape[1], _columns(X))
        return self

    def transform(self, X: Any) -> Any:
        """The clipped, scaled features: a DataFrame with X's column names when X is one (so the next
        step of a Pipeline, a DP estimator's ``summary()`` included, keeps the names), else an array."""
        check_is_fitted(self, "lower_")
        a = _as_matrix(X)
        _check_width(self, a, X)
        out = scale(a, self.lower_, self.upper_)
        if _columns(X) is None:
            return out
        return pd.DataFrame(out, columns=list(self.get_feature_names_out()), index=getattr(X, "index", None))

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        check_is_fitted(self, "lower_")
        names = getattr(self, "feature_names_in_", None)
        return names if names is not None else np.array([f"x{i}" for i in range(self.n_features_in_)], dtype=object)


# ------------------------------------------------------------------------------ the settings


@dataclass(frozen=True)
class DPEstimatorConfig:
    """The DP-SGD hyperparameters every estimator has (its ``__init__`` keyword arguments).

    bounds: REQUIRED public feature bounds (:func:`public_bounds`); no default.
    epsilon: target epsilon (sigma calibrated to it); or None and a ``noise_multiplier``.
    noise_multiplier: sigma (noise std / C); set exactly one of it and ``epsilon``.
    delta: None: the largest power of ten <= 1/(10 N).
    max_grad_norm: C, the per-example clipping norm.
    batch_size: the EXPECTED batch size B of Poisson sampling (q = B / N).
    epochs: passes over the data (steps = round(epochs N / B)).
    lr, momentum: torch.optim.SGD's, on the noisy gradient.
    accountant: rdp | pld: the headline epsilon and the calibration.
    engine: auto | fast | opacus.
    random_state: seeds the initial weights only (the noise and batches stay secret).
    """

    bounds: Any = None
    epsilon: float | None = 1.0
    noise_multiplier: float | None = None
    delta: float | None = None
    max_grad_norm: float = 1.0
    batch_size: int = 256
    epochs: float = 10.0
    lr: float = 1.0
    momentum: float = 0.0
    accountant: str = DEFAULT.name
    engine: str = "auto"
    random_state: int | None = None


@dataclass(frozen=True)
class DPClassifierConfig(DPEstimatorConfig):
    """:class:`DPEstimatorConfig` plus ``classes``: the two PUBLIC labels (negative, positive),
    declared; default (0, 1). Never taken from y."""

    classes: Any = (0, 1)


@dataclass(frozen=True)
class DPLogisticConfig(DPClassifierConfig):
    """:class:`DPClassifierConfig` plus ``interval_share``: the share of ``epsilon`` spent on the
    intervals (two private Newton steps after DP-SGD), in [0, 0.9]; 0: DP-SGD's estimate only."""

    interval_share: float = 0.25


@dataclass(frozen=True)
class DPMLPConfig(DPClassifierConfig):
    """:class:`DPClassifierConfig` plus the network: ``hidden`` layer widths and ``activation``
    (relu, tanh, gelu, silu, elu, leaky_relu)."""

    hidden: tuple[int, ...] = (64, 64)
    activation: str = "relu"


@dataclass(frozen=True)
class DPMultinomialConfig(DPClassifierConfig):
    """:class:`DPClassifierConfig` with ``classes`` the K >= 2 PUBLIC labels, declared (no
    default: the list must not come from y)."""

    classes: Any = None


@dataclass(frozen=True)
class DPRegressionConfig(DPEstimatorConfig):
    """:class:`DPEstimatorConfig` plus ``target_bounds``: REQUIRED public (lower, upper) of the
    target (y is clipped to it and scaled to [0, 1]; no default), and ``interval_share`` (as
    :class:`DPLogisticConfig`)."""

    target_bounds: Any = None
    interval_share: float = 0.25


def _default(f: Any) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()


def _set_params(est: Any, params: dict[str, Any]) -> None:
    """Store the keyword arguments as attributes (scikit-learn's rule: no checks here); an
    unknown name is refused with the closest valid one."""
    names = [f.name for f in fields(est._config_class)]
    for name in params:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{type(est).__name__}() got an unexpected keyword argument {name!r}{hint}")
    for f in fields(est._config_class):
        setattr(est, f.name, params[f.name] if f.name in params else _default(f))


def _target_bounds(value: Any) -> tuple[float, float]:
    """The declared PUBLIC (lower, upper) of a regression's target."""
    if value is None:
        raise ConfigError("target_bounds=None is not allowed: declare the PUBLIC range of the target, e.g. "
                          "target_bounds=(0, 100) (y is clipped to it and scaled to [0, 1]); allowed: a pair "
                          "(lower, upper) of finite numbers with lower < upper. It must not come from the training "
                          "rows (their min/max would fall outside the guarantee)")
    if (not isinstance(value, (tuple, list)) or len(value) != 2 or not all(is_real(v) and is_finite(v) for v in value)
            or not value[0] < value[1]):
        raise bad("target_bounds", value, "must be a pair (lower, upper) of finite numbers with lower < upper")
    return float(value[0]), float(value[1])


def _summary(title: str, rows: list[tuple], notes: list[str], alpha: float = 0.05) -> str:
    """A statsmodels-like text table: (term, coef, std err, lower, upper, claimed) per row
    (NaN: not computed), then ``notes``."""
    head = (f"{'term':<24}{'coef':>12}{'std err':>12}{f'[{alpha / 2:g}':>12}{f'{1 - alpha / 2:g}]':>12}"
            f"{'claimed':>9}")
    rule = "=" * len(head)

    def num(v: float) -> str:
        return f"{v:>12.4g}" if np.isfinite(v) else f"{'-':>12}"

    lines = [title, rule, head, "-" * len(head)]
    for term, coef, se, lo, hi, claimed in rows:
        lines.append(f"{str(term)[:23]:<24}{num(coef)}{num(se)}{num(lo)}{num(hi)}{claimed:>9}")
    return "\n".join([*lines, rule, *notes])


# ------------------------------------------------------------------------------ the estimators


#: estimator parameter -> the DP-SGD setting it sets (for messages and DPConfig)
_RENAMED = {"epsilon": "target_epsilon"}


class _DPEstimator(BaseEstimator):
    """Shared: parameters from the config dataclass, fit through PrivateTraining."""

    _config_class: type = DPEstimatorConfig
    #: the objective DP-SGD trains (PrivateTraining's ``loss``)
    _loss = "binary"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give each estimator an ``__init__`` whose signature lists its config's fields
        (scikit-learn reads parameter names and defaults from it)."""
        super().__init_subclass__(**kwargs)

        def __init__(self: Any, **params: Any) -> None:
            _set_params(self, params)

        params = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f))
                  for f in fields(cls._config_class)]
        __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *params])
        __init__.__doc__ = cls._config_class.__doc__
        __init__.__qualname__ = f"{cls.__name__}.__init__"
        cls.__init__ = __init__  # type: ignore[method-assign]

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any) -> _DPEstimator:
        """DP-SGD on (X, y) (then, for the linear models, the interval release); sets the fitted
        attributes and ``privacy_report_``."""
        a = _as_matrix(X)
        a, target = _declared_rows(self, a, *self._target(y, a.shape[0]))
        self.n_features_in_ = a.shape[1]
        if _columns(X) is not None:
            self.feature_names_in_ = np.array(_columns(X), dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        self.lower_, self.upper_ = public_bounds(self.bounds, a.shape[1], _columns(X))
        self._plan(a.shape[0], a.shape[1])
        config = self._dp_config()
        model = self._init_model(a.shape[1])
        real("lr", self.lr, "must be a finite number > 0", lo=0, lo_open=True)
        real("momentum", self.momentum, "must be in [0, 1)", lo=0, hi=1, hi_open=True)
        optimizer = eager_class(torch.optim.SGD)(model.parameters(), lr=float(self.lr), momentum=float(self.momentum))
        x01 = scale(a, self.lower_, self.upper_)
        run = PrivateTraining(model, optimizer, torch.from_numpy(x01.astype(np.float32)), torch.from_numpy(target),
                              loss=self._loss, config=config, names={"target_epsilon": "epsilon"})
        for xb, yb in run.batches():
            run.step(xb, yb)
        self.model_ = model.eval()
        self._after_training(run, x01, target)
        self._set_privacy(run, a.shape)
        return self

    def _target(self, y: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(the training target of every row, the mask of rows whose y is declared / usable)."""
        raise NotImplementedError

    def _share(self) -> float:
        """The share of epsilon spent after DP-SGD (0: none)."""
        return 0.0

    def _plan(self, n: int, d: int) -> None:
        """Before training, from public numbers: what follows DP-SGD (default: nothing)."""

    def _dp_config(self) -> DPConfig:
        """DP-SGD's settings: with an interval release, (1 - share) of ``epsilon``."""
        share, eps = self._share(), self.epsilon
        if share > 0 and eps is not None and self.noise_multiplier is None:
            whole = real("epsilon", eps, f"must be a number in (0, {MAX_TARGET_EPSILON:g}]", lo=0,
                         hi=MAX_TARGET_EPSILON, lo_open=True)
            eps = Budget(target=whole).with_share(INTERVALS, share).dpsgd.target
        return DPConfig(noise_multiplier=self.noise_multiplier, target_epsilon=eps,
                        max_grad_norm=self.max_grad_norm, batch_size=self.batch_size, epochs=self.epochs,
                        delta=self.delta, accountant=self.accountant, engine=self.engine)

    def _init_model(self, n_features: int) -> torch.nn.Module:
        """The network, its initial weights from ``random_state`` (public) when given."""
        if self.random_state is None:
            return self._build(n_features)
        integer("random_state", self.random_state, 0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.random_state))
            return self._build(n_features)

    def _build(self, n_features: int) -> torch.nn.Module:
        raise NotImplementedError

    def _after_training(self, run: PrivateTraining, x01: np.ndarray, target: np.ndarray) -> None:
        """What follows DP-SGD (the linear models: coefficients, the interval release)."""

    def _report(self, report: dict[str, Any]) -> None:
        """Add the estimator's own releases to the privacy report (default: none)."""

    def _set_privacy(self, run: PrivateTraining, shape: tuple[int, int]) -> None:
        source = (f"arrays passed to {type(self).__name__}.fit ({shape[0]} rows, {shape[1]} features, clipped to the "
                  "declared public bounds)")
        self.privacy_report_ = training_report(run, data_source=source, seed=self.random_state)
        self._report(self.privacy_report_)
        self.epsilon_ = float(self.privacy_report_["epsilon"])
        self.delta_ = float(run.mechanism.delta)
        self.noise_multiplier_ = float(run.mechanism.noise_multiplier)
        self.n_iter_ = int(run.steps_done)

    def _scaled(self, X: Any) -> torch.Tensor:
        check_is_fitted(self, "model_")
        a = _as_matrix(X)
        _check_width(self, a, X)
        return torch.from_numpy(scale(a, self.lower_, self.upper_).astype(np.float32))

    def _term_names(self) -> list[str]:
        names = getattr(self, "feature_names_in_", None)
        return ["intercept", *(list(names) if names is not None else [f"x{j}" for j in range(self.n_features_in_)])]

    def _guarantee_line(self) -> str:
        return (f"guarantee: ({self.epsilon_:.4g}, {self.delta_:.3g})-DP ({self.privacy_report_['accountant']} "
                "accountant), example-level, add/remove-one-row neighbours, for the rows of X")


class _DPClassifier(ClassifierMixin, _DPEstimator):
    """Shared by the classifiers of one logit: declared labels, prediction."""

    _config_class: type = DPClassifierConfig

    def _target(self, y: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """y as 0/1 float32 (1 = classes_[1]), and the rows whose label is declared; sets
        ``classes_`` to the DECLARED ``classes``."""
        labels = _label_array(y, n)
        if self.classes is None or isinstance(self.classes, (str, bytes)):
            raise bad("classes", self.classes, "declare the two PUBLIC labels, e.g. classes=(0, 1) (the default) or "
                      "classes=['no', 'yes']: labels taken from y would reveal which labels the private rows hold")
        classes = np.asarray(list(self.classes))
        if classes.shape != (2,) or classes[0] == classes[1]:
            raise bad("classes", self.classes, "must list exactly two distinct labels (negative, positive)")
        self.classes_ = classes
        return (labels == classes[1]).astype(np.float32), np.isin(labels, classes)

    # ------------------------------------------------------------------ predict
    @torch.no_grad()
    def decision_function(self, X: Any) -> np.ndarray:
        """The logit of ``classes_[1]`` per row (float64)."""
        return self.model_(self._scaled(X)).double().numpy()

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, 2): the probabilities of ``classes_[0]`` and ``classes_[1]``."""
        p = torch.sigmoid(torch.from_numpy(self.decision_function(X))).numpy()
        return np.column_stack([1.0 - p, p])

    def predict_log_proba(self, X: Any) -> np.ndarray:
        return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[(self.decision_function(X) > 0).astype(np.int64)]


def _label_array(y: Any, n: int) -> np.ndarray:
    labels = np.asarray(y)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise DPTrainError("y must be 1-D with one label per row of X")
    return labels


def _declared_rows(est: Any, a: np.ndarray, target: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of X and the target whose y is declared (a classifier's label in ``classes``, a
    regression's finite y): the others are left out by that stated rule, and counted in
    ``rows_left_out_`` (PRIVATE; a warning for the data holder). No row left: refused, the one
    outcome of a fit that depends on the rows."""
    est.rows_left_out_ = int(np.count_nonzero(~kept))
    if est.rows_left_out_:
        what = ("whose label is not in classes" if hasattr(est, "classes_") else "whose y is missing or not finite")
        warnings.warn(f"{type(est).__name__}.fit: {est.rows_left_out_} rows {what} were left out (PRIVATE count, "
                      "for the data holder: rows_left_out_)", UserWarning, stacklevel=3)
    if not kept.any():
        raise DPTrainError("y: no row is left to train on: every label is outside the declared classes (or every y "
                           "is missing); allowed: rows with a declared label (no label of y is quoted: y is private)")
    return (a, target) if kept.all() else (a[kept], target[kept])


def _units(lower: np.ndarray, upper: np.ndarray, y_scale: float = 1.0, y_offset: float = 0.0) -> tuple:
    """(A, b): the terms [intercept, coef_1..coef_d] in the units of X (and y) are ``A @ theta +
    b`` for the reduced parameters theta = [bias, weights] on the [0, 1]-scaled features:
    coef_j = theta_j / span_j, intercept = theta_0 - sum_j theta_j lower_j / span_j (times the
    target's span, plus its lower bound, for a regression)."""
    span = upper - lower
    a = np.zeros((len(span) + 1, len(span) + 1))
    a[0, 0], a[0, 1:] = 1.0, -lower / span
    a[1:, 1:] = np.diag(1.0 / span)
    b = np.zeros(len(span) + 1)
    b[0] = y_offset
    return y_scale * a, b


class _NewtonIntervals:
    """A linear model of one output: two private Newton steps after DP-SGD
    (:func:`dptrain.privacy.newton.private_newton`), its coefficients in the units of X, and
    ``conf_int``, ``bse_``, ``summary``."""

    #: the Newton release's objective kind (dptrain.privacy.newton.BOUNDS)
    _kind = "binary"

    def _share(self) -> float:
        share = real("interval_share", self.interval_share, "must be a number in [0, 0.9] (the share of epsilon "
                     "spent on the intervals; 0: no intervals)", lo=0, hi=0.9)
        return 0.0 if getattr(self, "interval_plan_", None) is not None and not self.interval_plan_[0] else share

    def _plan(self, n: int, d: int) -> None:
        """``interval_plan_`` (release, why): the command line's plan (docs/inference.md) on the
        public reference design of d features in [0, 1], at the release's noise. When no interval
        besides the intercept's could be claimed, nothing is spent on the release and DP-SGD gets the
        whole epsilon."""
        self.interval_plan_ = None
        share = self._share()
        if share == 0:
            return
        dpsgd = planned_mechanism(self._dp_config(), n, names={"target_epsilon": "epsilon"})
        sigma = newton.planned_noise_multiplier(
            dpsgd.history_between(0, dpsgd.planned_steps), delta=dpsgd.delta, accountant_name=self.accountant,
            rtol=1e-3, share=share, target=float(self.epsilon) if self.noise_multiplier is None else None)
        h, s = reference_statistics(reference_design(d, []), n, self._kind)
        claims = predict_claims(h, s, np.eye(d + 1), newton.noise_sds(sigma, self._kind, float(d + 1)))
        if claims.claimed[1:].any():
            self.interval_plan_ = (True, f"planned: up to {int(claims.claimed[1:].sum())} of {d} coefficients")
            return
        self.interval_plan_ = (False, f"at this epsilon even {n} rows of {d} features at their most informative "
                               f"would give no claimable interval (release noise multiplier {sigma:.4g}); nothing "
                               "is spent on it, DP-SGD gets the whole epsilon")

    def _y_units(self) -> tuple[float, float]:
        return 1.0, 0.0

    def _after_training(self, run: PrivateTraining, x01: np.ndarray, target: np.ndarray) -> None:
        layer = self.model_[0]
        theta = np.concatenate([layer.bias.detach().double().numpy(), layer.weight.detach().double().numpy()[0]])
        self.newton_fit_, self.interval_noise_multiplier_ = None, None
        share = self._share()
        if share > 0:
            z = np.column_stack([np.ones(len(x01)), x01])
            y, kind = target.astype(np.float64), self._kind
            sigma = newton.release_noise_multiplier(
                run.accountant, delta=run.mechanism.delta, accountant_name=run.config.accountant,
                rtol=run.config.calibration_rtol, share=share,
                target=float(self.epsilon) if self.noise_multiplier is None else None)
            fit = newton.private_newton(theta, lambda th: newton.statistics(z, y, z @ th, kind), kind=kind,
                                        radius_sq=float(z.shape[1]), noise_multiplier=sigma,
                                        rng=run.randomness.numpy("newton-interval"))
            run.accountant.record(gaussian_event(sigma))
            self.newton_fit_, self.interval_noise_multiplier_ = fit, float(sigma)
        fit = self.newton_fit_
        if fit is not None and fit.hessian_noise <= MAX_HESSIAN_NOISE and fit.informative.any():
            theta = fit.estimate  # the second Hessian is determined: the model is the two-step estimate
            with torch.no_grad():
                layer.bias.fill_(float(theta[0]))
                layer.weight.copy_(torch.as_tensor(theta[1:], dtype=layer.weight.dtype).reshape(layer.weight.shape))
        a, b = _units(self.lower_, self.upper_, *self._y_units())
        self._set_coefficients(a @ theta + b)
        self._set_intervals(a)

    def _set_coefficients(self, terms: np.ndarray) -> None:
        raise NotImplementedError

    def _set_intervals(self, a: np.ndarray) -> None:
        """``bse_``, ``claimed_`` (per term), ``intervals_claimed_`` (any term), ``interval_check_``
        and ``interval_reasons_`` from the Newton fit's per-term claims
        (:meth:`dptrain.privacy.newton.NewtonFit.claims`): a term that is not claimed gets no
        standard error, as on the command line."""
        fit, names = self.newton_fit_, self._term_names()
        if fit is None:
            self.bse_, self.intervals_claimed_, self.interval_dof_ = None, False, None
            plan = getattr(self, "interval_plan_", None)
            self.interval_check_ = (f"no intervals: {plan[1]} (DP-SGD's estimate only)" if plan is not None else
                                    "no intervals: interval_share=0 (DP-SGD's estimate only)")
            self.claimed_ = pd.Series(False, index=names, name="claimed")
            self.interval_reasons_ = pd.Series(self.interval_check_, index=names, name="reason")
            return
        claims = fit.claims(a)
        self.claimed_ = pd.Series(claims.claimed, index=names, name="claimed")
        self.interval_reasons_ = pd.Series(claims.reasons, index=names, name="reason")
        #: per term, the degrees of freedom of its noisy variance (the t interval's; conf_int)
        self.interval_dof_ = pd.Series(fit.degrees_of_freedom(a), index=names, name="dof")
        cov = np.where(np.isfinite(fit.covariance), fit.covariance, 0.0)
        se = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", a, cov, a), 0.0))
        self.bse_ = pd.Series(np.where(claims.claimed, se, np.nan), index=names, name="std err")
        claimed, why = fit.claim(a)
        self.intervals_claimed_, self.interval_check_ = bool(claimed), why
        if not claimed:  # as the command line: no interval is shown that the run does not claim
            self.bse_ = None

    def _report(self, report: dict[str, Any]) -> None:
        fit = self.newton_fit_
        if fit is None:
            plan = getattr(self, "interval_plan_", None)
            report["intervals"] = {"method": f"none computed ({plan[1] if plan is not None else 'interval_share=0'})"}
            return
        if self.noise_multiplier is None:
            report["target_epsilon"] = float(self.epsilon)  # DP-SGD's mechanism had (1 - share) of it
        sigma, (r_max, w_max) = self.interval_noise_multiplier_, newton.BOUNDS[self._kind]
        claimed, why = self.intervals_claimed_, self.interval_check_
        report["intervals"] = {
            "method": NEWTON_METHOD, "interval_share": float(self.interval_share), "noise_multiplier": sigma,
            "noise_sd": dict(fit.noise_sd),
            "sensitivity": (f"||z||^2 <= 1 + {self.n_features_in_} features = {self.n_features_in_ + 1} (features "
                            f"scaled into [0, 1] by the public bounds); |r| <= {r_max:g}, w <= {w_max:g} "
                            f"({self._kind})"),
            "validity_check": {"claimed": claimed, "why": why, "terms_claimed": int(self.claimed_.sum()),
                               "terms": len(self.claimed_)},
            "claimed": {k: bool(v) for k, v in self.claimed_.items()},
            "reasons": {k: str(v) for k, v in self.interval_reasons_.items()}}
        report["guarantee"] += (
            f"; epsilon composes DP-SGD's steps with one Gaussian mechanism (noise multiplier {sigma:.6g}) that "
            "releases the gradient and Hessian at DP-SGD's model and the gradient, Hessian and score covariance "
            "after one Newton step: coef_, intercept_, bse_ and conf_int() are functions of these releases")

    # ------------------------------------------------------------------ the intervals
    def conf_int(self, alpha: float = 0.05) -> pd.DataFrame:
        """The (1 - alpha) intervals of the intercept and the coefficients, in the units of X (and
        y): Student's t with the noisy variance's degrees of freedom; a DataFrame with columns
        ``lower``, ``upper`` (NaN for a term whose interval is not claimed: ``interval_reasons_`` says
        why), like statsmodels' ``conf_int``."""
        check_is_fitted(self, "model_")
        alpha = real("alpha", alpha, "must be a number in (0, 1)", lo=0, hi=1, lo_open=True, hi_open=True)
        if self.newton_fit_ is not None and not self.intervals_claimed_:
            raise DPTrainError(f"{type(self).__name__}.conf_int: the intervals are NOT CLAIMED "
                               f"({self.interval_check_}); coef_ and intercept_ are DP-SGD's estimates; allowed: "
                               "more rows, a larger epsilon or "
                               "interval_share, fewer features (see summary())")
        if self.bse_ is None and getattr(self, "interval_plan_", None) is not None:
            raise DPTrainError(f"{type(self).__name__}.conf_int: no intervals were computed: "
                               f"{self.interval_plan_[1]}; allowed: more rows, a larger epsilon or fewer features")
        if self.bse_ is None:
            raise DPTrainError(f"{type(self).__name__}.conf_int: no intervals were computed: interval_share="
                               f"{self.interval_share!r}; allowed: fit with interval_share in (0, 0.9] (e.g. 0.25, "
                               "the default: that share of epsilon pays for the intervals)")
        from scipy.special import stdtrit  # here, not at the top: only intervals need scipy

        q = stdtrit(self.interval_dof_.to_numpy(), 1.0 - alpha / 2.0)  # Student's t quantile
        est = self._terms()
        return pd.DataFrame({"lower": est - q * self.bse_.to_numpy(), "upper": est + q * self.bse_.to_numpy()},
                            index=self._term_names())

    def _terms(self) -> np.ndarray:
        return np.concatenate([np.ravel(self.intercept_), np.ravel(self.coef_)])

    def summary(self, alpha: float = 0.05) -> str:
        """A statsmodels-like table (term, coef, std err, interval, claimed), the interval check
        and the guarantee."""
        check_is_fitted(self, "model_")
        est = self._terms()
        if self.bse_ is None:
            se = lo = hi = np.full(len(est), np.nan)
        else:
            ci = self.conf_int(alpha)
            se, lo, hi = self.bse_.to_numpy(), ci["lower"].to_numpy(), ci["upper"].to_numpy()
        claimed = ["yes" if ok else "no" for ok in self.claimed_]
        rows = list(zip(self._term_names(), est, se, lo, hi, claimed))
        title = (f"{type(self).__name__}: DP-SGD + two private Newton steps (interval_share {self.interval_share:g})"
                 if self.newton_fit_ is not None else f"{type(self).__name__}: DP-SGD (no intervals)")
        check = (f"intervals: {'CLAIMED' if self.intervals_claimed_ else 'NOT CLAIMED'}: {self.interval_check_}"
                 if self.newton_fit_ is not None else f"intervals: {self.interval_check_}")
        return _summary(title, rows, [check, self._guarantee_line()], alpha)


NEWTON_METHOD = ("dpsgd + two private Newton steps at its model: estimate and sandwich standard error "
                 "H^-1 (S + noise) H^-1 (the second gradient's noise, and the second Hessian's on the first "
                 "step's miss), Student's t interval with the noisy meat's degrees of freedom (privacy noise "
                 "included)")


class DPLogisticRegression(_NewtonIntervals, _DPClassifier):
    """Logistic regression trained with DP-SGD (parameters: :class:`DPLogisticConfig`), then,
    with ``interval_share`` > 0 (default 0.25 of epsilon), two private Newton steps from its model.
    Fitted: ``coef_`` (1, d) and ``intercept_`` (1,) in the units of X (for rows inside the
    bounds: decision_function(X) = clip(X) @ coef_.T + intercept_), ``model_``, ``classes_``,
    ``epsilon_`` (DP-SGD and the interval release), ``delta_``, ``noise_multiplier_`` (DP-SGD's),
    ``interval_noise_multiplier_``, ``n_iter_`` (steps), ``privacy_report_``, ``bse_``,
    ``intervals_claimed_``, ``interval_check_``; ``conf_int()``, ``summary()``."""

    _config_class = DPLogisticConfig
    _kind = "binary"

    def _build(self, n_features: int) -> torch.nn.Module:
        return logit(in_features=n_features)

    def _set_coefficients(self, terms: np.ndarray) -> None:
        self.coef_, self.intercept_ = terms[None, 1:], terms[:1]


class DPLinearRegression(_NewtonIntervals, RegressorMixin, _DPEstimator):
    """Linear regression (squared error, the ``linear`` objective) trained with DP-SGD on the
    target clipped to its PUBLIC ``target_bounds`` and scaled to [0, 1] (parameters:
    :class:`DPRegressionConfig`), then, with ``interval_share`` > 0, two private Newton steps.
    Fitted: ``coef_`` (d,) and ``intercept_`` (a float) in the units of X and y (predict(X) =
    clip(X) @ coef_ + intercept_), and the attributes and methods of :class:`DPLogisticRegression`
    (``target_lower_``, ``target_upper_`` instead of ``classes_``)."""

    _config_class = DPRegressionConfig
    _loss = "linear"
    _kind = "linear"

    def _build(self, n_features: int) -> torch.nn.Module:
        return logit(in_features=n_features)

    def _target(self, y: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """y clipped to ``target_bounds`` and scaled to [0, 1] (float32), and the rows whose y is a
        finite number (the others are left out)."""
        t = np.asarray(y)
        if t.ndim != 1 or t.shape[0] != n:
            raise DPTrainError("y must be 1-D with one value per row of X")
        if not np.issubdtype(t.dtype, np.number) or np.issubdtype(t.dtype, np.complexfloating):
            raise DPTrainError("y must be numeric (real numbers) for DPLinearRegression")
        t = t.astype(np.float64)
        self.target_lower_, self.target_upper_ = _target_bounds(self.target_bounds)
        span = self.target_upper_ - self.target_lower_
        scaled = (np.clip(t, self.target_lower_, self.target_upper_) - self.target_lower_) / span
        return scaled.astype(np.float32), np.isfinite(t)

    def _y_units(self) -> tuple[float, float]:
        return self.target_upper_ - self.target_lower_, self.target_lower_

    def _set_coefficients(self, terms: np.ndarray) -> None:
        self.coef_, self.intercept_ = terms[1:], float(terms[0])

    @torch.no_grad()
    def predict(self, X: Any) -> np.ndarray:
        """Predictions in the units of y: lower + (upper - lower) times the model's output."""
        out = self.model_(self._scaled(X)).double().numpy()
        return self.target_lower_ + (self.target_upper_ - self.target_lower_) * out


class DPMultinomialLogisticRegression(_DPClassifier):
    """Multinomial (softmax) logistic regression over the K >= 2 DECLARED ``classes``, trained
    with DP-SGD on the ``multinomial`` objective (parameters: :class:`DPMultinomialConfig`).
    Fitted: ``coef_`` (K, d) and ``intercept_`` (K,) in the units of X, ``classes_``, and the
    privacy attributes of :class:`DPLogisticRegression`. No intervals: the two-step private
    Newton release supports binary and linear models only (``conf_int`` says so)."""

    _config_class = DPMultinomialConfig
    _loss = "multinomial"

    def _target(self, y: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """y as int64 indices into the DECLARED ``classes``, and the rows whose label is declared."""
        labels = _label_array(y, n)
        if self.classes is None or isinstance(self.classes, (str, bytes)):
            raise bad("classes", self.classes, "declare the K >= 2 PUBLIC labels, e.g. classes=['a', 'b', 'c']: "
                      "labels taken from y would reveal which labels the private rows hold")
        classes = np.asarray(list(self.classes))
        if classes.ndim != 1 or len(classes) < 2 or len(set(classes.tolist())) != len(classes):
            raise bad("classes", self.classes, "must list at least two distinct labels")
        self.classes_ = classes
        return (labels[:, None] == classes[None, :]).argmax(1).astype(np.int64), np.isin(labels, classes)

    def _build(self, n_features: int) -> torch.nn.Module:
        return logit(in_features=n_features, out_features=len(self.classes_))

    def _after_training(self, run: PrivateTraining, x01: np.ndarray, target: np.ndarray) -> None:
        layer = self.model_[0]
        w, b = layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()
        span = self.upper_ - self.lower_
        self.coef_, self.intercept_ = w / span, b - w @ (self.lower_ / span)

    @torch.no_grad()
    def decision_function(self, X: Any) -> np.ndarray:
        """(n, K): each declared class's score (float64)."""
        return self.model_(self._scaled(X)).double().numpy()

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, K): the softmax probabilities of ``classes_``."""
        return torch.softmax(torch.from_numpy(self.decision_function(X)), dim=1).numpy()

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[self.decision_function(X).argmax(1)]

    def conf_int(self, alpha: float = 0.05) -> pd.DataFrame:
        raise DPTrainError(f"{type(self).__name__}.conf_int: this estimator computes no intervals; allowed: "
                           "DPLogisticRegression or DPLinearRegression in Python, or the command line's "
                           "objective=multinomial (its coefficient table has them); summary() shows the estimates")

    def summary(self, alpha: float = 0.05) -> str:
        """The estimates per class and term (no intervals), and the guarantee."""
        check_is_fitted(self, "model_")
        rows = [(f"{c}: {t}", v, np.nan, np.nan, np.nan, "-") for k, c in enumerate(self.classes_.tolist())
                for t, v in zip(self._term_names(), [self.intercept_[k], *self.coef_[k]])]
        notes = ["intervals: none (binary and linear models only: the two-step private Newton release supports "
                 "those kinds)", self._guarantee_line()]
        return _summary(f"{type(self).__name__}: DP-SGD, {len(self.classes_)} declared classes", rows, notes, alpha)


class DPMLPClassifier(_DPClassifier):
    """A multi-layer perceptron (Linear, activation, ..., Linear to one logit) trained with
    DP-SGD (parameters: :class:`DPMLPConfig`). Fitted attributes as
    :class:`DPLogisticRegression`, without ``coef_`` and the intervals."""

    _config_class = DPMLPConfig

    def _build(self, n_features: int) -> torch.nn.Module:
        hidden = self.hidden
        if not isinstance(hidden, (list, tuple)) or any(
                isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1 for h in hidden):
            raise bad("hidden", hidden, "must be a list of integer layer widths > 0, e.g. (64, 64)")
        try:
            return mlp(in_features=n_features, hidden=[int(h) for h in hidden], activation=self.activation)
        except ValueError as err:
            raise ConfigError(str(err).replace("model.", "")) from None
