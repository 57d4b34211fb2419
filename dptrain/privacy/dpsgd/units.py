"""Person-level DP-SGD: Poisson sampling of UNITS and each unit's combined gradient clipped to C.

With a unit of privacy (``data.privacy_unit``: a person, household or establishment id) the
neighbouring data sets differ by ALL rows of one unit. A step then

1. samples units, not rows: each of the N units joins the batch independently with probability
   q = B / N (:class:`UnitPoissonSampler`, the same Poisson sampler over unit indices), and takes
   every one of its rows (at most k: the cap is applied once before training,
   :func:`dptrain.data.units.cap_rows_per_unit`);
2. combines a unit's per-row gradients, ``mean`` (each unit weighs the same) or ``sum``:
   G_u = sum_{i in u} w_i grad_i with w_i = 1 / n_u or 1;
3. clips the combination, c_u = min(1, C / (||G_u|| + 1e-6)), and the engine sums c_u G_u over
   the units, adds N(0, sigma^2 C^2 I) and divides by B, the EXPECTED number of units.

Adding or removing one unit adds or removes one term c_u G_u of norm at most C: the sensitivity
of the sum is C, and the accountant's Poisson-subsampled Gaussian is the same, in units.

The engines need no per-unit gradient: for a Linear layer z = a W^T + b, example i's gradient is
g_i (a_i, 1)^T, so ||G_u||^2 = sum_{i, j in u} w_i w_j (g_i . g_j)(a_i . a_j + 1) summed over the
layers (:func:`unit_sq_norms`: per unit, the Gram matrices of its rows' inputs and output gradients,
two batched matrix products over blocks of the units' rows; one Linear layer: a segment-sum,
``index_add_``, of the rows' gradients into each unit's),
and sum_u c_u G_u = sum_i (c_{u(i)} w_i) grad_i is the row engine's matrix product with the row
factor c_{u(i)} w_i in place of the row's clip factor (:attr:`UnitBatch.factors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from dptrain.privacy.dpsgd.base import StepStats
from dptrain.privacy.dpsgd.sampling import PoissonSampler

__all__ = ["COMBINES", "UnitBatch", "UnitBatchStep", "UnitBound", "UnitPoissonSampler", "fast_unit_sums",
           "rows_by_unit", "unit_factors", "unit_sq_norms"]

#: how a unit's per-row gradients are combined before clipping (privacy.unit_combine)
COMBINES = ("mean", "sum")


@dataclass(frozen=True)
class UnitBound:
    """A run's unit of privacy: the column (``data.privacy_unit``), k (``privacy.max_rows_per_unit``)
    and how a unit's rows are combined (``privacy.unit_combine``). Public settings."""

    column: str
    max_rows: int
    combine: str = "mean"

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise ValueError(f"privacy.unit_combine={self.combine!r}: must be one of {', '.join(COMBINES)}")
        if isinstance(self.max_rows, bool) or not isinstance(self.max_rows, int) or self.max_rows < 1:
            raise ValueError(f"privacy.max_rows_per_unit={self.max_rows!r}: must be an integer >= 1")

    def report(self) -> dict[str, Any]:
        """The report's ``unit_of_privacy``."""
        return {"column": self.column, "max_rows_per_unit": self.max_rows, "combine": self.combine,
                "neighbours": f"add or remove ALL rows of one {self.column} (at most {self.max_rows} counted, a "
                              "secret uniform choice among its rows)"}


