"""Coefficient tables on the ORIGINAL scale of the data, from one fitted linear model.

A linear model (one ``nn.Linear(d, K)``) sees the features encoded with the PUBLIC schema
(:mod:`dptrain.data.encoding`): numeric column ``x`` as ``z = (t(x) - t(lower)) / (t(upper) -
t(lower))`` (``t`` the identity, or ``log1p`` with ``transform: log1p``), categorical columns
one-hot over the declared levels plus an ``<other>`` slot, no reference level. The table maps
the fitted (bias, weights) to an identified parametrisation a statistician reads:

* numeric: per unit of ``x`` (per unit of ``log1p(x)`` for ``transform: log1p``, said in the
  term), ``beta / (t(upper) - t(lower))``; the intercept moves by ``-beta t(lower) / range``;
* categorical: REFERENCE-CODED against the first declared level, ``beta_level - beta_first``
  for every other level (``<other>`` is a level like any other); the intercept absorbs
  ``beta_first``. This is what a GLM with treatment coding estimates (the one-hot encoding with
  every level is over-parametrised together with the intercept; these contrasts are not);
* multinomial (K > 1 outputs): class k relative to the first class, ``theta_k - theta_0``, for
  k = 1..K-1 (the softmax is invariant to adding a vector to every class);
* linear regression with a target scaled to [0, 1] by public bounds (lower, upper): every
  coefficient times ``upper - lower``, the intercept plus ``lower``.

The map is affine in the model's parameters: :func:`coefficient_map` returns the matrix ``M``
with ``terms = M @ [bias; weights] + offset`` for one output (the offset is the scaled target's
lower bound on the intercept, else 0), so a table can be computed for any weight
matrix (one per replicate, part or bootstrap draw) and a covariance propagated exactly
(``M Cov M'``). Nothing here reads a row: the map depends on the public schema only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import nn

from dptrain.core.errors import DPTrainError
from dptrain.models.objectives import OBJECTIVES
from dptrain.training.plan import TrainingPlan

__all__ = ["KINDS", "CoefficientEncoder", "coefficient_map", "coefficient_offset", "coefficients",
           "encoder_for", "encoder_from_schema", "linear_layer", "model_coefficients", "table_terms", "term_labels"]

#: what the model's outputs mean: one logit (binary), K class scores (multinomial), a mean (linear)
KINDS = ("binary", "multinomial", "linear")


@dataclass(frozen=True)
class CoefficientEncoder:
    """The public facts the map needs: each numeric column (name, lower, upper, transform), each
    categorical column (name, declared levels; the encoder adds ``<other>``), the model's kind,
    the target's public scale (linear regression on a target scaled to [0, 1]) and the class
    labels (multinomial)."""

    numeric: tuple[tuple[str, float, float, str], ...]
    categorical: tuple[tuple[str, tuple[str, ...]], ...]
    kind: str = "binary"
    target_scale: tuple[float, float] | None = None
    classes: tuple[str, ...] | None = None

    @property
    def n_features(self) -> int:
        """Width of the encoded features (numeric columns + per categorical column, levels + other)."""
        return len(self.numeric) + sum(len(levels) + 1 for _, levels in self.categorical)


def encoder_from_schema(schema: object, *, kind: str = "binary", target_scale: Sequence[float] | None = None,
                        classes: Sequence[str] | None = None) -> CoefficientEncoder:
    """The :class:`CoefficientEncoder` of a :class:`dptrain.data.schema.Schema`; a linear
    regression's target scale and a multinomial's classes default to the schema's declared
    ``target_bounds`` and ``classes``."""
    if kind not in KINDS:
        raise DPTrainError(f"kind={kind!r} is not allowed: must be one of {', '.join(KINDS)}")
    numeric = tuple((s.name, float(s.lower), float(s.upper), s.transform) for s in schema.numeric)
    categorical = tuple((col, tuple(str(c) for c in levels)) for col, levels in schema.categorical)
    if target_scale is None and kind == "linear":
        target_scale = getattr(schema, "target_bounds", None)
    if classes is None and kind == "multinomial":
        classes = getattr(schema, "classes", None)
    scale = None if target_scale is None else (float(target_scale[0]), float(target_scale[1]))
    return CoefficientEncoder(numeric, categorical, kind, scale, None if classes is None else tuple(map(str, classes)))


def _numeric_range(lower: float, upper: float, transform: str) -> tuple[float, float]:
    """(t(lower), t(upper) - t(lower)): the encoder's offset and scale on the transformed axis."""
    if transform == "log1p":
        lo, hi = math.log1p(lower), math.log1p(upper)
    else:
        lo, hi = lower, upper
    return lo, hi - lo


def term_labels(enc: CoefficientEncoder) -> list[str]:
    """One label per term of one output's table: the intercept, each numeric column (its unit),
    each non-reference level of each categorical column (against the reference)."""
    labels = ["(Intercept)"]
    for name, _, _, transform in enc.numeric:
        labels.append(f"log1p({name})" if transform == "log1p" else name)
    for col, levels in enc.categorical:
        ref = levels[0]
        labels += [f"{col}[{lev}] vs {ref}" for lev in (*levels[1:], "<other>")]
    return labels


