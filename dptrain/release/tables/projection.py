"""Projections and roundings shared by the table releases (:mod:`dptrain.release.tables.marginals`,
:mod:`dptrain.release.tables.topdown`): the Euclidean projection of vectors onto the scaled
simplex {x >= 0, sum x = total} (batched along the last axis, with a mask of valid entries), and
controlled rounding that keeps each vector's integer total (largest remainders, ties in a given
random order)."""

from __future__ import annotations

import numpy as np

__all__ = ["integer_split", "project_simplex", "round_to_total", "simplex_threshold", "valid_mask"]

_SNAP = 1e-9  # a fitted value this close (relative) to an integer is that integer before rounding


def valid_mask(y: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    return np.ones(y.shape, dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), y.shape)


def simplex_threshold(y: np.ndarray, total: np.ndarray | float, mask: np.ndarray | None = None) -> np.ndarray:
    """theta for every vector along the last axis of ``y``: sum over the valid entries (``mask``,
    default all) of max(y - theta, 0) equals ``total`` (>= 0; shape ``y.shape[:-1]``). Sort-based:
    with u the valid entries in decreasing order and c_j their partial sums, r is the largest j
    with u_j > (c_j - total) / j and theta = (c_r - total) / r (r = 1 when total is 0)."""
    y = np.asarray(y, dtype=np.float64)
    total = np.broadcast_to(np.asarray(total, dtype=np.float64), y.shape[:-1])
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(total)) and np.all(total >= 0)):
        raise ValueError("simplex_threshold needs finite values and totals >= 0")
    valid = valid_mask(y, mask)
    u = -np.sort(-np.where(valid, y, -np.inf), axis=-1)
    ok = np.isfinite(u)
    cs = np.cumsum(np.where(ok, u, 0.0), axis=-1)
    j = np.arange(1, y.shape[-1] + 1, dtype=np.float64)
    cond = ok & (u * j > cs - total[..., None])
    last = y.shape[-1] - np.argmax(cond[..., ::-1], axis=-1)  # 1 + index of the last True
    r = np.where(cond.any(axis=-1), last, 1)
    return (np.take_along_axis(cs, (r - 1)[..., None], axis=-1)[..., 0] - total) / r


def project_simplex(y: np.ndarray, total: np.ndarray | float, mask: np.ndarray | None = None) -> np.ndarray:
    """The Euclidean projection of each vector along the last axis of ``y`` onto
    {x >= 0, sum x = total}, over the valid entries (``mask``); 0 at the others."""
    y = np.asarray(y, dtype=np.float64)
    theta = simplex_threshold(y, total, mask)
    return np.where(valid_mask(y, mask), np.maximum(y - theta[..., None], 0.0), 0.0)


def integer_split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(integer part, fractional part) of ``x`` >= 0, values within a relative 1e-9 of an integer
    snapped to it (so a fit that lands on 3 - 1e-12 is 3, not 2 plus a remainder)."""
    near = np.rint(x)
    snap = np.abs(x - near) <= _SNAP * (1.0 + np.abs(x))
    base = np.where(snap, near, np.floor(x))
    return base.astype(np.int64), np.where(snap, 0.0, x - base)


def round_to_total(x: np.ndarray, total: np.ndarray | int, mask: np.ndarray | None = None, *,
                   rng: np.random.Generator | None = None) -> np.ndarray:
    """Controlled rounding along the last axis: every valid entry of ``x`` (>= 0, summing to the
    integer ``total``) goes to its floor or its ceiling, and the valid entries sum to ``total``
    exactly: the floors, plus one for the largest fractional parts (largest remainders). int64; 0
    at the entries outside ``mask``.

    Ties (fractional parts equal to 1e-9) go to the lower index, or in random order with ``rng``.
    They are the rule, not the exception, after a projection: integer measurements shifted by one
    threshold all have the same fractional part, and a fixed order would hand the extra units to
    the first children every time (a bias by position)."""
    x = np.asarray(x, dtype=np.float64)
    valid = valid_mask(x, mask)
    base, frac = integer_split(np.where(valid, np.maximum(x, 0.0), 0.0))
    base = np.where(valid, base, 0)
    deficit = np.asarray(total, dtype=np.int64) - base.sum(axis=-1)
    if np.any(deficit < 0) or np.any(deficit > valid.sum(axis=-1)):
        raise ValueError("round_to_total needs values whose sum is the integer total")
    key = -np.rint(np.where(valid, frac, -1.0) * 1e9)  # equal to 1e-9: a tie
    if rng is None:
        order = np.argsort(key, axis=-1, kind="stable")
    else:
        order = np.lexsort((rng.random(x.shape), key), axis=-1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(x.shape[-1]), x.shape), axis=-1)
    return base + (valid & (rank < deficit[..., None])).astype(np.int64)