@dataclass
class UnitBatch:
    """One step's sampled units, their rows contiguous in the batch: ``index`` (n,) each row's
    unit in the batch (0..n_units-1), ``weights`` (n,) w_i (1 / n_u for mean, None for sum),
    ``counts`` each unit's rows (:meth:`slots` places them in blocks for the norms). Everything in
    it is PRIVATE (which units, how many rows)."""

    index: torch.Tensor
    n_units: int
    weights: torch.Tensor | None
    counts: np.ndarray
    device: torch.device = torch.device("cpu")

    @classmethod
    def of_counts(cls, counts: np.ndarray, *, combine: str, dtype: torch.dtype,
                  device: torch.device | str = "cpu") -> UnitBatch:
        """The batch layout of units with ``counts`` rows each, in order."""
        counts = np.asarray(counts, dtype=np.int64)
        dev = torch.device(device)
        index = torch.from_numpy(np.repeat(np.arange(counts.size, dtype=np.int64), counts)).to(dev)
        weights = None
        if combine == "mean":
            weights = torch.from_numpy(1.0 / np.repeat(counts, counts)).to(device=dev, dtype=dtype)
        return cls(index, int(counts.size), weights, counts, dev)

    def slots(self) -> tuple[torch.Tensor, int]:
        """(slot, k_max): row r of unit u at position t among its rows goes to slot u k_max + t of
        a (n_units k_max)-row block; k_max the most rows of a unit in the batch."""
        width = int(self.counts.max()) if self.counts.size else 1
        offsets = np.r_[0, np.cumsum(self.counts)[:-1]] if self.counts.size else np.zeros(0, dtype=np.int64)
        local = np.arange(int(self.counts.sum()), dtype=np.int64) - np.repeat(offsets, self.counts)
        slot = np.repeat(np.arange(self.counts.size, dtype=np.int64), self.counts) * width + local
        return torch.from_numpy(slot).to(self.device), width


def unit_sq_norms(inputs: list[torch.Tensor], out_grads: list[torch.Tensor], has_bias: list[bool],
                  units: UnitBatch) -> torch.Tensor:
    """||G_u||^2 per unit (n_units,): sum over the pairs (i, j) of one unit and over the layers of
    w_i w_j (g_i . g_j)(a_i . a_j + [bias]), from each layer's inputs a (n, d) and output
    gradients g (n, K) or (n,) (:mod:`dptrain.privacy.dpsgd.fast`'s trace). Each unit's rows are
    placed in a (k_max, width) block (:meth:`UnitBatch.slots`, zero rows as padding) and the
    per-unit Gram matrices of a and of w g are two batched matrix products; a padding row has
    g = 0, so it adds nothing."""
    slot, width = units.slots()
    total = None
    for a, g, bias in zip(inputs, out_grads, has_bias):
        g = g[:, None] if g.dim() == 1 else g
        if units.weights is not None:
            g = g * units.weights[:, None].to(g.dtype)
        gram = []
        for m in (a, g):
            block = torch.zeros(units.n_units * width, m.shape[1], dtype=m.dtype, device=m.device)
            block.index_copy_(0, slot, m)
            block = block.view(units.n_units, width, m.shape[1])
            gram.append(torch.bmm(block, block.transpose(1, 2)))
        if bias:
            gram[0].add_(1.0)
        term = (gram[0] * gram[1]).sum((1, 2))
        total = term if total is None else total.add_(term)
    return total.clamp_(min=0.0)  # a sum of squares, up to rounding


def unit_factors(engine: Any, unit_sq: torch.Tensor, units: UnitBatch) -> torch.Tensor:
    """Each row's factor c_{u(i)} w_i: its unit's clip factor times its combination weight."""
    f = engine.clip_factors(unit_sq).index_select(0, units.index)
    return f if units.weights is None else f.mul_(units.weights)


def unit_stats(engine: Any, logits: torch.Tensor, y: torch.Tensor, losses: Any, unit_sq: torch.Tensor | None,
               units: UnitBatch) -> StepStats:
    """The step's diagnostics; ``clipped`` counts the rows of the units clipped, and the dp/
    curve's input (with the engine's ``curve_loss_bound`` L) is per UNIT: sum_u min(sum_{i in u}
    w_i min(loss_i, L), L), so one unit moves it by at most L (:func:`unit_bounded_loss_sum`)."""
    stats = engine.step_stats(logits, y, losses)
    if not engine.collect_stats:
        return stats
    clipped = 0 if unit_sq is None else int((unit_sq > engine.max_grad_norm ** 2).index_select(0, units.index).sum())
    bounded = stats.bounded_loss_sum
    if engine.curve_loss_bound is not None:
        with torch.no_grad():
            rows = engine.objective.per_example_loss(logits, y) if losses is None else losses
            bounded = unit_bounded_loss_sum(rows, engine.curve_loss_bound, units)
    return StepStats(stats.batch_size, stats.loss_sum, stats.correct, clipped, bounded)