def coefficient_map(enc: CoefficientEncoder) -> np.ndarray:
    """``M`` (terms x (1 + d)): the original-scale terms of ONE output are ``M @ [bias; weights]``
    plus :func:`coefficient_offset` (module docstring); the target's scale is in ``M``."""
    d = enc.n_features
    rows: list[np.ndarray] = []
    intercept = np.zeros(1 + d)
    intercept[0] = 1.0
    j = 1
    for _, lower, upper, transform in enc.numeric:
        offset, width = _numeric_range(lower, upper, transform)
        r = np.zeros(1 + d)
        r[j] = 1.0 / width
        intercept[j] = -offset / width
        rows.append(r)
        j += 1
    for _, levels in enc.categorical:
        ref = j
        intercept[ref] += 1.0
        for k in range(1, len(levels) + 1):  # the other levels, then <other>
            r = np.zeros(1 + d)
            r[ref + k], r[ref] = 1.0, -1.0
            rows.append(r)
        j += len(levels) + 1
    m = np.vstack([intercept, *rows]) if rows else intercept[None, :]
    if enc.target_scale is not None:
        lo, hi = enc.target_scale
        m = m * (hi - lo)
    return m


def coefficient_offset(enc: CoefficientEncoder) -> np.ndarray:
    """The affine part of the map: the target's lower bound on the intercept (linear regression
    on a scaled target), else zeros: terms = M @ [bias; weights] + offset."""
    out = np.zeros(len(term_labels(enc)))
    if enc.target_scale is not None:
        out[0] = enc.target_scale[0]
    return out


def linear_layer(model: nn.Module) -> nn.Linear | None:
    """The model's single ``nn.Linear`` when the model is linear (one Linear, no other module
    with parameters, no nonlinearity), else None (an MLP has no coefficient table)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with_params = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    if len(linears) != 1 or len(with_params) != 1:
        return None
    allowed = (nn.Linear, nn.Sequential, nn.Identity, nn.Flatten)
    if any(not isinstance(m, allowed) and type(m).__name__ != "Squeeze" for m in model.modules()):
        return None
    return linears[0]


def coefficients(weight: np.ndarray, bias: np.ndarray, enc: CoefficientEncoder) -> np.ndarray:
    """The original-scale estimates of ONE fitted linear model, flattened in the order of
    :func:`table_terms`: ``weight`` (K, d) or (d,), ``bias`` (K,) or scalar. For K = 1 (binary,
    linear): one block of :func:`term_labels`; for K > 1 (multinomial): K - 1 blocks, class k
    against the first class."""
    w = np.atleast_2d(np.asarray(weight, dtype=np.float64))
    b = np.atleast_1d(np.asarray(bias, dtype=np.float64))
    if w.shape[1] != enc.n_features or b.shape[0] != w.shape[0]:
        raise DPTrainError(f"the model has {w.shape[1]} inputs and {b.shape[0]} outputs; the public schema encodes "
                           f"{enc.n_features} features: the model does not belong to this schema")
    theta = np.concatenate([b[:, None], w], axis=1)  # (K, 1 + d)
    if enc.kind == "multinomial":
        if theta.shape[0] < 2:
            raise DPTrainError("kind=multinomial needs a model with at least two outputs (one per class)")
        theta = theta[1:] - theta[:1]
    elif theta.shape[0] != 1:
        raise DPTrainError(f"kind={enc.kind!r} needs a model with one output, this one has {theta.shape[0]}")
    return (theta @ coefficient_map(enc).T + coefficient_offset(enc)).reshape(-1)


def table_terms(enc: CoefficientEncoder, n_outputs: int = 1) -> list[str]:
    """The term labels of :func:`coefficients`' output (multinomial: prefixed by the class)."""
    labels = term_labels(enc)
    if enc.kind != "multinomial":
        return labels
    classes = enc.classes if enc.classes is not None else tuple(str(k) for k in range(n_outputs))
    return [f"{classes[k]} vs {classes[0]}: {t}" for k in range(1, len(classes)) for t in labels]


def model_coefficients(model: nn.Module, enc: CoefficientEncoder) -> np.ndarray:
    """:func:`coefficients` of a linear model (raises DPTrainError for a model that is not linear)."""
    layer = linear_layer(model)
    if layer is None:
        raise DPTrainError("the model is not linear (one nn.Linear): it has no coefficient table")
    w = layer.weight.detach().double().numpy()
    b = layer.bias.detach().double().numpy() if layer.bias is not None else np.zeros(w.shape[0])
    return coefficients(w, b, enc)


def encoder_for(plan: TrainingPlan) -> CoefficientEncoder:
    """The coefficient map's public facts of a training plan (its public schema and objective; no
    row read)."""
    return encoder_from_schema(plan.schema, kind=objective_kind(plan.objective_name) or "binary")


def objective_kind(objective_name: str) -> str | None:
    """The coefficient table's kind for a registered objective (its ``coefficient_kind``:
    binary, multinomial or linear); None for an objective with no linear interpretation, or an
    unknown name."""
    if objective_name not in OBJECTIVES:
        return None
    return getattr(OBJECTIVES.get(objective_name), "coefficient_kind", None)
