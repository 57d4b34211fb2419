"""Subsample-and-aggregate (``estimator=subsample_aggregate``): DP-SGD on K disjoint parts.

Each row's part is drawn uniformly from the K parts, independently of every other row, from the
run's SECRET randomness (the stream ``subsample-parts``: fresh from the OS CSPRNG, or the opt-in
seed file bound to the rows). So the parts are random subsamples whatever the table looks like:
a table of few distinct rows (a survey table of discrete covariates) gives parts whose make-up
matches the whole, where a partition keyed by the row's content put identical rows in the same
part (parts that were all married or all unmarried). Parallel composition holds: under
add/remove-one-row neighbours the added row falls in one part, and the other rows' parts have
the same distribution with and without it (each is an independent draw). The partition is not
published: it is private like the rows.

Each part is trained with the SAME mechanism (:func:`part_mechanism`), built from PUBLIC numbers
only: N_part = floor(N / K) and the expected batch B_part = max(1, round(q N_part)) with the
run's q = B / N, so each part runs the same number of steps at (about) the same q as a full run;
sigma is given or calibrated for that mechanism. The realised part sizes are private: they are
used only by each part's Poisson sampler (each row joins a step with probability q_part), never
logged, reported or used for a number that is released. Each row is in exactly one part, so by
parallel composition the K part models together (and every function of them: the averaged
model, the table, its intervals) are (epsilon, delta)-DP with ONE part's epsilon; the accountant
records one part's events.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any

import numpy as np
import torch

from dptrain.data.blocks import HashKeys, hash_scores
from dptrain.privacy.dpsgd.mechanism import DPSGDMechanism
from dptrain.privacy.randomness import Randomness
from dptrain.training.fit import LaunchConfig, bound_to_rows, fit
from dptrain.training.plan import TrainingPlan

__all__ = ["random_parts", "part_key", "row_uniform", "part_mechanism", "part_randomness", "fit_parts"]

log = logging.getLogger(__name__)


def part_key(seed: int, person: bytes = b"dptrain-valid") -> bytes:
    """The 16-byte key of a row-keyed split (task=tune's validation rows), from the PUBLIC seed."""
    return hashlib.blake2b(str(int(seed)).encode(), digest_size=16, person=person).digest()


def row_uniform(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, *, seed: int,
                person: bytes = b"dptrain-valid") -> np.ndarray:
    """A number in [0, 1) per row: a keyed hash of the row's own float32 words (features, then
    target) and of its occurrence number among identical rows, SplitMix64 rounds keyed by
    :func:`part_key` (task=tune's validation rows); uniform and independent over rows, identical
    rows included (:func:`dptrain.data.blocks.hash_scores`)."""
    xa = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    ya = np.asarray(y, dtype=np.float32).reshape(len(y), -1)
    bits = (np.concatenate([xa, ya], axis=1) + np.float32(0.0)).view(np.uint32)  # -0.0 -> 0.0
    key = part_key(seed, person)
    words = [lambda start, stop, j=j: bits[start:stop, j].astype(np.uint64) for j in range(bits.shape[1])]
    return hash_scores(len(xa), words, HashKeys.derive(key, bits.shape[1]))


def random_parts(n_rows: int, *, parts: int, randomness: Randomness) -> np.ndarray:
    """The part (0..K-1) of each of ``n_rows`` rows: independent uniform draws from the run's
    secret stream ``subsample-parts`` (module docstring)."""
    return randomness.numpy("subsample-parts").integers(0, parts, size=int(n_rows))


def part_mechanism(plan: TrainingPlan, *, dataset_size: int, delta: float) -> DPSGDMechanism:
    """The mechanism every part runs, from PUBLIC numbers only (module docstring); without a dp/
    curve (the parts' curves would be logged nowhere)."""
    parts = plan.estimator.parts
    n_part = dataset_size // parts
    b_part = max(1, round(plan.loop.batch_size / dataset_size * n_part))
    return DPSGDMechanism.from_budget(plan.budget.dpsgd, max_grad_norm=plan.max_grad_norm, epochs=plan.loop.epochs,
                                      expected_batch_size=b_part, dataset_size=n_part, delta=delta)


def part_randomness(randomness: Any, k: int) -> Any:
    """Part k's secret streams, derived from the run's (fresh from the OS CSPRNG, or the opt-in seed
    file) and the part's index; independent across parts and of the partition's stream."""
    return randomness.child(f"part {k}")


def _part_plan(plan: TrainingPlan) -> TrainingPlan:
    """The part runs' plan: no baseline, no checkpoint, no progress bar, evaluation at the end, no
    dp/ curve (a part's curve would be logged nowhere; :func:`part_mechanism` plans none, so every
    part records the same history)."""
    loop = dataclasses.replace(plan.loop, baseline=False, checkpoint_every=0, progress=False, eval_every=10**9,
                               dp_curves=False)
    return dataclasses.replace(plan, loop=loop)


def fit_parts(plan: TrainingPlan, data: Any, *, mechanism: DPSGDMechanism, randomness: Any = None) -> list[Any]:
    """Train one model per part with :func:`dptrain.training.fit.fit` (dptrain's DP-SGD) under the same
    ``mechanism``; returns the K :class:`dptrain.training.fit.TrainResult` (part order)."""
    k_parts = plan.estimator.parts
    randomness = bound_to_rows(randomness if randomness is not None else Randomness.fresh(), data)
    where = random_parts(len(data.y_train), parts=k_parts, randomness=randomness)
    part_cfg = _part_plan(plan)
    results = []
    for k in range(k_parts):
        rows = torch.from_numpy(np.flatnonzero(where == k))
        part = dataclasses.replace(data, x_train=data.x_train.index_select(0, rows).contiguous(),
                                   y_train=data.y_train.index_select(0, rows).contiguous(), diagnostics={})
        results.append(fit(part_cfg, part, mechanism=mechanism,
                           launch=LaunchConfig(randomness=part_randomness(randomness, k))))
        log.info("subsample_aggregate: part %d of %d trained", k + 1, k_parts)
    histories = {tuple(r.accountant.history) for r in results}
    if len(histories) != 1:  # every part runs the same planned steps of the same mechanism
        raise RuntimeError("subsample_aggregate: the parts' privacy histories differ")
    return results