def unit_bounded_loss_sum(losses: torch.Tensor, bound: float, units: UnitBatch) -> float:
    """sum over units of min(sum_{i in u} w_i min(max(loss_i, 0), L), L) in float64 (a non-finite
    loss counts as L or 0, as :func:`dptrain.privacy.curves.bounded_loss_sum`): each unit adds a
    number in [0, L]."""
    b = float(bound)
    clean = torch.nan_to_num(losses.detach().to(torch.float64), nan=b, posinf=b, neginf=0.0).clamp_(0.0, b)
    if units.weights is not None:
        clean.mul_(units.weights.to(torch.float64))
    per_unit = torch.zeros(units.n_units, dtype=torch.float64, device=clean.device).index_add_(0, units.index, clean)
    return float(per_unit.clamp_(max=b).sum())


def _autograd_trace(engine: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[list, list, torch.Tensor, torch.Tensor]:
    """(each Linear's input, its output gradient, logits, per-row losses) by autograd, for a
    Sequential of Linear layers and elementwise activations (the fast engine's models)."""
    inputs: list[torch.Tensor] = []
    out_grads: list[Any] = [None] * len(engine.linears)

    def capture(k: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            out_grads[k] = grad
        return hook

    h = x
    with torch.enable_grad():
        for m in engine.layers:
            if isinstance(m, nn.Linear):
                inputs.append(h.detach())
                h = m(h)
                h.register_hook(capture(len(inputs) - 1))
            else:
                h = m(h)
        losses = engine.objective.per_example_loss(h, y)
        torch.autograd.grad(losses.sum(), engine._backward_target)
    return inputs, out_grads, h.detach(), losses.detach()


@torch.no_grad()
def _products(engine: Any, inputs: list, out_grads: list, factors: torch.Tensor) -> list[torch.Tensor]:
    """sum_i f_i grad_i per parameter: (f * g)^T a for each weight, f^T g for each bias."""
    grad_of: dict[int, torch.Tensor] = {}
    for a, g, lin in zip(inputs, out_grads, engine.linears):
        g = g[:, None] if g.dim() == 1 else g
        fg = g * factors[:, None]
        grad_of[id(lin.weight)] = fg.t() @ a
        if lin.bias is not None:
            grad_of[id(lin.bias)] = fg.sum(0)
    return [grad_of[id(p)] for p in engine.params]


def fast_unit_sums(engine: Any, x: torch.Tensor, y: torch.Tensor,
                   units: UnitBatch) -> tuple[list[torch.Tensor], StepStats]:
    """sum_u clip_C(G_u) on the fast engine (:class:`~dptrain.privacy.dpsgd.fast.FastLinearEngine`):
    the rows' layer inputs and output gradients (closed form for one Linear, the buffered forward
    and backward for a plain stack, autograd otherwise), the units' norms by
    :func:`unit_sq_norms`, then the row engine's products with the factors c_{u(i)} w_i."""
    if engine.closed_form:
        return _closed_form_unit_sums(engine, x, y, units)
    with torch.no_grad():
        if engine.plan is not None:
            ws = engine.workspace(x.shape[0], x.dtype)
            inputs, aug_inputs, pre, post, logits = engine._buffered_forward(x, ws)
            losses = engine.objective.per_example_loss(logits, y) if engine.collect_stats else None
            out_grads = engine._buffered_backward(logits, y, ws, pre, post)
        else:
            inputs, out_grads, logits, losses = _autograd_trace(engine, x, y)
        unit_sq = unit_sq_norms(inputs, out_grads, engine._has_bias, units)
        stats = unit_stats(engine, logits, y, losses, unit_sq, units)
        factors = unit_factors(engine, unit_sq, units)
        if engine.plan is not None:
            flat, views = engine._grad_views(x.dtype)
            engine._buffered_products(ws, factors, (inputs, aug_inputs, out_grads), views=views, sum_scale=1.0)
            return [views[id(p)] for p in engine.params], stats
        return _products(engine, inputs, out_grads, factors), stats


@torch.no_grad()
def _closed_form_unit_sums(engine: Any, x: torch.Tensor, y: torch.Tensor,
                           units: UnitBatch) -> tuple[list[torch.Tensor], StepStats]:
    """One Linear layer (logit, multinomial, linear): each unit's combined gradient
    G_u = sum_{i in u} w_i g_i (x_i, 1)^T formed by a segment-sum (``index_add_``) of the rows'
    (K, d + 1) gradients, clipped, summed: O(rows x K x d), no pair of rows."""
    lin = engine.layers[0]
    z = lin(x)
    logits = z.view(-1) if lin.out_features == 1 else z  # as the row engine's closed forms
    g = engine.objective.output_gradient(logits, y)
    g = g[:, None] if g.dim() == 1 else g  # (n, K)
    if units.weights is not None:
        g = g * units.weights[:, None]
    a = x if lin.bias is None else torch.cat([x, torch.ones_like(x[:, :1])], 1)  # (n, d [+ 1])
    per_unit = torch.zeros(units.n_units, g.shape[1], a.shape[1], dtype=x.dtype, device=x.device)
    per_unit.index_add_(0, units.index, g[:, :, None] * a[:, None, :])
    unit_sq = per_unit.square().sum((1, 2))
    total = torch.einsum("u,ukd->kd", engine.clip_factors(unit_sq), per_unit)
    grads = {id(lin.weight): total[:, :x.shape[1]].reshape(lin.weight.shape).contiguous()}
    if lin.bias is not None:
        grads[id(lin.bias)] = total[:, -1].reshape(lin.bias.shape).contiguous()
    return [grads[id(p)] for p in engine.params], unit_stats(engine, logits, y, None, unit_sq, units)


class UnitPoissonSampler:
    """Poisson sampling of units: each of the N units joins a step's batch independently with
    probability q (:class:`~dptrain.privacy.dpsgd.sampling.PoissonSampler` over unit indices, its
    stream the secret sampler stream), then every row of the sampled units. The rows must be
    ordered by unit: ``starts[u]``, ``counts[u]`` locate unit u's rows."""

    def __init__(self, *, starts: np.ndarray, counts: np.ndarray, sample_rate: float, rng: np.random.Generator,
                 combine: str) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.combine = combine
        self.units = PoissonSampler(num_rows=len(self.counts), sample_rate=sample_rate, rng=rng)
        self.device = torch.device("cpu")

    @property
    def sample_rate(self) -> float:
        return self.units.sample_rate

    def sample(self, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, UnitBatch]:
        """(row indices on the CPU, the batch's :class:`UnitBatch` on ``device``) of one Poisson
        batch of units."""
        sel = self.units.sample().numpy()
        counts = self.counts[sel]
        total = int(counts.sum())
        first = np.repeat(self.starts[sel] - np.r_[0, np.cumsum(counts)[:-1]] if sel.size else sel, counts)
        rows = first + np.arange(total, dtype=np.int64)
        return torch.from_numpy(rows), UnitBatch.of_counts(counts, combine=self.combine, dtype=dtype, device=device)

    def get_state(self) -> dict:
        return self.units.get_state()

    def set_state(self, state: Any) -> None:
        self.units.set_state(state)


class UnitBatchStep:
    """``step()`` for person-level DP-SGD: draws a Poisson batch of units and runs the engine's
    unit step on their rows (:meth:`~dptrain.privacy.dpsgd.base.GradientEngine.unit_step`);
    returns its StepStats. The same role as :class:`dptrain.privacy.dpsgd.graph.BatchStep`
    (never replayed as a CUDA graph: the units of a batch vary in number and size)."""

    graph_reason = "unit batches (data.privacy_unit) are not replayed as a CUDA graph"
    graphed = False

    def __init__(self, engine: Any, sampler: UnitPoissonSampler, x: torch.Tensor, y: torch.Tensor) -> None:
        self.engine, self.sampler, self.x, self.y = engine, sampler, x, y

    def __call__(self) -> StepStats:
        rows, units = self.sampler.sample(self.x.dtype, self.x.device)
        rows = rows.to(self.x.device)
        return self.engine.unit_step(self.x.index_select(0, rows), self.y.index_select(0, rows), units)


def rows_by_unit(unit_of_row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, starts, counts): the rows sorted by unit (stable), and each unit's first position
    and number of rows in that order (units 0..N-1, each with at least one row)."""
    unit_of_row = np.asarray(unit_of_row, dtype=np.int64)
    order = np.argsort(unit_of_row, kind="stable")
    counts = np.bincount(unit_of_row)
    starts = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64)
    return order, starts, counts
