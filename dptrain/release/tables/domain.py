"""The declared domain of a tabulation, from a data source's PUBLIC schema, and each row's cell
codes: a categorical column's declared levels and its ``<other>`` slot; a numeric column's
``bins`` equal-width bins within its declared bounds (on the transformed scale for ``log1p``,
labelled on the original scale); the target's declared labels (binary: data.negative and
data.positive, or 0 and 1; multiclass: the classes; continuous: bins of its declared bounds). The codes
are read off the encoded rows of :func:`dptrain.data.load_dataset` (train and test rows together),
so the loader's checks and clipping rules are the tabulation's too."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dptrain.core.errors import DPTrainError
from dptrain.data.schema import OTHER, Schema
from dptrain.release.tables.marginals import Column

__all__ = ["decode_rows", "domain_columns", "row_codes"]


def _bin_labels(lo: float, hi: float, bins: int, transform: str) -> tuple[str, ...]:
    if transform == "log1p":
        edges = np.expm1(np.linspace(math.log1p(lo), math.log1p(hi), bins + 1))
    else:
        edges = np.linspace(lo, hi, bins + 1)
    return tuple(f"[{a:.4g}, {b:.4g}{']' if k == bins - 1 else ')'}" for k, (a, b) in enumerate(zip(edges[:-1],
                                                                                                      edges[1:])))


def domain_columns(schema: Schema, *, bins: int) -> list[Column]:
    """The domain's columns in encoded order: numeric, categorical, then the target (named by
    their schema names)."""
    cols = [Column(s.name, _bin_labels(s.lower, s.upper, bins, s.transform)) for s in schema.numeric]
    cols += [Column(name, (*cats, OTHER)) for name, cats in schema.categorical]
    if schema.target_kind == "multiclass":
        cols.append(Column(schema.target, tuple(schema.classes)))
    elif schema.target_kind == "continuous":
        cols.append(Column(schema.target, _bin_labels(*schema.target_bounds, bins, "none")))
    elif schema.target_labels is not None:  # the declared negative and positive labels
        cols.append(Column(schema.target, tuple(schema.target_labels)))
    else:  # a target of 0/1 (rows with anything else are left out by the loader)
        cols.append(Column(schema.target, ("0", "1")))
    return cols


def row_codes(x: np.ndarray, y: np.ndarray, schema: Schema, *, bins: int) -> np.ndarray:
    """(n, columns) int codes of the encoded rows ``x`` (numeric scaled into [0, 1], one-hot
    categorical blocks) and labels ``y``, in :func:`domain_columns` order."""
    n = x.shape[0]
    out = np.empty((n, len(schema.numeric) + len(schema.categorical) + 1), dtype=np.int64)
    j = 0
    for k in range(len(schema.numeric)):
        out[:, k] = np.minimum(np.floor(np.clip(x[:, j], 0.0, 1.0) * bins), bins - 1)
        j += 1
    for k, (_, cats) in enumerate(schema.categorical):
        out[:, len(schema.numeric) + k] = np.argmax(x[:, j:j + len(cats) + 1], axis=1)
        j += len(cats) + 1
    if schema.target_kind == "continuous":
        out[:, -1] = np.minimum(np.floor(np.clip(y, 0.0, 1.0) * bins), bins - 1)
    else:
        out[:, -1] = np.asarray(y).astype(np.int64)
    if out.size and out.min() < 0:
        raise DPTrainError("a row's cell code is negative: the encoded rows do not match the schema")
    return out


def _uniform_in_bins(codes: np.ndarray, lo: float, hi: float, bins: int, transform: str,
                     rng: np.random.Generator) -> np.ndarray:
    t_lo, t_hi = (math.log1p(lo), math.log1p(hi)) if transform == "log1p" else (lo, hi)
    width = (t_hi - t_lo) / bins
    v = t_lo + (codes + rng.random(codes.size)) * width
    v = np.expm1(v) if transform == "log1p" else v
    return np.clip(v, lo, hi)


def decode_rows(codes: np.ndarray, schema: Schema, *, bins: int, rng: np.random.Generator) -> pd.DataFrame:
    """Rows of codes (:func:`row_codes` order) as a table with the schema's column names: a
    numeric value drawn uniformly within its bin (on the transformed scale), a category's label
    (``<other>`` as such), the target's label (binary: the declared negative or positive label, or 0 / 1)."""
    out: dict[str, np.ndarray] = {}
    for k, s in enumerate(schema.numeric):
        out[s.name] = _uniform_in_bins(codes[:, k], s.lower, s.upper, bins, s.transform, rng)
    for k, (name, cats) in enumerate(schema.categorical):
        out[name] = np.asarray((*cats, OTHER), dtype=object)[codes[:, len(schema.numeric) + k]]
    labels = domain_columns(schema, bins=bins)[-1].levels
    if schema.target_kind == "continuous":
        out[schema.target] = _uniform_in_bins(codes[:, -1], *schema.target_bounds, bins, "none", rng)
    else:
        out[schema.target] = np.asarray(labels, dtype=object)[codes[:, -1]]
    return pd.DataFrame(out)
