"""Poisson subsampling of the training rows: each DP-SGD step's batch (docs/privacy.md).

Each of the N rows joins a step's batch independently with probability q (the sample rate the
accountant is told); batches vary in size and may be empty. Three samplers of that one law, by
where the rows live:

* :class:`PoissonSampler`: numpy on the host, O(batch) per step (rows in host memory);
* :class:`PinnedPoissonSampler`: the same numpy draws, the indices copied to a GPU without waiting
  (q <= 0.1: the batch size is known on the host, which a CUDA-graph step needs);
* :class:`DevicePoissonSampler`: a torch generator on the GPU, O(N) per step (q > 0.1).

:func:`make_sampler` picks one for the rows' device, its stream the SECRET "poisson-sampler" stream
of the run's randomness. The engines (dptrain.privacy.dpsgd.engine) take the rows a sampler drew.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["DevicePoissonSampler", "PinnedPoissonSampler", "PoissonSampler", "make_sampler"]


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
