"""The DP-SGD step's Gaussian noise: ONE draw, used by every engine and the CUDA-graph step.

:func:`standard_normal` is the only function that draws DP-SGD noise: n N(0, 1) numbers from the
run's SECRET noise generator, which an engine multiplies by sigma C / B and adds to the clipped
sum. What it draws (docs/privacy.md, "The noise sampler and its tail"; dptrain.privacy.noise_law
bounds each sampler's tail and the report adds the mass beyond it to delta):

* a float32 model on the CPU with >= 512 coordinates: the refined float32 Box-Muller
  (:func:`standard_normal32_refined`, |z| <= sqrt(154 ln 2) = 10.33), added to the float32 sum;
* otherwise float64 Box-Muller on 53-bit uniforms (:func:`standard_normal64`, |z| <= 8.57 on the
  CPU, 8.65 on a GPU), added to the clipped sum in float64 and rounded once to the model's dtype.

:class:`NoiseStream` is an engine's stream of those draws, one vector per step: it draws the next
step's vector in a background thread while a step computes (large models on the CPU) and gives
the generator state a checkpoint saves.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from dptrain.core.errors import DPTrainError

__all__ = ["DRAW_DTYPE", "NoiseStream", "refine_tail", "standard_normal", "standard_normal32_refined",
           "standard_normal64", "uses_refined32"]

#: the noise is drawn and added in float64 unless the refined float32 sampler applies (noise_law)
DRAW_DTYPE = torch.float64
_TWO_PI = 2.0 * math.pi
#: below this many coordinates torch's own (scalar) float64 normal_ is as fast as the vectorised
#: copy, and the float64 sampler is used for float32 models too
VECTOR_NORMAL_MIN = 512
#: the refined float32 sampler: a pair's 24-bit u1 = m 2^-24 at or below this is refined with 53
#: more bits (m <= 4096: the pairs whose radius is >= sqrt(24 ln 2) = 4.08)
REFINE_BELOW = 2.0 ** -12
_REFINE_M = 4096
#: a pair is refined iff its squared radius is at least this: -2 ln(4096.5 2^-24), between the
#: last refined u1 (m = 4096, R^2 = 16.6355) and the first not refined (m = 4097, 4.9e-4 below)
_TAIL_R2 = -2.0 * math.log((_REFINE_M + 0.5) * 2.0**-24)
#: the search keeps the pairs whose float32 squared radius is above the threshold less 1e-4
#: (relative; float32 rounds R^2 by less than 1e-6 relative); each is then checked in float64
_SEARCH_R2 = _TAIL_R2 * (1.0 - 1e-4)


def uses_refined32(coordinates: int, *, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether :func:`standard_normal` draws the refined float32 sampler for a step of
    ``coordinates`` numbers rounded to ``dtype`` on ``device`` (else float64 Box-Muller)."""
    return torch.device(device).type == "cpu" and dtype == torch.float32 and coordinates >= VECTOR_NORMAL_MIN


