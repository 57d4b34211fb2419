"""The DP-SGD step: Poisson sampling, per-example clipping, Gaussian noise (docs/privacy.md).

One small interface, :class:`GradientEngine`: ``engine(x, y)`` takes the examples of one
Poisson batch and leaves in every trainable parameter's ``.grad``

    (sum_i clip_C(grad_i) + N(0, sigma^2 C^2 I)) / B

where ``clip_C(v) = v * min(1, C / (||v|| + 1e-6))`` over ALL parameters (flat clipping), the
noise is drawn ONCE per step for the whole sum, and B is the EXPECTED batch size (the realised
batch size is private and is never used to scale). Any optimiser can then consume ``.grad``
(post-processing). The noise is drawn in float64 (Box-Muller on 53-bit uniforms), added to the
clipped sum in float64 and the result rounded once to the model's dtype: float32 draws would be
a Gaussian truncated at |z| <= 5.77 (dptrain.privacy.noise_law bounds the float64 sampler's tail).

Engines:

* :class:`FastLinearEngine` ("fast"): models made of ``nn.Linear`` layers and elementwise
  activations. Per-example gradient norms from ``||g_i||^2 (||a_i||^2 + 1)`` per layer and the
  clipped sum as one matrix product per layer (book-keeping; Goodfellow 2015, Li et al. 2022,
  Bu et al. 2023; docs/engine.md). Never materialises per-example gradients. A plain stack
  (Linear, activation, ..., Linear(., 1) + Squeeze, or a Linear(., K) head with K > 1 for
  multi-output objectives) runs without autograd on buffers reused from step to step, with the
  bias gradients and 1/B folded into the same matrix products, then the float64 noise added.
* :class:`OpacusEngine` ("opacus"): any model Opacus' ``GradSampleModule`` supports; per-example
  gradients are materialised by Opacus' hooks, clipping and noise are done here.
* :class:`NonPrivateEngine`: the same pipeline with no clipping and no noise (sum / B).
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from dptrain.core.registry import Registry
from dptrain.privacy.curves import bounded_loss_sum
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.losses import BCE
from dptrain.privacy.dpsgd.model_check import ADVICE, ModelCheckError, static_problems

log = logging.getLogger(__name__)

_CLIP_EPS = 1e-6  # as Opacus: factor = C / (norm + 1e-6), capped at 1
#: the noise is drawn and added in float64 whatever the model's dtype (dptrain.privacy.noise_law)
DRAW_DTYPE = torch.float64
_TWO_PI = 2.0 * math.pi
#: below this many coordinates torch's own (scalar) float64 normal_ is as fast as the vectorised copy
_VECTOR_NORMAL_MIN = 512


def _box_muller16(u: torch.Tensor, out: torch.Tensor) -> None:
    """torch's CPU ``normal_fill_16`` on k blocks of 16 float64 uniforms ``u`` (k * 16,): in each
    block u1 = 1 - u[j], u2 = u[j + 8] (j < 8) give out[j] = R cos(2 pi u2), out[j + 8] =
    R sin(2 pi u2), R = sqrt(-2 ln u1); vectorised over the blocks."""
    b, o = u.view(-1, 2, 8), out.view(-1, 2, 8)
    radius = torch.log(torch.rsub(b[:, 0], 1.0)).mul_(-2.0).sqrt_()
    theta = b[:, 1] * _TWO_PI
    torch.mul(radius, torch.cos(theta), out=o[:, 0])
    torch.mul(radius, theta.sin_(), out=o[:, 1])


def standard_normal64(n: int, *, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """n N(0, 1) numbers in float64: torch's ``normal_`` (Box-Muller on 53-bit uniforms,
    dptrain.privacy.noise_law). On the CPU, for n >= 512, the same algorithm on the same
    uniforms in the same order (n of them, then 16 more for the last block when 16 does not
    divide n), vectorised: torch's float64 normal_ evaluates its logs and cosines one number at a
    time (5x its float32 draw). The same generator state follows either way; values agree to
    within rounding of the last bit."""
    if device.type != "cpu" or n < _VECTOR_NORMAL_MIN:
        return torch.empty(n, dtype=DRAW_DTYPE, device=device).normal_(0.0, 1.0, generator=generator)
    rest = n % 16
    u = torch.empty(n + (16 if rest else 0), dtype=DRAW_DTYPE, device=device).uniform_(0.0, 1.0, generator=generator)
    z = torch.empty(n, dtype=DRAW_DTYPE, device=device)
    _box_muller16(u[:n - rest], z[:n - rest])
    if rest:  # torch redraws the last 16 numbers (overlapping the last full block)
        last = torch.empty(16, dtype=DRAW_DTYPE, device=device)
        _box_muller16(u[n:], last)
        z[n - 16:] = last
    return z


#: the refined float32 sampler (:func:`standard_normal32_refined`): a pair's 24-bit u1 at or below
#: this is refined with 53 more bits (the pairs whose radius is >= sqrt(24 ln 2) = 4.08)
REFINE_BELOW = 2.0 ** -12


def standard_normal32_refined(n: int, *, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """n N(0, 1) numbers in float32 by Box-Muller whose tail is not truncated at 5.77 (torch's
    float32 ``normal_``, on 24-bit uniforms, never exceeds it): pairs ``R (cos t, sin t)`` with
    ``t = 2 pi u2`` (u2 a 24-bit uniform) and ``R = sqrt(-2 ln u1)``, where ``u1 = 1 - k 2^-24``
    (k a 24-bit uniform integer) and, wherever ``u1 <= 2^-12``, ``u1 - v 2^-24`` with ``v`` a
    53-bit uniform: exactly uniform on a 2^-77 grid there, so ``R <= sqrt(154 ln 2) = 10.33`` and
    the Gaussian pair mass beyond is 2^-77 (dptrain.privacy.noise_law). Cost: about that of the
    float32 normal_ (one float32 uniform per number; the refinement touches ~1 pair in 4,096),
    a quarter of a float64 draw's."""
    h = (n + 1) // 2
    u = torch.empty(2 * h, dtype=torch.float32, device=device).uniform_(0.0, 1.0, generator=generator)
    return refined_box_muller(u, lambda k: torch.empty(k, dtype=torch.float64, device=device).uniform_(
        0.0, 1.0, generator=generator))[:n]


