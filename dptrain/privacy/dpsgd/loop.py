"""THE DP-SGD step of dptrain: one class, :class:`PrivateStep`, that every private loop calls.

Each step: draw the Poisson batch (the sampler's stream), compute the sum of per-example
gradients clipped to C plus N(0, sigma^2 C^2 I) noise divided by the expected batch size (the
engine, which draws the noise after the batch), ``optimizer.step()``, and record the step's
privacy event in the accountant. In that order, always: the sampler's draws come before the
engine's noise draws, so a run's numbers depend on nothing but the two secret streams.

Its callers:

* :func:`dptrain.training.fit._steps` (the command line's training loop): ``step(event)`` with a
  :class:`~dptrain.privacy.dpsgd.graph.BatchStep` doing the draw and the engine (on a GPU the
  unlogged steps replay one CUDA graph);
* :class:`dptrain.training.private.PrivateTraining` (``make_private``, the user's own loop):
  ``draw()`` for the batch its ``batches()`` yields, then ``apply(xb, yb, event)`` in its ``step``;
* ``_sgd_cell`` of :mod:`dptrain.release.methods.dp_sgd` (``release.method=dp_sgd``):
  ``step(None)`` with no accountant (its sigma is calibrated up front for all its steps), the
  projection onto the release's box after each step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dptrain.privacy.accounting import PrivacyLedger
from dptrain.privacy.dpsgd.base import GradientEngine, StepStats
from dptrain.privacy.events import Event

__all__ = ["PrivateStep"]


class PrivateStep:
    """THE DP-SGD step of dptrain (module docstring): sample a Poisson batch, the engine's
    clipped noisy gradient into ``.grad``, ``optimizer.step()``, the privacy event recorded.

    ``engine``: the :class:`~dptrain.privacy.dpsgd.engine.GradientEngine` (its noise generator is
    the secret noise stream); ``sampler``: the Poisson sampler (``sample()`` -> row indices on the
    rows' device); ``x``, ``y``: all training rows; ``accountant``: where each step's event is
    recorded (None: nothing is recorded, for a caller that accounts up front). ``batch_step``: a
    callable doing the draw and the engine in one (fit's :class:`~dptrain.privacy.dpsgd.graph.BatchStep`,
    the same draws from the same streams); :meth:`__call__` uses it in place of
    :meth:`draw` + the engine."""

    def __init__(self, engine: GradientEngine, sampler: Any, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                 y: torch.Tensor, *, accountant: PrivacyLedger | None = None,
                 batch_step: Callable[[], StepStats] | None = None) -> None:
        self.engine, self.sampler, self.optimizer = engine, sampler, optimizer
        self.x, self.y = x, y
        self.accountant, self.batch_step = accountant, batch_step

    def draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next Poisson batch (x rows, y rows): the sampler's next draw. May be empty (a
        noise-only step)."""
        idx = self.sampler.sample()
        return self.x.index_select(0, idx), self.y.index_select(0, idx)

    def apply(self, xb: torch.Tensor, yb: torch.Tensor, event: Event | None) -> StepStats:
        """The step on the batch :meth:`draw` returned: the engine's clipped noisy gradient,
        ``optimizer.step()``, ``event`` recorded (when an accountant is held and ``event`` is
        not None). Returns the engine's non-private diagnostics."""
        return self._finish(self.engine(xb, yb), event)

    def __call__(self, event: Event | None) -> StepStats:
        """One whole step: :meth:`draw` then :meth:`apply` (or ``batch_step()`` for the draw and
        the engine, when given)."""
        if self.batch_step is not None:
            return self._finish(self.batch_step(), event)
        return self.apply(*self.draw(), event)

    def _finish(self, stats: StepStats, event: Event | None) -> StepStats:
        self.optimizer.step()
        if self.accountant is not None and event is not None:
            self.accountant.record(event)
        return stats
