"""One DP-SGD step's gradient, and on a GPU the same step replayed as one CUDA graph.

:class:`BatchStep` is what the training loop calls each step: it draws the Poisson batch and
runs the engine, and returns the step's :class:`StepStats`. Everywhere but on a CUDA device it
is exactly ``engine(x[idx], y[idx])`` with ``idx = sampler.sample()``.

On a CUDA device a step of the fused fast engine (a closed-form head or the buffered MLP path)
launches dozens of small kernels, and the host's time to launch them, not the GPU's arithmetic,
sets the pace (measured on an H100: a DP step of an MLP 1024-1024-1024-1 at B = 4,096 took
1.3-1.7x a plain PyTorch step while its kernels took about 1.1x). So there each step that logs
nothing (``engine.collect_stats`` off) replays one CUDA graph captured at the first such step:
the gather of the batch's rows, the forward and backward passes, the per-example norms and clip
factors, the noise draw and the noisy sums, on a FIXED number of rows, the capacity
``B + 3 sqrt(B) + 8``. A Poisson batch of k <= capacity rows fills the first k rows; the other
rows are padding with weight 0 (their input rows zeroed and their output gradients multiplied by
0), so they add exactly nothing to the sums. The same mechanism: the same Poisson batch (drawn on
the host by :class:`~dptrain.privacy.dpsgd.sampling.PinnedPoissonSampler`, the batch size known there
before the step), the same clipping and one N(0, sigma^2 C^2 I) draw per step from the same
secret generator (registered with the graph, so each replay draws fresh numbers), the engine's one
draw (``engine.step_noise``: float64 on a GPU) added to the clipped sum in float64 as in every step
(``noisy_grads``). A batch larger
than the capacity (probability about 0.13% per step) and every logged step run as usual.

What differs from an unreplayed step is floating-point rounding (matrix products over more rows
may sum in another order), not the law of the released gradient. Which steps ran as a graph
depends on the private batch sizes, so no count of them is written anywhere.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from dptrain.privacy.dpsgd.base import GradientEngine, StepStats
from dptrain.privacy.dpsgd.fast import FastLinearEngine
from dptrain.privacy.dpsgd.sampling import PinnedPoissonSampler

log = logging.getLogger(__name__)


def graph_capacity(expected_batch_size: float) -> int:
    """Rows of a graph step: B + 3 sqrt(B) + 8 (a Poisson batch exceeds it with probability about
    0.13%, then that step runs unreplayed)."""
    b = float(expected_batch_size)
    return int(math.ceil(b + 3.0 * math.sqrt(b))) + 8


def graph_blocker(engine: GradientEngine, sampler: Any, *, enabled: bool = True) -> str | None:
    """Why a step of ``engine`` cannot be replayed as a CUDA graph, or None when it can."""
    if not enabled:
        return "switched off (trainer.cuda_graph=false)"
    if engine.device.type != "cuda":
        return f"the step runs on {engine.device}, not a CUDA device"
    if not isinstance(engine, FastLinearEngine) or not engine.fused:
        return f"engine {engine.name!r} has no fused step (only the fast engine's closed forms and buffered MLP path)"
    if engine.dist is not None:
        return "a distributed run (its all_reduce runs between the steps' parts)"
    if not isinstance(sampler, PinnedPoissonSampler):
        return "the Poisson batch is drawn on the GPU (q > 0.1), so its size is not known on the host"
    return None


class BatchStep:
    """``step()`` draws a Poisson batch and runs the engine on it; returns its StepStats.

    ``x`` and ``y`` are all training rows, on the engine's device. ``cuda_graph``: replay the
    steps that log nothing as a CUDA graph where :func:`graph_blocker` allows."""

    def __init__(self, engine: GradientEngine, sampler: Any, x: torch.Tensor, y: torch.Tensor, *,
                 cuda_graph: bool = True, capacity: int | None = None) -> None:
        self.engine, self.sampler, self.x, self.y = engine, sampler, x, y
        #: why the steps are not replayed as a CUDA graph (None: they are, from the first unlogged step)
        self.graph_reason = graph_blocker(engine, sampler, enabled=cuda_graph)
        self.capacity = capacity if capacity is not None else graph_capacity(engine.expected_batch_size)
        self._graph = None

    @property
    def graphed(self) -> bool:
        """True once a graph is captured (the unlogged steps replay it)."""
        return self._graph is not None

    def __call__(self) -> StepStats:
        engine = self.engine
        if self.graph_reason is None and not engine.collect_stats:
            idx = self.sampler.draw()
            if idx.numel() <= self.capacity and (self._graph is not None or self._capture()):
                return self._replay(idx)
            dev_idx = self.sampler.to_device(idx)
        else:
            dev_idx = self.sampler.sample()
        return engine(self.x.index_select(0, dev_idx), self.y.index_select(0, dev_idx))

    # ------------------------------------------------------------------ the padded step
    def padded_grads(self, meta: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor]:
        """The step on ``capacity`` rows: ``meta[:capacity]`` the batch's indices (padding: any
        valid index), ``meta[capacity]`` its size k; ``rows`` = arange(capacity). Draws this
        step's noise; returns the ``.grad`` of each parameter (views of one flat buffer). What
        the graph captures; on the CPU the tests run it as is."""
        engine, cap = self.engine, self.capacity
        weights = (rows < meta[cap]).to(self.x.dtype)  # 1 for the batch's k rows, 0 for the padding
        xb = self.x.index_select(0, meta[:cap])
        xb.mul_(weights[:, None])  # padding rows read zeros
        yb = self.y.index_select(0, meta[:cap])
        noise = engine.step_noise()  # this step's one N(0, I) draw (None when sigma = 0)
        grads, _ = engine.noisy_grads(xb, yb, noise=noise, noise_scale=engine.noise_std,
                                      sum_scale=1.0 / engine.expected_batch_size, row_weights=weights)
        return grads

    def _capture(self) -> bool:
        """Capture the padded step as a CUDA graph (once). On failure: log why and run every
        later step unreplayed (the same mechanism)."""
        engine, dev, cap = self.engine, self.x.device, self.capacity
        gen = engine.generator
        state = gen.get_state()
        try:
            self._meta = torch.zeros(cap + 1, dtype=torch.int64, device=dev)
            self._rows = torch.arange(cap, dtype=torch.int64, device=dev)
            if engine.plan is not None:  # the buffered path's buffers, allocated outside the graph and
                self._ws = engine.workspace(cap, self.x.dtype)  # kept alive with it
            self._graph, self._grads = self._record(lambda: self.padded_grads(self._meta, self._rows), gen, state)
        except Exception as err:  # noqa: BLE001 - any failure: the unreplayed step is always correct
            first = str(err).splitlines()[0] if str(err) else ""
            self.graph_reason = f"capture failed ({type(err).__name__}: {first})"
            log.warning("CUDA graph: %s; every step runs unreplayed", self.graph_reason)
            self._graph = None
            try:
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
            finally:
                gen.set_state(state)
            return False
        gen.set_state(state)  # neither the warm-up nor the capture uses up noise: the stream continues here
        log.info("CUDA graph: the unlogged steps replay one graph over %d rows (batches above that and logged "
                 "steps run unreplayed)", cap)
        return True

    @staticmethod
    def _record(body, gen: torch.Generator, state: torch.Tensor) -> tuple[Any, list[torch.Tensor]]:
        """Warm ``body`` up on a side stream (library handles, lazy initialisation), then capture
        it as a CUDA graph that draws from ``gen`` at each replay: (graph, body's outputs, which
        each replay overwrites). The tests replace this on the CPU."""
        dev = torch.device(gen.device)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                body()
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)
        gen.set_state(state)  # the warm-up's draws are discarded
        graph = torch.cuda.CUDAGraph()
        # a generator other than the device's default must be registered, so that each replay
        # advances it and draws fresh numbers (torch >= 2.4; without it the capture fails)
        graph.register_generator_state(gen)
        with torch.cuda.graph(graph):
            outputs = body()
        return graph, outputs

    @staticmethod
    def _host_buffer(size: int) -> torch.Tensor:
        """A page-locked int64 host buffer (torch's caching host allocator)."""
        return torch.empty(size, dtype=torch.int64, pin_memory=True)

    def _replay(self, idx: torch.Tensor) -> StepStats:
        k, cap = idx.numel(), self.capacity
        host = self._host_buffer(cap + 1)
        h = host.numpy()
        h[:k] = idx.numpy()
        h[k:cap] = 0
        h[cap] = k
        # from page-locked memory without waiting; torch's host allocator reuses `host` only
        # after this copy has run
        self._meta.copy_(host, non_blocking=True)
        self._graph.replay()
        for p, g in zip(self.engine.params, self._grads):
            p.grad = g
        return StepStats(k, float("nan"), 0, 0)