def refined_box_muller(u: torch.Tensor, refine: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """The transform of :func:`standard_normal32_refined`: 2h float32 uniforms ``u`` (u1 = 1 -
    u[:h], u2 = u[h:]) and ``refine(k)``, k float64 uniforms for the pairs whose u1 <= 2^-12, in
    order; returns the 2h numbers, first the cosines, then the sines (``u`` is overwritten)."""
    h = u.numel() // 2
    u1 = torch.rsub(u[:h], 1.0)  # 1 - k 2^-24: exact in float32, in [2^-24, 1]
    r = torch.log(u1)
    tail = (u1 <= REFINE_BELOW).nonzero().squeeze(1)
    if tail.numel():  # the far tail: u1 refined with 53 more uniform bits, its log taken in float64
        r[tail] = torch.log(u1[tail].double() - refine(tail.numel()) * 2.0 ** -24).float()
    r.mul_(-2.0).sqrt_()
    theta = u[h:].mul_(_TWO_PI)
    z = torch.empty(2 * h, dtype=torch.float32, device=u.device)
    torch.mul(r, torch.cos(theta), out=z[:h])
    torch.mul(r, theta.sin_(), out=z[h:])
    return z


def _lowest_cpu_priority() -> None:
    """Run the calling thread only when a CPU would otherwise idle (Linux SCHED_IDLE), so a
    background noise draw fills gaps instead of slowing the step's parallel regions."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not permitted: an ordinary thread
        pass


class PoissonSampler:
    """Poisson subsampling over in-memory rows: each of the N rows joins a batch independently
    with probability q. Batches vary in size and may be empty (a noise-only step).

    Two exact implementations of the same law: for q > 0.1 a Bernoulli mask over all rows
    (O(N)); otherwise the batch size k ~ Binomial(N, q), then a uniform k-subset without
    replacement (numpy's ``Generator.choice``, O(k), so a step does not cost O(N) when N is in
    the millions). Given its size a Poisson batch is a uniform subset, so both are the same law.
    Drawn with numpy (single-threaded: no OpenMP wake-ups on tiny steps); indices are returned
    sorted ascending as an int64 tensor.
    """

    DENSE_ABOVE = 0.1

    def __init__(self, *, num_rows: int, sample_rate: float, rng: np.random.Generator) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate={sample_rate!r} is not allowed: must be in [0, 1]")
        self.num_rows = int(num_rows)
        self.sample_rate = float(sample_rate)
        self.rng = rng

    def sample(self) -> torch.Tensor:
        """Indices (int64, sorted ascending, distinct) of one Poisson batch."""
        n, rng = self.num_rows, self.rng
        if self.sample_rate > self.DENSE_ABOVE:
            idx = np.flatnonzero(rng.random(n) < self.sample_rate)
        else:
            idx = np.sort(rng.choice(n, size=rng.binomial(n, self.sample_rate), replace=False))
        return torch.from_numpy(idx.astype(np.int64, copy=False))

    device = torch.device("cpu")

    def get_state(self) -> dict:
        """The stream's state (for checkpoints of reproducible-noise runs)."""
        return self.rng.bit_generator.state

    def set_state(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise ValueError("this sampler's state was saved by a sampler on another device (a torch generator's "
                             "state, not numpy's)")
        self.rng.bit_generator.state = state


class DevicePoissonSampler:
    """Poisson subsampling on a torch device (a GPU): row i joins the batch iff u_i < q with
    u_i ~ U[0, 1) drawn by ``generator`` on that device, one draw per row per step. The same law
    as :class:`PoissonSampler` (independent Bernoulli(q) memberships); O(N) per step, which a GPU
    does in parallel (20 million rows in well under a millisecond), and no index ever crosses
    to the host. Indices are returned sorted ascending as an int64 tensor on the device."""

    def __init__(self, *, num_rows: int, sample_rate: float, generator: torch.Generator) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate={sample_rate!r} is not allowed: must be in [0, 1]")
        self.num_rows = int(num_rows)
        self.sample_rate = float(sample_rate)
        self.generator = generator
        self.device = torch.device(generator.device)

    def sample(self) -> torch.Tensor:
        """Indices (int64, sorted ascending, distinct, on the device) of one Poisson batch."""
        # float64: P(u < q) is q to within 2^-53 (float32's 2^-24 grid would include rows slightly
        # more often than the q the accountant is told)
        u = torch.rand(self.num_rows, generator=self.generator, device=self.device, dtype=torch.float64)
        return torch.nonzero(u < self.sample_rate).view(-1)

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: Any) -> None:
        mine = self.generator.get_state()
        if not isinstance(state, torch.Tensor) or state.numel() != mine.numel():
            raise ValueError(f"this sampler's state was saved by a sampler on another device (this one runs on "
                             f"{self.device})")
        self.generator.set_state(state)


class PinnedPoissonSampler(PoissonSampler):
    """:class:`PoissonSampler`'s draws (numpy on the host, O(batch) per step, the same law and
    the same stream) for rows on a GPU: each batch's indices are copied to the device from
    page-locked host memory without waiting (``non_blocking``), so the host never waits for the
    GPU to learn the batch's size.

    :class:`DevicePoissonSampler` draws on the GPU, but its batch SIZE is only known there:
    ``nonzero`` makes the host wait for the GPU every step. Knowing the size on the host is what
    lets a step replay a CUDA graph over a padded batch (dptrain.privacy.dpsgd.graph); without the
    graph this sampler alone was no faster on an H100 (experiments/performance/README.md, "CUDA
    graph"). Only the indices cross to the device (32 KB at B = 4,096), never a row; they live
    in this process's memory, as on the CPU."""

    def __init__(self, *, num_rows: int, sample_rate: float, rng: np.random.Generator,
                 device: torch.device | str) -> None:
        super().__init__(num_rows=num_rows, sample_rate=sample_rate, rng=rng)
        self.device = torch.device(device)

    def sample(self) -> torch.Tensor:
        """Indices (int64, sorted ascending, distinct, on the device) of one Poisson batch."""
        return self.to_device(self.draw())

    def draw(self) -> torch.Tensor:
        """One Poisson batch's indices on the host (the next draw of the stream)."""
        return super().sample()

    def to_device(self, idx: torch.Tensor) -> torch.Tensor:
        """Host indices copied to the device without waiting for it."""
        if self.device.type == "cpu":
            return idx
        # the pinned block goes back to torch's host allocator when `pinned` is dropped, which
        # reuses it only once the copy has finished (the copy records an event on it)
        pinned = idx.pin_memory()
        return pinned.to(self.device, non_blocking=True)


def make_sampler(*, num_rows: int, sample_rate: float, randomness: Any, index: int,
                 device: torch.device | str = "cpu") -> PoissonSampler | DevicePoissonSampler:
    """The Poisson sampler for rows on ``device``, its stream the SECRET "poisson-sampler"
    stream ``index`` (a rank) of ``randomness``: numpy on the CPU (:class:`PoissonSampler`,
    O(batch) per step); on a GPU the same numpy draws with the indices copied to the device
    asynchronously (:class:`PinnedPoissonSampler`) when q <= ``PoissonSampler.DENSE_ABOVE``
    (0.1), else a torch generator on the device (:class:`DevicePoissonSampler`: O(N) per step,
    which the host would do serially; a wait for the GPU each step)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return PoissonSampler(num_rows=num_rows, sample_rate=sample_rate,
                              rng=randomness.numpy("poisson-sampler", index))
    if sample_rate <= PoissonSampler.DENSE_ABOVE:
        return PinnedPoissonSampler(num_rows=num_rows, sample_rate=sample_rate,
                                    rng=randomness.numpy("poisson-sampler", index), device=dev)
    return DevicePoissonSampler(num_rows=num_rows, sample_rate=sample_rate,
                                generator=randomness.torch("poisson-sampler", index, device=dev))


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


def _row_sq_norms(m: torch.Tensor) -> torch.Tensor:
    """||m_i||^2 per row, without materialising m * m."""
    return torch.linalg.vector_norm(m, dim=1).square()


def _refuse_mixing_models(model: nn.Module, engine: str) -> None:
    """Every private engine refuses models whose examples are not independent or that keep
    buffers (:mod:`dptrain.privacy.dpsgd.model_check`), whatever else it supports."""
    problems = static_problems(model)
    if problems:
        raise ModelCheckError(f"model is not allowed for DP training ({engine}): " + "; ".join(problems)
                              + ". Allowed: " + ADVICE + ".")


class GradientEngine:
    """Base: holds the model, C, sigma, B and the noise generator."""

    name = "base"
    PREFETCH_MIN_PARAMS = 1 << 15
    STARVED_WAIT_S = 0.005  # a background float64 draw of 2^17 numbers takes ~1.5 ms when it gets a CPU
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
            _refuse_mixing_models(model, type(self).__name__)
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
        #: draw the next step's standard-normal vector in a background thread while this step
        #: computes (the draw is data-independent; the stream of draws is the same as drawing
        #: each step in turn). Only worth it when a draw costs more than handing it to a thread
        #: (~0.1 ms for 2^15 numbers here): on for the MLP (91k parameters), off for the logit.
        #: The thread runs at the lowest CPU priority (SCHED_IDLE): it fills idle CPU time and
        #: does not slow the step's parallel regions (with equal priority it did, by ~0.1x).
        #: On a GPU the draw is an asynchronous kernel already: no thread.
        self.prefetch_noise = sum(self._sizes) >= self.PREFETCH_MIN_PARAMS and self.device.type == "cpu"
        self._pending = None  # (future of the next N(0, I) draw, generator state before it)
        self._executor = None
        self._inline_left = 0  # steps still to draw inline after a starved background draw
        self._inline_steps = 64
        self._clock = time.perf_counter  # times the wait for a queued draw (tests replace it)

    # ------------------------------------------------------------------ noise
    def noise_record(self) -> dict[str, Any]:
        """What the privacy report needs to bound the sampler's tail (dptrain.privacy.noise_law):
        the noise coordinates d of a step and the dtype the noisy gradient is rounded to."""
        return {"noise_coordinates": sum(self._sizes), "noise_dtype": str(self.noise_dtype).replace("torch.", ""),
                "noise_refined32": self._refined32}

    @property
    def noise_std(self) -> float:
        """SD of the noise in each coordinate of ``.grad``: sigma C / B (the one formula)."""
        if self.noise_multiplier == 0.0:
            return 0.0
        return self.noise_multiplier * self.max_grad_norm / self.expected_batch_size

    def _draw(self) -> torch.Tensor:
        """One step's N(0, I) vector (torch's float32 normal_ is Box-Muller on 24-bit uniforms:
        |z| <= 5.77, a truncated Gaussian). A float32 model on the CPU with >= 512 coordinates:
        the refined float32 Box-Muller (:func:`standard_normal32_refined`, |z| <= 10.33); a
        float64 model, a GPU or fewer coordinates (where torch's scalar float64 normal_ is the
        cheaper call): float64 Box-Muller on 53-bit uniforms (|z| <= 8.57 / 8.65), added in
        float64."""
        n = sum(self._sizes)
        if self._refined32:
            return standard_normal32_refined(n, generator=self.generator, device=self.device)
        return standard_normal64(n, generator=self.generator, device=self.device)

    @property
    def _refined32(self) -> bool:
        """Whether :meth:`_draw` uses the refined float32 sampler (else float64 Box-Muller)."""
        cpu32 = self.device.type == "cpu" and self.noise_dtype == torch.float32
        return cpu32 and sum(self._sizes) >= _VECTOR_NORMAL_MIN

    def _standard_normal(self) -> torch.Tensor:
        """This step's N(0, I) vector (one per step, whole model), and the next one queued.

        The queued draw runs at idle CPU priority. When the CPUs are oversubscribed (other
        processes, more threads than cores) such a thread gets almost no CPU, and waiting for
        it would stall the step (measured: 4 steps/s instead of 110-130 with two busy processes
        on this machine). So a wait longer than ``STARVED_WAIT_S`` switches to drawing inline
        for ``_inline_steps`` steps (64, doubling on each repeat, at most 4096) before trying
        the background draw again. Either way the stream of draws is the same."""
        if not self.prefetch_noise:
            self.discard_prefetched_noise()
            return self._draw()
        if self._pending is None:
            z = self._draw()
        else:
            future = self._pending[0]
            self._pending = None
            if future.done():
                z = future.result()
            else:
                t0 = self._clock()
                z = future.result()
                if self._clock() - t0 > self.STARVED_WAIT_S:
                    self._inline_left = self._inline_steps
                    self._inline_steps = min(2 * self._inline_steps, 4096)
        if self._inline_left > 0:
            self._inline_left -= 1
            return z
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dptrain-noise",
                                                initializer=_lowest_cpu_priority)
        state = self.generator.get_state()
        self._pending = (self._executor.submit(self._draw), state)
        return z

    def discard_prefetched_noise(self) -> None:
        """Forget a queued draw and rewind the generator to before it (as if never drawn)."""
        if self._pending is not None:
            future, state = self._pending
            future.result()
            self.generator.set_state(state)
            self._pending = None

    def noise_generator_state(self) -> torch.Tensor:
        """The noise generator's state as a sequential run would have it now (for checkpoints):
        a queued, not yet used draw does not count."""
        if self._pending is not None:
            self._pending[0].result()
            return self._pending[1].clone()
        return self.generator.get_state()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        if self.dist is None and x.shape[0] > 0 and self.fused:
            return self._fused_call(x, y)
        if x.shape[0] == 0:
            sums = [torch.zeros_like(p) for p in self.params]
            stats = StepStats(0, 0.0, 0, 0, 0.0)
        else:
            sums, stats = self.clipped_sum(x, y)
        if self.dist is not None:
            return self._distributed_finish(sums, stats)
        inv_b, std = 1.0 / self.expected_batch_size, self.noise_std
        # one Gaussian draw per coordinate per step, for the whole sum: N(0, sigma^2 C^2) / B
        noise = self._standard_normal() if std > 0 else None
        chunks = noise.split(self._sizes) if noise is not None else [None] * len(sums)
        for p, total, z in zip(self.params, sums, chunks):
            total.mul_(inv_b)  # sums are fresh tensors: in place is safe
            if z is not None:  # computed in float64 (z's dtype), rounded once into total's dtype
                total.add_(z.view_as(total), alpha=std)
            p.grad = total
        return stats

    def _fused_call(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        for p in self.params:  # the last step's gradients (the optimiser has consumed them) are
            p.grad = None      # freed before this step's noise vector becomes the new ones
        inv_b, std = 1.0 / self.expected_batch_size, self.noise_std
        # one Gaussian draw per coordinate per step, for the whole sum: N(0, sigma^2 C^2) / B
        noise = self._standard_normal() if std > 0 else None
        grads, stats = self.noisy_grads(x, y, noise=noise, noise_scale=std, sum_scale=inv_b)
        for p, g in zip(self.params, grads):
            p.grad = g
        return stats

    def noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                    noise_scale: float, sum_scale: float) -> tuple[list[torch.Tensor], StepStats]:
        """``sum_scale * sum_i clip_C(grad_i) + noise_scale * noise`` per parameter (views of one
        fresh flat buffer of the rows' dtype); ``noise`` is a flat N(0, I) vector (float64, from
        :meth:`_draw`), added in float64 and rounded once, or None."""
        raise NotImplementedError

    def _distributed_finish(self, sums: list[torch.Tensor], stats: StepStats) -> StepStats:
        """Across processes: rank 0 adds the step's ONE noise draw N(0, sigma^2 C^2) to its local
        clipped sum, one all_reduce adds every rank's sum, then all ranks divide by the GLOBAL
        expected batch size B (dptrain.training.distributed)."""
        # in float64 (DRAW_DTYPE) until the end: the float64 noise, then the other ranks' sums,
        # are added without rounding to the model's dtype in between; rounded once, at the end
        flat = torch.cat([s.reshape(-1) for s in sums]).to(DRAW_DTYPE)
        std = self.noise_std * self.expected_batch_size  # on the SUM, before the division by B
        if self.dist.is_main and std > 0:
            flat.add_(self._standard_normal(), alpha=std)
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


class NonPrivateEngine(GradientEngine):
    """No clipping, no noise: ``.grad = sum_i grad_i / B``. The comparison pipeline."""

    name = "nonprivate"
    checks_model = False  # no guarantee is claimed

    def __init__(self, model: nn.Module, *, expected_batch_size: float, generator: torch.Generator,
                 objective: Any = None) -> None:
        super().__init__(
            model, max_grad_norm=float("inf"), noise_multiplier=0.0,
            expected_batch_size=expected_batch_size, generator=generator, objective=objective,
        )

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        logits = self.model(x)
        losses = self.objective.per_example_loss(logits, y)
        grads = torch.autograd.grad(losses.sum(), self.params)
        return list(grads), self.step_stats(logits.detach(), y, losses.detach())


class OpacusEngine(GradientEngine):
    """Per-example gradients from Opacus' GradSampleModule hooks (materialised), flat clipping."""

    name = "opacus"

    def __init__(self, model: nn.Module, **kwargs) -> None:
        from opacus import GradSampleModule

        super().__init__(model, **kwargs)
        self.gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        logits = self.gsm(x)
        losses = self.objective.per_example_loss(logits, y)
        with warnings.catch_warnings():  # Opacus' hooks fire on outputs when x has no grad: expected
            warnings.simplefilter("ignore", UserWarning)
            losses.sum().backward()
        per_ex = [p.grad_sample.reshape(x.shape[0], -1) for p in self.params]
        sq = torch.stack([g.pow(2).sum(1) for g in per_ex]).sum(0)
        factors = self.clip_factors(sq)
        sums = [torch.einsum("i,i...->...", factors, p.grad_sample) for p in self.params]
        for p in self.params:
            p.grad_sample = None
            p.grad = None
        return sums, self.step_stats(logits.detach(), y, losses.detach(), sq)