def standard_normal(n: int, *, generator: torch.Generator, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """THE DP-SGD noise draw: n N(0, 1) numbers from ``generator`` for a noisy gradient of
    ``dtype`` on ``device``: the refined float32 sampler where :func:`uses_refined32` (float32
    numbers), else float64 Box-Muller (float64 numbers, added in float64 and rounded once)."""
    if uses_refined32(n, device=device, dtype=dtype):
        return standard_normal32_refined(n, generator=generator, device=device)
    return standard_normal64(n, generator=generator, device=device)


# ------------------------------------------------------------------------------ float64 Box-Muller


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
    if device.type != "cpu" or n < VECTOR_NORMAL_MIN:
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


# ------------------------------------------------------------------------------ refined float32


def standard_normal32_refined(n: int, *, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """n N(0, 1) numbers in float32 by Box-Muller whose tail is not truncated at 5.77 (CPU only).

    torch's float32 ``normal_`` (n >= 16) is ONE kernel: Box-Muller on blocks of 16 uniforms of
    24 bits, u1 = 1 - u[j] and u2 = u[j + 8] giving z[j] = R cos(2 pi u2), z[j + 8] = R sin(2 pi u2),
    R = sqrt(-2 ln u1). As u1 >= 2^-24 there, R <= 5.77: a truncated Gaussian. This draws that
    kernel on ceil(n / 16) blocks (so that torch does not redraw the last 16 numbers over half of
    some pairs), then :func:`refine_tail` refines the radius of the pairs whose u1 = m 2^-24 is at
    most 2^-12 (m <= 4096, R >= 4.08, about one pair in 4,096) to (m - v) 2^-24 with a 53-bit
    uniform v from the same generator: u1 is then exactly uniform on a 2^-77 grid there, so
    R <= sqrt(154 ln 2) = 10.33 and the Gaussian pair mass beyond is 2^-77
    (dptrain.privacy.noise_law). Cost: torch's float32 ``normal_`` plus four whole-array numpy calls."""
    _require_box_muller_float32()
    blocks = -(-n // 16)
    z = torch.randn(16 * blocks, dtype=torch.float32, device=device, generator=generator)  # normal_'s kernel, one call
    zn = z.numpy()
    refine_tail(zn, lambda k: torch.rand(k, dtype=torch.float64, device=device, generator=generator).tolist())
    # (few calls matter: inside a training step each first call of a kind costs 5-15 us; torch.from_numpy
    # is the sampler's own call, a fresh torch slice is not)
    return torch.from_numpy(zn[:n]) if n < zn.size else z


def refine_tail(zn: np.ndarray, refine: Callable[[int], Sequence[float]]) -> None:
    """Refine, in place, the far pairs of ``zn``: float32 Box-Muller output in blocks of 16 (pair
    (j, j + 8) of each block, as torch's ``normal_`` writes it) on a 24-bit u1 grid (a numpy view
    of the tensor torch drew).

    A pair whose squared radius R^2 >= -2 ln(4096.5 2^-24) came from u1 = m 2^-24 with m <= 4096;
    m = round(2^24 exp(-R^2 / 2)) exactly (neighbouring m differ by >= 4.9e-4 in R^2, float32's
    rounding of R^2 is below 2e-5). ``refine(k)`` gives k uniforms v in [0, 1) (53 bits), one per
    such pair in ascending order; the pair is rescaled to radius sqrt(-2 ln((m - v) 2^-24)) in
    float64, its direction (the angle 2 pi u2) kept. Found in four whole-array calls: z^2, then
    z[i]^2 + z[i + 8]^2 for every i (the pairs' squared radii where i % 16 < 8), compared with the
    threshold less a 1e-4 margin; the few positions found (about one pair in 4,096) are checked
    and refined one by one in float64. Few calls, not few operations, is what keeps this cheap
    inside a training step (each small numpy call costs there several times its cost alone)."""
    sq = np.square(zn)
    near = (sq[:-8] + sq[8:] >= _SEARCH_R2).nonzero()[0]
    if near.size == 0:
        return
    pairs = []
    for i in near.tolist():  # ascending
        if i & 8:  # a sine and the next block's cosine: not a pair
            continue
        c, s = zn.item(i), zn.item(i + 8)
        r2 = c * c + s * s
        if r2 >= _TAIL_R2:
            pairs.append((i, c, s, r2, round(math.exp(-0.5 * r2) * 2.0**24)))  # u1 = m 2^-24
    if not pairs:
        return
    if not all(1 <= m <= _REFINE_M for *_, m in pairs):
        raise RuntimeError("the refined float32 noise draw met a pair that is not Box-Muller on a 24-bit u1: "
                           "torch's float32 normal_ is not the kernel this sampler refines")
    for (i, c, s, r2, m), v in zip(pairs, refine(len(pairs))):
        scale = math.sqrt(-2.0 * math.log((m - v) * 2.0**-24) / r2)
        zn[i], zn[i + 8] = c * scale, s * scale


@functools.cache
def _float32_normal_is_box_muller16() -> bool:
    """Whether this torch's float32 ``randn`` (``normal_``'s kernel) on the CPU is Box-Muller on
    blocks of 16 uniforms of 24 bits, the uniforms torch's float32 ``uniform_`` draws from the same
    generator state (what :func:`standard_normal32_refined` refines): 64 numbers of a fixed, public
    seed compared."""
    cpu = torch.device("cpu")
    g = torch.Generator(device=cpu).manual_seed(45)
    state = g.get_state()
    z = torch.randn(64, dtype=torch.float32, device=cpu, generator=g).double()
    after = g.get_state()
    g.set_state(state)
    u = torch.empty(64, dtype=torch.float32, device=cpu).uniform_(0.0, 1.0, generator=g).double()
    ref = torch.empty(64, dtype=torch.float64, device=cpu)
    _box_muller16(u, ref)
    grid = torch.equal(u * 2.0**24, torch.round(u * 2.0**24))
    return grid and torch.equal(after, g.get_state()) and torch.allclose(z, ref, rtol=1e-5, atol=1e-5)


def _require_box_muller_float32() -> None:
    """Refuse (an install's error, before any step) a torch whose float32 normal_ is not the kernel
    the refined draw refines: its draws would not have the law the report accounts for."""
    if not _float32_normal_is_box_muller16():
        raise DPTrainError(f"torch {torch.__version__}'s float32 normal_ is not Box-Muller on blocks of 16 24-bit "
                           "uniforms, which the refined float32 noise draw relies on; allowed: the torch version "
                           "dptrain pins (pyproject.toml)")


# ------------------------------------------------------------------------------ an engine's stream


def _lowest_cpu_priority() -> None:
    """Run the calling thread only when a CPU would otherwise idle (Linux SCHED_IDLE), so a
    background noise draw fills gaps instead of slowing the step's parallel regions."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not permitted: an ordinary thread
        pass


class NoiseStream:
    """An engine's noise: one N(0, I) vector of ``coordinates`` numbers per step, drawn by
    :func:`standard_normal` from ``generator`` (the run's SECRET noise stream, on ``device``) for
    a noisy gradient of ``dtype``.

    ``prefetch``: :meth:`next` draws the next step's vector in a background thread while this step
    computes (the draw is data-independent; the stream of draws is the same as drawing each step
    in turn). Only worth it when a draw costs more than handing it to a thread (~0.1 ms for 2^15
    numbers here): on for >= 2^15 coordinates on the CPU (the MLP-256: 91k), off for the presets.
    The thread runs at the lowest CPU priority (SCHED_IDLE): it fills idle CPU time and does not
    slow the step's parallel regions (with equal priority it did, by ~0.1x). On a GPU the draw is
    an asynchronous kernel already: no thread."""

    PREFETCH_MIN_COORDINATES = 1 << 15
    STARVED_WAIT_S = 0.005  # a background float64 draw of 2^17 numbers takes ~1.5 ms when it gets a CPU

    def __init__(self, generator: torch.Generator, *, coordinates: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.generator, self.coordinates = generator, int(coordinates)
        self.device, self.dtype = torch.device(device), dtype
        self.prefetch = self.coordinates >= self.PREFETCH_MIN_COORDINATES and self.device.type == "cpu"
        self._pending = None  # (future of the next N(0, I) draw, generator state before it)
        self._executor = None
        self._inline_left = 0  # steps still to draw inline after a starved background draw
        self._inline_steps = 64
        self._clock = time.perf_counter  # times the wait for a queued draw (tests replace it)
        if self.refined32:
            _require_box_muller_float32()  # refused when the engine is built, before any step

    @property
    def refined32(self) -> bool:
        """Whether the draws are the refined float32 sampler (else float64 Box-Muller)."""
        return uses_refined32(self.coordinates, device=self.device, dtype=self.dtype)

    def record(self) -> dict[str, Any]:
        """What the privacy report needs to bound the sampler's tail (dptrain.privacy.noise_law):
        the noise coordinates d of a step, the dtype the noisy gradient is rounded to, the sampler."""
        return {"noise_coordinates": self.coordinates, "noise_dtype": str(self.dtype).replace("torch.", ""),
                "noise_refined32": self.refined32}

    def draw(self) -> torch.Tensor:
        """One N(0, I) vector, drawn now (:func:`standard_normal`)."""
        return standard_normal(self.coordinates, generator=self.generator, device=self.device, dtype=self.dtype)

    def next(self) -> torch.Tensor:
        """This step's N(0, I) vector, and with ``prefetch`` the next one queued.

        The queued draw runs at idle CPU priority. When the CPUs are oversubscribed (other
        processes, more threads than cores) such a thread gets almost no CPU, and waiting for
        it would stall the step (measured: 4 steps/s instead of 110-130 with two busy processes
        on this machine). So a wait longer than ``STARVED_WAIT_S`` switches to drawing inline
        for ``_inline_steps`` steps (64, doubling on each repeat, at most 4096) before trying
        the background draw again. Either way the stream of draws is the same."""
        if not self.prefetch:
            self.discard_prefetched()
            return self.draw()
        if self._pending is None:
            z = self.draw()
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
        self._pending = (self._executor.submit(self.draw), state)
        return z

    def discard_prefetched(self) -> None:
        """Forget a queued draw and rewind the generator to before it (as if never drawn)."""
        if self._pending is not None:
            future, state = self._pending
            future.result()
            self.generator.set_state(state)
            self._pending = None

    def generator_state(self) -> torch.Tensor:
        """The generator's state as a sequential run would have it now (for checkpoints): a
        queued, not yet used draw does not count."""
        if self._pending is not None:
            self._pending[0].result()
            return self._pending[1].clone()
        return self.generator.get_state()
