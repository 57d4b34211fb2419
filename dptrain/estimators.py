"""scikit-learn estimators trained with dptrain's DP-SGD: :class:`DPLogisticRegression`,
:class:`DPMLPClassifier`, and :class:`PublicBoundsScaler` (a scaler that learns nothing from
the rows).

::

    from dptrain.estimators import DPLogisticRegression

    clf = DPLogisticRegression(bounds=(0, 1), epsilon=1.0, delta=1e-5, batch_size=1024, epochs=10, lr=4.0)
    clf.fit(X, y)                      # Poisson-sampled DP-SGD: dptrain's mechanism, engine, accountant
    clf.predict(X_new); clf.epsilon_; clf.privacy_report_["guarantee"]

``fit`` runs the same DP-SGD as ``python -m dptrain`` (:class:`dptrain.private.PrivateTraining`:
the mechanism, its engine, a Poisson sampler and noise seeded from the OS CSPRNG, the
accountant). ``random_state`` seeds the model's initialisation only, never the noise or the
batches. The guarantee, (epsilon_, delta_)-DP for the rows of ``X`` under add/remove-one-row
neighbours, covers the fitted model (``model_``, ``coef_``, every prediction made from it).

The feature bounds are REQUIRED and must be PUBLIC (documentation, domain knowledge, a public
data set): each feature is clipped to its ``bounds`` and scaled to [0, 1] by them, like the
command line's ``data.numeric`` bounds. There is no default: bounds taken from the rows (their
min / max) fall outside the guarantee. For the same reason a data-fitted preprocessing step
before the estimator (``StandardScaler``, ``MinMaxScaler``, ``OneHotEncoder(categories="auto")``,
imputers fitted on the rows) is outside the guarantee: use :class:`PublicBoundsScaler`, or
transformers whose parameters you declare (``OneHotEncoder(categories=[...])``,
``FunctionTransformer``). The two labels are DECLARED too: ``classes`` (default ``(0, 1)``)
is the public label set, ``classes_`` is always that declaration (never ``np.unique(y)``: which
labels occur in the private rows is itself private), and a row whose label is not declared is
refused with a message that quotes no value of ``y``.

The hyperparameters are the fields of :class:`DPClassifierConfig` (and :class:`DPMLPConfig`):
``__init__`` takes them as keyword arguments, and ``get_params`` / ``set_params`` / ``clone``
see them as scikit-learn expects.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from dptrain.errors import DPTrainError
from dptrain.models import logit, mlp
from dptrain.optimizers import eager_class
from dptrain.private import DPConfig, PrivateTraining
from dptrain.validation import ConfigError, bad, integer, real

__all__ = ["DPClassifierConfig", "DPLogisticRegression", "DPMLPClassifier", "DPMLPConfig", "PublicBoundsScaler",
           "public_bounds"]


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

    def transform(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "lower_")
        a = _as_matrix(X)
        _check_width(self, a, X)
        return scale(a, self.lower_, self.upper_)

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        check_is_fitted(self, "lower_")
        names = getattr(self, "feature_names_in_", None)
        return names if names is not None else np.array([f"x{i}" for i in range(self.n_features_in_)], dtype=object)


# ------------------------------------------------------------------------------ the estimators


@dataclass(frozen=True)
class DPClassifierConfig:
    """The hyperparameters of the DP classifiers (their ``__init__`` keyword arguments).

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
    classes: the two PUBLIC labels (negative, positive), declared; default (0, 1). Never taken from y.
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
    accountant: str = "rdp"
    engine: str = "auto"
    classes: Any = (0, 1)
    random_state: int | None = None


@dataclass(frozen=True)
class DPMLPConfig(DPClassifierConfig):
    """:class:`DPClassifierConfig` plus the network: ``hidden`` layer widths and ``activation``
    (relu, tanh, gelu, silu, elu, leaky_relu)."""

    hidden: tuple[int, ...] = (64, 64)
    activation: str = "relu"


def _default(f: Any) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()


#: estimator parameter -> the DP-SGD setting it sets (for messages and DPConfig)
_RENAMED = {"epsilon": "target_epsilon"}