_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.ELU, nn.LeakyReLU, nn.Sigmoid, nn.Identity)


def fast_path_blocker(model: nn.Module) -> str | None:
    """Why the fast engine cannot run this model, or None if it can.

    Supported: ``nn.Sequential`` of ``nn.Linear`` (each parameter used once), elementwise
    activations and a final squeeze, inputs without a sequence dimension.
    """
    if not isinstance(model, nn.Sequential):
        return f"model is {type(model).__name__}, not nn.Sequential"
    seen: set[int] = set()
    for m in model:
        if isinstance(m, nn.Linear):
            for p in m.parameters():
                if id(p) in seen:
                    return "a parameter is shared between layers"
                seen.add(id(p))
        elif not isinstance(m, (*_ELEMENTWISE, Squeeze)):
            return f"layer {type(m).__name__} is not Linear or an elementwise activation"
    if any(p.requires_grad and id(p) not in seen for p in model.parameters()):
        return "a trainable parameter is not in a Linear layer"
    if any(not p.requires_grad for m in model if isinstance(m, nn.Linear) for p in m.parameters()):
        return "a Linear layer has frozen parameters"
    return None


class _Activation:
    """Forward and backward of one elementwise activation on reusable buffers (no autograd).

    ``in_place``: the output overwrites the pre-activation z and the derivative is computed
    from the output h alone (ReLU, Tanh, Sigmoid, LeakyReLU / ELU with a non-negative slope /
    alpha: the same formulas autograd uses). Otherwise (GELU, SiLU, ...) h goes to its own
    buffer and the derivative is computed from z, which is kept, as autograd keeps it.
    """

    def __init__(self, module: nn.Module) -> None:
        aten = torch.ops.aten
        self.module = module
        if isinstance(module, nn.ReLU):
            self.in_place = True
            self.fwd = lambda z, h: torch.relu_(z)
            self.bwd = lambda d, z, h: aten.threshold_backward.grad_input(d, h, 0, grad_input=d)
        elif isinstance(module, nn.Tanh):
            self.in_place = True
            self.fwd = lambda z, h: torch.tanh_(z)
            self.bwd = lambda d, z, h: aten.tanh_backward.grad_input(d, h, grad_input=d)
        elif isinstance(module, nn.Sigmoid):
            self.in_place = True
            self.fwd = lambda z, h: torch.sigmoid_(z)
            self.bwd = lambda d, z, h: aten.sigmoid_backward.grad_input(d, h, grad_input=d)
        elif isinstance(module, nn.LeakyReLU):
            s = float(module.negative_slope)
            self.in_place = s >= 0  # then sign(h) = sign(z)
            if self.in_place:
                self.fwd = lambda z, h: aten.leaky_relu_(z, s)
                self.bwd = lambda d, z, h: aten.leaky_relu_backward.grad_input(d, h, s, True, grad_input=d)
            else:
                self.fwd = lambda z, h: aten.leaky_relu.out(z, s, out=h)
                self.bwd = lambda d, z, h: aten.leaky_relu_backward.grad_input(d, z, s, False, grad_input=d)
        elif isinstance(module, nn.ELU):
            a = float(module.alpha)
            self.in_place = a >= 0  # then z <= 0 <=> h <= 0 and dh/dz = h + alpha there
            if self.in_place:
                self.fwd = lambda z, h: aten.elu_(z, a, 1, 1)
                self.bwd = lambda d, z, h: aten.elu_backward.grad_input(d, a, 1, 1, True, h, grad_input=d)
            else:
                self.fwd = lambda z, h: aten.elu.out(z, a, 1, 1, out=h)
                self.bwd = lambda d, z, h: aten.elu_backward.grad_input(d, a, 1, 1, False, z, grad_input=d)
        elif isinstance(module, nn.GELU):
            approx = module.approximate
            self.in_place = False
            # (gelu.out ignores a non-contiguous ``out`` in torch 2.13: copy, then in place)
            self.fwd = lambda z, h: aten.gelu_(h.copy_(z), approximate=approx)
            self.bwd = lambda d, z, h: aten.gelu_backward.grad_input(d, z, approximate=approx, grad_input=d)
        elif isinstance(module, nn.SiLU):
            self.in_place = False
            self.fwd = lambda z, h: aten.silu.out(z, out=h)
            self.bwd = lambda d, z, h: aten.silu_backward.grad_input(d, z, grad_input=d)
        else:
            raise TypeError(f"no buffered forward/backward for {type(module).__name__}")


