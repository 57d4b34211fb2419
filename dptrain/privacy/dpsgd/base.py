"""What every DP-SGD engine is: :class:`GradientEngine`, and a step's :class:`StepStats`.

``engine(x, y)`` takes the examples of one Poisson batch (dptrain.privacy.dpsgd.sampling) and
leaves in every trainable parameter's ``.grad``

    (sum_i clip_C(grad_i) + N(0, sigma^2 C^2 I)) / B

where ``clip_C(v) = v * min(1, C / (||v|| + 1e-6))`` over ALL parameters (flat clipping), the
noise is drawn ONCE per step for the whole sum (:meth:`GradientEngine.step_noise`, the engine's
:class:`~dptrain.privacy.dpsgd.noise.NoiseStream`), and B is the EXPECTED batch size (the
realised batch size is private and is never used to scale). Any optimiser can then consume
``.grad`` (post-processing). A subclass computes the clipped sum (:meth:`~GradientEngine.clipped_sum`)
or, when ``fused``, the whole noisy gradient in one pass (:meth:`~GradientEngine.noisy_grads`);
the engines are in dptrain.privacy.dpsgd.engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dptrain.privacy.curves import bounded_loss_sum
from dptrain.privacy.dpsgd.losses import BCE
from dptrain.privacy.dpsgd.model_check import ADVICE, ModelCheckError, static_problems
from dptrain.privacy.dpsgd.noise import DRAW_DTYPE, NoiseStream

__all__ = ["GradientEngine", "StepStats", "refuse_mixing_models"]

_CLIP_EPS = 1e-6  # as Opacus: factor = C / (norm + 1e-6), capped at 1


@dataclass(frozen=True)
class StepStats:
    """Diagnostics of one step, computed on PRIVATE training rows: not covered by the guarantee.
    ``bounded_loss_sum`` (sum_i min(loss_i, L), with the engine's ``curve_loss_bound`` L) is the
    input of the dp/ curve, which adds its noise (dptrain.privacy.curves); NaN when not computed."""

    batch_size: int
    loss_sum: float
    correct: int
    clipped: int  # examples whose gradient norm exceeded C
    bounded_loss_sum: float = float("nan")


def refuse_mixing_models(model: nn.Module, engine: str) -> None:
    """Every private engine refuses models whose examples are not independent or that keep
    buffers (:mod:`dptrain.privacy.dpsgd.model_check`), whatever else it supports."""
    problems = static_problems(model)
    if problems:
        raise ModelCheckError(f"model is not allowed for DP training ({engine}): " + "; ".join(problems)
                              + ". Allowed: " + ADVICE + ".")


class GradientEngine:
    """Base: holds the model, C, sigma, B and the noise generator."""

    name = "base"
    #: True when :meth:`noisy_grads` computes the whole ``.grad`` in one pass (clipped sum and
    #: division by B folded into each layer's matrix product, then one float64 add of the noise)
    fused = False
    #: private engines refuse models whose examples are not independent (model_check.py)
    checks_model = True

    def __init__(
        self,
        model: nn.Module,
        *,
        max_grad_norm: float,
        noise_multiplier: float,
        expected_batch_size: float,
        generator: torch.Generator,
        objective: Any = None,
    ) -> None:
        if self.checks_model:
            refuse_mixing_models(model, type(self).__name__)
        self.model = model
        #: what the outputs mean: per-example loss, its closed-form gradient, diagnostics (default:
        #: binary cross-entropy on one logit, dptrain.privacy.dpsgd.losses)
        self.objective = objective if objective is not None else BCE
        self.max_grad_norm = float(max_grad_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.generator = generator
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._sizes = [p.numel() for p in self.params]
        #: where the step computes: the parameters' device; the noise generator must be there too
        self.device = self.params[0].device if self.params else torch.device("cpu")
        if any(p.device != self.device for p in self.params):
            raise ValueError("the model's trainable parameters are on more than one device ("
                             + ", ".join(sorted({str(p.device) for p in self.params})) + "); move the model to one")
        if torch.device(generator.device).type != self.device.type:
            raise ValueError(f"the noise generator is on {generator.device} but the model is on {self.device}; "
                             "build it with Randomness.torch(..., device=<the model's device>)")
        # the precision of the noisy gradient: the noise is DRAWN in float64 (DRAW_DTYPE: Box-Muller
        # on 53-bit uniforms, whose tail the report accounts for, dptrain.privacy.noise_law), added
        # to the clipped sum in float64, and the result rounded to this dtype (the parameters'; a
        # float64 model keeps every bit: float32 noise would leave its low-order bits unprotected)
        dtypes = {p.dtype for p in self.params}
        self.noise_dtype = torch.float64 if torch.float64 in dtypes else (dtypes.pop() if len(dtypes) == 1
                                                                          else torch.get_default_dtype())
        #: compute the non-private diagnostics (loss, accuracy, clipped count) of each step;
        #: the training loop switches it on only for the steps it logs.
        self.collect_stats = True
        #: L of the dp/ curve: with it, the stats of a step hold sum_i min(loss_i, L) (set by the
        #: mechanism that releases the curve, dptrain.privacy.curves; None: not computed)
        self.curve_loss_bound: float | None = None
        #: a :class:`dptrain.training.distributed.DistContext` when one job runs across processes
        self.dist = None
        #: the step's noise: one N(0, I) vector per step from ``generator`` (dptrain.privacy.dpsgd.noise;
        #: on the CPU a large model's next vector is drawn in a background thread)
        self.noise = NoiseStream(generator, coordinates=sum(self._sizes), device=self.device, dtype=self.noise_dtype)

    # ------------------------------------------------------------------ noise
    def noise_record(self) -> dict[str, Any]:
        """What the privacy report needs to bound the sampler's tail (dptrain.privacy.noise_law):
        the noise coordinates d of a step, the dtype the noisy gradient is rounded to, the sampler."""
        return self.noise.record()

    @property
    def noise_std(self) -> float:
        """SD of the noise in each coordinate of ``.grad``: sigma C / B (the one formula)."""
        if self.noise_multiplier == 0.0:
            return 0.0
        return self.noise_multiplier * self.max_grad_norm / self.expected_batch_size

    def step_noise(self) -> torch.Tensor | None:
        """This step's flat N(0, I) vector, one per step for the whole model (the noise stream's
        next draw: :func:`dptrain.privacy.dpsgd.noise.standard_normal`), or None when sigma = 0.
        Every engine path and the CUDA-graph step take their noise here."""
        return self.noise.next() if self.noise_std > 0 else None

    def discard_prefetched_noise(self) -> None:
        """Forget a queued draw and rewind the generator to before it (as if never drawn)."""
        self.noise.discard_prefetched()

    def noise_generator_state(self) -> torch.Tensor:
        """The noise generator's state as a sequential run would have it now (for checkpoints):
        a queued, not yet used draw does not count."""
        return self.noise.generator_state()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        fused = self.dist is None and x.shape[0] > 0 and self.fused
        if fused:
            for p in self.params:  # the last step's gradients (the optimiser has consumed them) are
                p.grad = None      # freed before this step's noise vector becomes the new ones
        # ONE Gaussian draw per coordinate per step, for the whole sum: N(0, sigma^2 C^2) / B (across
        # processes rank 0 draws it for the job); the noise stream is the only user of the generator,
        # so drawing before the clipped sum gives the numbers drawing after it would
        noise = self._rank_noise()
        if fused:
            return self._fused_finish(x, y, noise)
        if x.shape[0] == 0:
            sums = [torch.zeros_like(p) for p in self.params]
            stats = StepStats(0, 0.0, 0, 0, 0.0)
        else:
            sums, stats = self.clipped_sum(x, y)
        return self._finish(sums, stats, noise)

    def unit_step(self, x: torch.Tensor, y: torch.Tensor, units: Any) -> StepStats:
        """Person-level DP-SGD's step (dptrain.privacy.dpsgd.units): ``x``, ``y`` the rows of a
        Poisson batch of UNITS, contiguous by unit (``units``: their
        :class:`~dptrain.privacy.dpsgd.units.UnitBatch`). Leaves in ``.grad``
        ``(sum_u clip_C(G_u) + N(0, sigma^2 C^2 I)) / B``, G_u a unit's combined per-row gradients
        and B the expected number of units; the same one noise draw per step as :meth:`__call__`."""
        noise = self._rank_noise()
        if x.shape[0] == 0:
            sums = [torch.zeros_like(p) for p in self.params]
            stats = StepStats(0, 0.0, 0, 0, 0.0)
        else:
            sums, stats = self.unit_clipped_sum(x, y, units)
        return self._finish(sums, stats, noise)

    def _rank_noise(self) -> torch.Tensor | None:
        """This step's noise (:meth:`step_noise`) on the process that draws it (rank 0 across
        processes), None elsewhere."""
        return self.step_noise() if self.dist is None or self.dist.is_main else None

    def unit_clipped_sum(self, x: torch.Tensor, y: torch.Tensor, units: Any) -> tuple[list[torch.Tensor], StepStats]:
        """sum_u clip_C(G_u), one tensor per parameter (G_u: unit u's per-row gradients combined by
        ``units.weights``). An engine without it refuses data.privacy_unit."""
        raise ValueError(f"trainer.engine={self.name} does not support data.privacy_unit (person-level DP-SGD); "
                         "allowed: trainer.engine=auto, fast or opacus")

    def _finish(self, sums: list[torch.Tensor], stats: StepStats, noise: torch.Tensor | None) -> StepStats:
        """``.grad`` = (sums + sigma C noise) / B (across processes: :meth:`_distributed_finish`)."""
        if self.dist is not None:
            return self._distributed_finish(sums, stats, noise)
        inv_b, std = 1.0 / self.expected_batch_size, self.noise_std
        chunks = noise.split(self._sizes) if noise is not None else [None] * len(sums)
        for p, total, z in zip(self.params, sums, chunks):
            total.mul_(inv_b)  # sums are fresh tensors: in place is safe
            if z is not None:  # computed in z's dtype (float64 but for the refined float32 draw), rounded once
                total.add_(z.view_as(total), alpha=std)
            p.grad = total
        return stats

    def _fused_finish(self, x: torch.Tensor, y: torch.Tensor, noise: torch.Tensor | None) -> StepStats:
        grads, stats = self.noisy_grads(x, y, noise=noise, noise_scale=self.noise_std,
                                        sum_scale=1.0 / self.expected_batch_size)
        for p, g in zip(self.params, grads):
            p.grad = g
        return stats

    def noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                    noise_scale: float, sum_scale: float) -> tuple[list[torch.Tensor], StepStats]:
        """``sum_scale * sum_i clip_C(grad_i) + noise_scale * noise`` per parameter (views of one
        fresh flat buffer of the rows' dtype); ``noise`` is a flat N(0, I) vector (from
        :meth:`step_noise`: float64, added in float64 and rounded once, or the refined float32
        draw of a float32 model), or None."""
        raise NotImplementedError

    def _distributed_finish(self, sums: list[torch.Tensor], stats: StepStats, noise: torch.Tensor | None) -> StepStats:
        """Across processes: rank 0 adds the step's ONE noise draw ``noise`` (N(0, I), None on the
        other ranks and without noise) times sigma C to its local clipped sum, one all_reduce adds
        every rank's sum, then all ranks divide by the GLOBAL expected batch size B
        (dptrain.training.distributed)."""
        # in float64 (DRAW_DTYPE) until the end: the float64 noise, then the other ranks' sums,
        # are added without rounding to the model's dtype in between; rounded once, at the end
        flat = torch.cat([s.reshape(-1) for s in sums]).to(DRAW_DTYPE)
        if noise is not None:  # N(0, sigma^2 C^2) on the SUM, before the division by B
            flat.add_(noise, alpha=self.noise_std * self.expected_batch_size)
        self.dist.all_reduce_sum(flat)
        flat.mul_(1.0 / self.expected_batch_size)
        for p, chunk in zip(self.params, flat.split(self._sizes)):
            p.grad = chunk.view_as(p).to(p.dtype, copy=True)
        if self.collect_stats:  # job-wide diagnostics on logged steps (non-private) and the dp/ curve's sum
            t = torch.tensor([stats.batch_size, stats.loss_sum, stats.correct, stats.clipped, stats.bounded_loss_sum],
                             dtype=torch.float64, device=flat.device)
            self.dist.all_reduce_sum(t)
            return StepStats(int(t[0]), float(t[1]), int(t[2]), int(t[3]), float(t[4]))
        return stats

    def step_stats(self, logits: torch.Tensor, y: torch.Tensor, losses: torch.Tensor | None = None,
                   sq_norms: torch.Tensor | None = None) -> StepStats:
        """Diagnostics of a step (computed on private rows: NOT covered by the guarantee), or
        only the realised batch size when ``collect_stats`` is off."""
        n = int(y.shape[0])
        if not self.collect_stats:
            return StepStats(n, float("nan"), 0, 0)
        with torch.no_grad():
            losses = self.objective.per_example_loss(logits, y) if losses is None else losses
            correct = self.objective.correct(logits, y)
            clipped = 0 if sq_norms is None else self.count_clipped(sq_norms)
            bounded = float("nan")
            if self.curve_loss_bound is not None:
                bounded = bounded_loss_sum(losses, self.curve_loss_bound)
            return StepStats(n, float(losses.sum()), correct, clipped, bounded)

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        """Sum over the batch of per-example gradients clipped to C, one tensor per parameter."""
        raise NotImplementedError

    def clip_factors(self, sq_norms: torch.Tensor) -> torch.Tensor:
        """c_i = min(1, C / (||g_i|| + 1e-6)) from squared per-example norms."""
        return (self.max_grad_norm / (sq_norms.sqrt() + _CLIP_EPS)).clamp(max=1.0)

    def count_clipped(self, sq_norms: torch.Tensor) -> int:
        """Examples whose gradient norm exceeds C (a non-private diagnostic)."""
        return int((sq_norms > self.max_grad_norm**2).sum())