class _DPClassifier(ClassifierMixin, BaseEstimator):
    """Shared: parameters from the config dataclass, fit through PrivateTraining, prediction."""

    _config_class: type = DPClassifierConfig

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
    def fit(self, X: Any, y: Any) -> _DPClassifier:
        """DP-SGD on (X, y); sets the fitted attributes and ``privacy_report_``."""
        a = _as_matrix(X)
        y01 = self._labels(y, a.shape[0])
        self.n_features_in_ = a.shape[1]
        if _columns(X) is not None:
            self.feature_names_in_ = np.array(_columns(X), dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        self.lower_, self.upper_ = public_bounds(self.bounds, a.shape[1], _columns(X))
        model = self._init_model(a.shape[1])
        real("lr", self.lr, "must be a finite number > 0", lo=0, lo_open=True)
        real("momentum", self.momentum, "must be in [0, 1)", lo=0, hi=1, hi_open=True)
        optimizer = eager_class(torch.optim.SGD)(model.parameters(), lr=float(self.lr), momentum=float(self.momentum))
        config = DPConfig(noise_multiplier=self.noise_multiplier, target_epsilon=self.epsilon,
                          max_grad_norm=self.max_grad_norm, batch_size=self.batch_size, epochs=self.epochs,
                          delta=self.delta, accountant=self.accountant, engine=self.engine)
        x = torch.from_numpy(scale(a, self.lower_, self.upper_).astype(np.float32))
        run = PrivateTraining(model, optimizer, x, torch.from_numpy(y01), loss="binary", config=config,
                              names={"target_epsilon": "epsilon"})
        for xb, yb in run.batches():
            run.step(xb, yb)
        self.model_ = model.eval()
        self._set_privacy(run, a.shape)
        return self

    def _labels(self, y: Any, n: int) -> np.ndarray:
        """y as 0/1 float32 (1 = classes_[1]); sets ``classes_`` to the DECLARED ``classes``. A row
        whose label is not declared is refused (no label is quoted: y is private)."""
        labels = np.asarray(y)
        if labels.ndim != 1 or labels.shape[0] != n:
            raise DPTrainError("y must be 1-D with one label per row of X")
        if self.classes is None or isinstance(self.classes, (str, bytes)):
            raise bad("classes", self.classes, "declare the two PUBLIC labels, e.g. classes=(0, 1) (the default) or "
                      "classes=['no', 'yes']: labels taken from y would reveal which labels the private rows hold")
        classes = np.asarray(list(self.classes))
        if classes.shape != (2,) or classes[0] == classes[1]:
            raise bad("classes", self.classes, "must list exactly two distinct labels (negative, positive)")
        if not np.isin(labels, classes).all():
            raise DPTrainError(f"y has labels that are not in classes={list(classes.tolist())!r} (no label of y is "
                               "quoted: y is private); allowed: only the two declared labels (declare yours with "
                               "classes=[negative, positive])")
        self.classes_ = classes
        return (labels == classes[1]).astype(np.float32)

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

    def _set_privacy(self, run: Any, shape: tuple[int, int]) -> None:
        m = run.mechanism
        source = (f"arrays passed to {type(self).__name__}.fit ({shape[0]} rows, {shape[1]} features, clipped to the "
                  "declared public bounds)")
        self.privacy_report_ = run.report(data_source=source, seed=self.random_state)
        self.epsilon_ = float(self.privacy_report_["epsilon"])
        self.delta_ = float(m.delta)
        self.noise_multiplier_ = float(m.noise_multiplier)
        self.n_iter_ = int(run.steps_done)

    # ------------------------------------------------------------------ predict
    @torch.no_grad()
    def decision_function(self, X: Any) -> np.ndarray:
        """The logit of ``classes_[1]`` per row (float64)."""
        check_is_fitted(self, "model_")
        a = _as_matrix(X)
        _check_width(self, a, X)
        x = torch.from_numpy(scale(a, self.lower_, self.upper_).astype(np.float32))
        return self.model_(x).double().numpy()

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, 2): the probabilities of ``classes_[0]`` and ``classes_[1]``."""
        p = torch.sigmoid(torch.from_numpy(self.decision_function(X))).numpy()
        return np.column_stack([1.0 - p, p])

    def predict_log_proba(self, X: Any) -> np.ndarray:
        return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[(self.decision_function(X) > 0).astype(np.int64)]


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


class DPLogisticRegression(_DPClassifier):
    """Logistic regression trained with DP-SGD (parameters: :class:`DPClassifierConfig`).
    Fitted: ``coef_`` (1, d) and ``intercept_`` (1,) in the units of X (for rows inside the
    bounds: decision_function(X) = clip(X) @ coef_.T + intercept_), ``model_``, ``classes_``,
    ``epsilon_``, ``delta_``, ``noise_multiplier_``, ``n_iter_`` (steps), ``privacy_report_``."""

    _config_class = DPClassifierConfig

    def _build(self, n_features: int) -> torch.nn.Module:
        return logit(in_features=n_features)

    def fit(self, X: Any, y: Any) -> DPLogisticRegression:
        super().fit(X, y)
        lin = self.model_[0]
        w = lin.weight.detach().double().numpy()[0]
        span = self.upper_ - self.lower_
        self.coef_ = (w / span)[None, :]
        self.intercept_ = np.array([float(lin.bias.detach().double()) - float(np.sum(w * self.lower_ / span))])
        return self


class DPMLPClassifier(_DPClassifier):
    """A multi-layer perceptron (Linear, activation, ..., Linear to one logit) trained with
    DP-SGD (parameters: :class:`DPMLPConfig`). Fitted attributes as
    :class:`DPLogisticRegression`, without ``coef_``."""

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