def _buffered_plan(model: nn.Sequential) -> list[tuple[nn.Linear, _Activation | None]] | None:
    """``[(Linear, activation or None), ...]`` when the model is Linear, [activation], Linear,
    [activation], ..., ending in a width-1 Linear [activation] and a Squeeze, or in a Linear
    [activation] of width K > 1 (a multi-output head, no Squeeze); else None."""
    layers = list(model)
    squeeze = bool(layers) and isinstance(layers[-1], Squeeze)
    plan: list[tuple[nn.Linear, _Activation | None]] = []
    for m in layers[:-1] if squeeze else layers:
        if isinstance(m, nn.Linear):
            plan.append((m, None))
        elif isinstance(m, nn.Identity):
            continue
        elif plan and plan[-1][1] is None and isinstance(m, _ELEMENTWISE):
            try:
                plan[-1] = (plan[-1][0], _Activation(m))
            except TypeError:
                return None
        else:  # an activation before the first Linear, two in a row, a Squeeze inside
            return None
    if not plan or (plan[-1][0].out_features != 1) == squeeze:
        return None
    return plan


class _Workspace:
    """Buffers of ``capacity`` rows, reused from step to step (the Poisson batch size varies:
    rows [:n] are used). Reusing them keeps a step free of fresh allocations, which on this
    CPU cost page faults comparable to the arithmetic.

    On the CPU (``ones_column``) each hidden layer's output lives in ``aug[k]``, a
    (capacity, width + 1) buffer whose last column is 1: the next layer's input with a ones
    column, so that one matrix product gives its weight AND bias gradient,
    ``g^T [a | 1] = [grad_W | grad_b]``, and its forward pass ``[a | 1] [W | b]^T`` needs no
    broadcast of the bias. On a GPU the odd width (width + 1) misaligns the rows of the matrix
    products, and a bias costs the GPU's matrix product nothing: there ``aug[k]`` is (capacity,
    width), the forward adds the bias in ``addmm`` and the bias gradient is a column sum or a
    matrix-vector product (``ones_column`` False; the same sums, in another order).
    """

    def __init__(self, plan, capacity: int, dtype: torch.dtype, device: torch.device, *, ones_column: bool) -> None:
        def buf(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device=device)

        last = len(plan) - 1
        self.capacity = capacity
        self.ones_column = ones_column
        extra = 1 if ones_column else 0  # the ones column's width
        self.aug: list[torch.Tensor | None] = []  # [h_k | 1] (GPU: h_k) for hidden layers k < last
        self.z: list[torch.Tensor | None] = []  # pre-activations, where h is not computed in place
        for k, (lin, act) in enumerate(plan):
            if k < last:
                a = buf(capacity, lin.out_features + extra)
                if extra:
                    a[:, -1] = 1.0
                self.aug.append(a)
                self.z.append(buf(capacity, lin.out_features) if act is not None and not act.in_place else None)
            else:
                self.aug.append(None)
                self.z.append(buf(capacity, lin.out_features))
        act = plan[last][1]
        width = plan[last][0].out_features
        self.last_h = buf(capacity, width) if act is not None and not act.in_place else None
        self.d = [buf(capacity, lin.out_features) for lin, _ in plan]  # output gradients g_k
        # [grad_W | grad_b] of each layer with a bias; [W | b] for the forward of layers k >= 1
        # (the ones-column layout only)
        self.wt = [buf(lin.out_features, lin.in_features + 1) if extra and lin.bias is not None else None
                   for lin, _ in plan]
        self.waug = [buf(lin.out_features, lin.in_features + 1) if extra and k > 0 and lin.bias is not None else None
                     for k, (lin, _) in enumerate(plan)]
        first = plan[0][0]
        # [c * x | c] (GPU: c * x): the first layer's input scaled by the clip factors (when narrower than g)
        self.x_aug = buf(capacity, first.in_features + extra) if first.in_features < first.out_features else None


class FastLinearEngine(GradientEngine):
    """Book-keeping DP-SGD for Sequential(Linear, activation, ..., Linear): no per-example
    gradients. For a Linear layer z = a W^T + b and output gradients g (one row per example,
    from the SUM of per-example losses): ||grad_W,i||^2 = ||g_i||^2 ||a_i||^2,
    ||grad_b,i||^2 = ||g_i||^2, and sum_i c_i grad_W,i = (c * g)^T a (docs/engine.md).

    Three implementations of the same arithmetic:

    * one Linear to one output: closed form, g_i = the objective's output gradient (for binary
      logistic sigmoid(z_i) - y_i); one Linear to K > 1 outputs likewise, with g_i a K-vector
      (multinomial: softmax(z_i) - onehot(y_i)) and ||grad_i||^2 = ||g_i||^2 (||x_i||^2 + 1);
    * a plain stack (Linear, one activation, ..., Linear(., 1), Squeeze, or ending in a
      Linear(., K) head with K > 1 and no Squeeze): forward and backward
      written out on reusable buffers (:class:`_Workspace`), without autograd, and the step's
      ``.grad`` formed by one ``addmm`` per weight that folds in the clip factors and 1/B, then
      one float64 add of the noise over all parameters:
      ``grad_W = round((1 / B) (c * g)^T a + (sigma C / B) z_W)`` (``fused``);
    * any other Sequential of Linear layers and elementwise activations: autograd with a hook
      on each Linear output that captures its output gradient.
    """

    name = "fast"

    def __init__(self, model: nn.Module, **kwargs) -> None:
        _refuse_mixing_models(model, type(self).__name__)  # the reason that matters, first
        reason = fast_path_blocker(model)
        if reason is not None:
            raise ValueError(f"trainer.engine=fast cannot run this model: {reason}")
        super().__init__(model, **kwargs)
        self.layers = list(model)
        linears = [m for m in self.layers if isinstance(m, nn.Linear)]
        self.closed_form = (
            len(linears) == 1 and linears[0].out_features == 1 and isinstance(self.layers[0], nn.Linear)
            and all(isinstance(m, Squeeze) for m in self.layers[1:])
        ) or (len(self.layers) == 1 and isinstance(self.layers[0], nn.Linear) and linears[0].out_features > 1)
        #: the model's output is a vector (n,) (a width-1 head and a Squeeze), else (n, K)
        self._squeeze = isinstance(self.layers[-1], Squeeze)
        self.linears = linears
        self._has_bias = [lin.bias is not None for lin in linears]
        first = linears[0]
        self._backward_target = [first.bias if first.bias is not None else first.weight]
        self.plan = None if self.closed_form else _buffered_plan(model)
        self.fused = self.closed_form or self.plan is not None
        #: the buffered path's layout (:class:`_Workspace`): a ones column beside each hidden
        #: layer's output on the CPU, none on a GPU (the same arithmetic; tests flip it)
        self.ones_column = self.device.type == "cpu"
        self._ws: _Workspace | None = None

    # ------------------------------------------------------------------ shared pieces
    def per_example_sq_norms(self, inputs: list[torch.Tensor], out_grads: list[torch.Tensor],
                             has_bias: list[bool]) -> torch.Tensor:
        """||grad_i||^2 over all layers: sum_l ||g_l,i||^2 (||a_l,i||^2 + [layer l has a bias]).
        An output gradient given as a vector (n,) is a width-1 layer's."""
        sq = None
        for a, g, bias in zip(inputs, out_grads, has_bias):
            term = _row_sq_norms(a)
            if bias:
                term.add_(1.0)
            term.mul_(g.square() if g.dim() == 1 else _row_sq_norms(g))
            sq = term if sq is None else sq.add_(term)
        return sq

    def _grad_views(self, dtype: torch.dtype) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Where this step's ``.grad`` tensors are written: one fresh flat zero buffer of the rows'
        dtype and its views by parameter id (the clipped sums are written into them, then
        :meth:`_add_noise` adds the noise to the whole buffer)."""
        flat = torch.zeros(sum(self._sizes), dtype=dtype, device=self.device)
        return flat, {id(p): v.view_as(p) for p, v in zip(self.params, flat.split(self._sizes))}

    @staticmethod
    def _add_noise(flat: torch.Tensor, noise: torch.Tensor | None, noise_scale: float) -> None:
        """``flat += noise_scale * noise``: computed in float64 (the noise's dtype) and rounded
        once into ``flat``'s dtype, so the float64 noise keeps its tail (dptrain.privacy.noise_law)."""
        if noise is not None:
            flat.add_(noise, alpha=noise_scale)

    @torch.no_grad()
    def _logistic_noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                              noise_scale: float, sum_scale: float,
                              row_weights: torch.Tensor | None = None) -> tuple[list[torch.Tensor], StepStats]:
        """One Linear to one output in closed form: g_i = dL_i/dz_i (the objective's output
        gradient; sigmoid(z_i) - y_i for binary logistic), so example i's
        gradient is g_i (x_i, 1), of squared norm g_i^2 (||x_i||^2 + 1) (docs/engine.md). The
        weight gradient is one matrix-vector product x^T (c * g), then the float64 noise is added."""
        lin = self.layers[0]
        bias = lin.bias is not None
        z = torch.addmv(lin.bias, x, lin.weight[0]) if bias else torch.mv(x, lin.weight[0])
        g = self.objective.output_gradient(z, y)
        if row_weights is not None:
            g.mul_(row_weights)
        sq = self.per_example_sq_norms([x], [g], [bias])
        stats = self.step_stats(z, y, None, sq)
        g.mul_(self.clip_factors(sq))
        flat, views = self._grad_views(x.dtype)
        views[id(lin.weight)].view(-1).addmv_(x.t(), g, beta=0.0, alpha=sum_scale)
        if bias:
            views[id(lin.bias)].add_(g.sum(), alpha=sum_scale)
        self._add_noise(flat, noise, noise_scale)
        return [views[id(p)] for p in self.params], stats

    @torch.no_grad()
    def _linear_head_noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                                 noise_scale: float, sum_scale: float,
                                 row_weights: torch.Tensor | None = None) -> tuple[list[torch.Tensor], StepStats]:
        """One Linear to K > 1 outputs in closed form: g_i = dL_i/dz_i, a K-vector (the
        objective's output gradient; softmax(z_i) - onehot(y_i) for multinomial), so example i's
        gradient is the outer product g_i (x_i, 1)^T, of squared norm ||g_i||^2 (||x_i||^2 + 1).
        The weight gradient is one matrix product (c * g)^T x, then the float64 noise is added."""
        lin = self.layers[0]
        bias = lin.bias is not None
        z = torch.addmm(lin.bias, x, lin.weight.t()) if bias else torch.mm(x, lin.weight.t())
        g = self.objective.output_gradient(z, y)
        if row_weights is not None:
            g.mul_(row_weights[:, None])
        sq = self.per_example_sq_norms([x], [g], [bias])
        stats = self.step_stats(z, y, None, sq)
        g.mul_(self.clip_factors(sq)[:, None])
        flat, views = self._grad_views(x.dtype)
        views[id(lin.weight)].addmm_(g.t(), x, beta=0.0, alpha=sum_scale)
        if bias:
            views[id(lin.bias)].add_(g.sum(0), alpha=sum_scale)
        self._add_noise(flat, noise, noise_scale)
        return [views[id(p)] for p in self.params], stats

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        if self.closed_form or self.plan is not None:
            return self.noisy_grads(x, y, noise=None, noise_scale=0.0, sum_scale=1.0)
        return self._autograd_clipped_sum(x, y)

    # ------------------------------------------------------------------ buffered path
    def _workspace(self, n: int, dtype: torch.dtype) -> _Workspace:
        ws = self._ws
        if ws is None or ws.capacity < n or ws.d[0].dtype != dtype or ws.ones_column != self.ones_column:
            # room for the batch-size fluctuations of Poisson sampling (sd ~ sqrt(B))
            cap = n + 3 * math.isqrt(n) + 8
            self._ws = None  # free the old buffers first
            self._ws = ws = _Workspace(self.plan, cap, dtype, self.params[0].device, ones_column=self.ones_column)
        return ws

    @torch.no_grad()
    def noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                    noise_scale: float, sum_scale: float,
                    row_weights: torch.Tensor | None = None) -> tuple[list[torch.Tensor], StepStats]:
        """As :meth:`GradientEngine.noisy_grads`; ``row_weights`` (n,), 0 or 1 per row, multiplies
        each example's output gradient: a row of weight 0 has a zero gradient, so it adds nothing
        to the sums (the padding rows of a CUDA-graph step, dptrain.privacy.dpsgd.graph). Its other
        diagnostics are not masked: a caller that passes weights computes no step_stats."""
        if self.closed_form:
            head = self._logistic_noisy_grads if self._squeeze or self.linears[0].out_features == 1 \
                else self._linear_head_noisy_grads
            return head(x, y, noise=noise, noise_scale=noise_scale, sum_scale=sum_scale, row_weights=row_weights)
        if self.plan is None:
            if row_weights is not None:
                raise ValueError("row_weights need the fused fast path (a closed-form head or the buffered MLP path)")
            return super().noisy_grads(x, y, noise=noise, noise_scale=noise_scale, sum_scale=sum_scale)
        n = x.shape[0]
        ws = self._workspace(n, x.dtype)
        inputs, aug_inputs, pre, post, logits = self._buffered_forward(x, ws)
        losses = self.objective.per_example_loss(logits, y) if self.collect_stats else None
        out_grads = self._buffered_backward(logits, y, ws, pre, post, row_weights)
        sq = self.per_example_sq_norms(inputs, out_grads, self._has_bias)
        stats = self.step_stats(logits, y, losses, sq)
        flat, views = self._grad_views(x.dtype)
        self._buffered_products(ws, self.clip_factors(sq), (inputs, aug_inputs, out_grads), views=views,
                                sum_scale=sum_scale)
        self._add_noise(flat, noise, noise_scale)
        return [views[id(p)] for p in self.params], stats

    def _buffered_forward(self, x: torch.Tensor, ws: _Workspace) -> tuple:
        """z_k = a_k W_k^T + b_k, h_k = act(z_k) (in place where the derivative needs only h);
        h_k is written into the first columns of [h_k | 1]. Returns (inputs a_k, [a_k | 1] for
        k >= 1, pre-activations, outputs, logits)."""
        n, plan, last = x.shape[0], self.plan, len(self.plan) - 1
        inputs, aug_inputs, pre, post = [], [], [], []
        a, a_aug = x, None
        width_end = -1 if ws.ones_column else None  # the hidden outputs' columns in ws.aug[k]
        for k, (lin, act) in enumerate(plan):
            inputs.append(a)
            aug_inputs.append(a_aug)
            out = ws.aug[k][:n, :width_end] if k < last else (ws.last_h[:n] if ws.last_h is not None else ws.z[k][:n])
            z = ws.z[k][:n] if ws.z[k] is not None else out
            if lin.bias is None:
                torch.mm(a, lin.weight.t(), out=z)
            elif a_aug is not None:
                wb = ws.waug[k]
                wb[:, :-1].copy_(lin.weight)
                wb[:, -1].copy_(lin.bias)
                torch.mm(a_aug, wb.t(), out=z)
            else:
                torch.addmm(lin.bias, a, lin.weight.t(), out=z)
            if act is not None:
                act.fwd(z, out)
            pre.append(z)
            post.append(out)
            a, a_aug = out, None
            if k < last and ws.ones_column:
                a_aug = ws.aug[k][:n]
                a_aug[:, -1].fill_(1.0)  # the ones column (the last step may have scaled it by c)
        return inputs, aug_inputs, pre, post, (a.view(n) if self._squeeze else a)

    def _buffered_backward(self, logits: torch.Tensor, y: torch.Tensor, ws: _Workspace, pre: list,
                           post: list, row_weights: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Backward of the SUM of per-example losses: output gradients g_k (n, out_k); a row of
        weight 0 (``row_weights``) gets g = 0 at the output, hence at every layer."""
        n, plan, last = logits.shape[0], self.plan, len(self.plan) - 1
        out_grads: list[torch.Tensor] = [None] * len(plan)  # type: ignore[list-item]
        g = ws.d[last][:n]
        self.objective.output_gradient(logits, y, out=g.view(n) if self._squeeze else g)  # d loss_i / d z_i
        if row_weights is not None:
            g.mul_(row_weights[:, None])
        for k in range(last, -1, -1):
            act = plan[k][1]
            if act is not None:
                act.bwd(g, pre[k], post[k])
            out_grads[k] = g
            if k > 0:
                torch.mm(g, plan[k][0].weight, out=ws.d[k - 1][:n])
                g = ws.d[k - 1][:n]
        return out_grads

    def _buffered_products(self, ws: _Workspace, factors: torch.Tensor, trace: tuple, *, views: dict,
                           sum_scale: float) -> None:
        """``views`` (zeros) = sum_scale * sum_i c_i grad_i, per layer: scale the narrower operand
        by the clip factors c, one matrix product written into the layer's views (the noise is
        added afterwards, in float64: :meth:`_add_noise`). ``trace``: the forward's inputs a_k
        and [a_k | 1] and the backward's output gradients."""
        n, col = factors.shape[0], factors[:, None]
        inputs, aug_inputs, out_grads = trace
        for k, ((lin, _), a, a_aug, g) in enumerate(zip(self.plan, inputs, aug_inputs, out_grads)):
            gw = views[id(lin.weight)]
            if lin.bias is None or not ws.ones_column:  # the weight alone; a bias (GPU layout) apart
                gb = views[id(lin.bias)] if lin.bias is not None else None
                if a.shape[1] < g.shape[1]:  # scale a (the input x into a buffer): bias = g^T c
                    a = torch.mul(a, col, out=ws.x_aug[:n, :a.shape[1]]) if k == 0 else a.mul_(col)
                    if gb is not None:
                        gb.addmv_(g.t(), factors, beta=0.0, alpha=sum_scale)
                else:
                    g.mul_(col)
                    if gb is not None:
                        gb.add_(g.sum(0), alpha=sum_scale)
                gw.addmm_(g.t(), a, beta=0.0, alpha=sum_scale)
                continue
            gb, t = views[id(lin.bias)], ws.wt[k]
            if k == 0 and ws.x_aug is not None:  # [c * x | c]
                a_aug = ws.x_aug[:n]
                torch.mul(a, col, out=a_aug[:, :-1])
                a_aug[:, -1].copy_(factors)
            elif k == 0:  # the input is wider than the layer: scale g, bias from a column sum
                g.mul_(col)
                torch.addmm(t[:, :-1], g.t(), a, beta=0.0, alpha=sum_scale, out=t[:, :-1])
                torch.sum(g, 0, out=t[:, -1]).mul_(sum_scale)
                a_aug = None
            elif g.shape[1] <= a_aug.shape[1]:
                g.mul_(col)
            else:
                a_aug.mul_(col)  # also turns the ones column into c
            if a_aug is not None:
                torch.addmm(t, g.t(), a_aug, beta=0.0, alpha=sum_scale, out=t)
            gw.copy_(t[:, :-1])
            gb.copy_(t[:, -1])

    # ------------------------------------------------------------------ autograd path
    def _autograd_clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        # Forward pass keeping each Linear layer's input a_l (the activations autograd saves
        # anyway) and a hook on its output z_l that captures the output gradient g_l during the
        # backward pass. The pre-activations z_l themselves are NOT kept (holding them for
        # autograd.grad(outputs=z) cost one extra (B, width) tensor per layer).
        inputs: list[torch.Tensor] = []
        out_grads: list[torch.Tensor | None] = [None] * len(self.linears)
        h = x
        for m in self.layers:
            if isinstance(m, nn.Linear):
                inputs.append(h.detach())
                h = m(h)
                h.register_hook(self._capture(out_grads, len(inputs) - 1))
            else:
                h = m(h)
        losses = self.objective.per_example_loss(h, y)
        # Backward only as far as the first layer's output gradient: ask for the cheapest leaf
        # on that path (the first bias: a column sum), so no weight gradient is ever formed.
        torch.autograd.grad(losses.sum(), self._backward_target)
        with torch.no_grad():
            sq = self.per_example_sq_norms(inputs, out_grads, self._has_bias)
            factors = self.clip_factors(sq)
            grad_of: dict[int, torch.Tensor] = {}
            for a, g, lin in zip(inputs, out_grads, self.linears):
                # sum_i c_i g_i^T a_i: scale the narrower operand by c (fewer multiplications)
                if a.shape[1] < g.shape[1]:
                    grad_of[id(lin.weight)] = g.T @ (a * factors[:, None])
                else:
                    grad_of[id(lin.weight)] = g.mul_(factors[:, None]).T @ a  # g is a fresh tensor
                    if lin.bias is not None:
                        grad_of[id(lin.bias)] = g.sum(0)
                    continue
                if lin.bias is not None:
                    grad_of[id(lin.bias)] = factors @ g
        sums = [grad_of[id(p)] for p in self.params]
        return sums, self.step_stats(h.detach(), y, losses.detach(), sq)

    @staticmethod
    def _capture(store: list, k: int):
        def hook(grad: torch.Tensor) -> None:
            store[k] = grad
        return hook


#: the DP engines by name (``trainer.engine``; ``auto`` picks "fast" when it can run the model,
#: else "opacus"). A new engine is a GradientEngine subclass registered here or in a plugin.
ENGINES: Registry = Registry("engine", setting="trainer.engine")
ENGINES.register("fast", FastLinearEngine)
ENGINES.register("opacus", OpacusEngine)


def make_engine(
    model: nn.Module,
    *,
    engine: str,
    max_grad_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    generator: torch.Generator,
    objective: Any = None,
) -> GradientEngine:
    """Build an engine: ``auto`` takes the fast path when every trainable layer supports it,
    else Opacus (and logs why); ``nonprivate`` is the same pipeline without clipping or noise
    (privacy.enabled=false; never a user's ``trainer.engine``); any other name is looked up in
    ``ENGINES``. Prefer :meth:`dptrain.privacy.dpsgd.mechanism.DPSGDMechanism.build_engine`, which
    passes the mechanism's own sigma, C and B."""
    if engine == "nonprivate":
        return NonPrivateEngine(model, expected_batch_size=expected_batch_size, generator=generator,
                                objective=objective)
    kwargs = dict(
        max_grad_norm=max_grad_norm, noise_multiplier=noise_multiplier,
        expected_batch_size=expected_batch_size, generator=generator, objective=objective,
    )
    if engine == "auto":
        reason = fast_path_blocker(model)
        if reason is None:
            return FastLinearEngine(model, **kwargs)
        log.info("DP engine: falling back to Opacus per-example gradients (%s)", reason)
        return OpacusEngine(model, **kwargs)
    return ENGINES.get(engine)(model, **kwargs)
