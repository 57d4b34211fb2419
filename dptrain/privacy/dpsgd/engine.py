"""The DP-SGD engines and how one is chosen (docs/engine.md, docs/privacy.md).

A DP-SGD step is three parts, each in its own module:

* batch sampling: the step's Poisson batch (dptrain.privacy.dpsgd.sampling);
* Gaussian noise: ONE draw per step for the whole model, the only place DP-SGD noise is drawn
  (dptrain.privacy.dpsgd.noise: the refined float32 or the float64 Box-Muller sampler);
* the engine (:class:`~dptrain.privacy.dpsgd.base.GradientEngine`, dptrain.privacy.dpsgd.base):
  ``engine(x, y)`` leaves ``(sum_i clip_C(grad_i) + N(0, sigma^2 C^2 I)) / B`` in every trainable
  parameter's ``.grad``.

Engines:

* :class:`~dptrain.privacy.dpsgd.fast.FastLinearEngine` ("fast"): models made of ``nn.Linear``
  layers and elementwise activations, by book-keeping (dptrain.privacy.dpsgd.fast); never
  materialises per-example gradients.
* :class:`OpacusEngine` ("opacus"): any model Opacus' ``GradSampleModule`` supports; per-example
  gradients are materialised by Opacus' hooks, clipping and noise are done here.
* :class:`NonPrivateEngine`: the same pipeline with no clipping and no noise (sum / B).

``ENGINES`` holds them by name (``trainer.engine``); :func:`make_engine` builds one. The engines'
base class and the fast engine are importable from here too (plugins subclass
``dptrain.privacy.dpsgd.engine.GradientEngine``, docs/extending.md).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch import nn

from dptrain.core.registry import Registry
from dptrain.privacy.dpsgd.base import GradientEngine, StepStats
from dptrain.privacy.dpsgd.fast import FastLinearEngine, fast_path_blocker
from dptrain.privacy.dpsgd.units import unit_stats

__all__ = ["ENGINES", "FastLinearEngine", "GradientEngine", "NonPrivateEngine", "OpacusEngine", "StepStats",
           "fast_path_blocker", "make_engine"]

log = logging.getLogger(__name__)


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

    def unit_clipped_sum(self, x: torch.Tensor, y: torch.Tensor, units: Any) -> tuple[list[torch.Tensor], StepStats]:
        """sum_u G_u (no clipping): each row's loss weighted by its unit's combination weight."""
        logits = self.model(x)
        losses = self.objective.per_example_loss(logits, y)
        weighted = losses if units.weights is None else losses * units.weights
        grads = torch.autograd.grad(weighted.sum(), self.params)
        return list(grads), unit_stats(self, logits.detach(), y, losses.detach(), None, units)


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

    def unit_clipped_sum(self, x: torch.Tensor, y: torch.Tensor, units: Any) -> tuple[list[torch.Tensor], StepStats]:
        """Person-level clipping on Opacus' per-example gradients: a segment-sum (``index_add_``) of
        the rows' gradients times their weights into one gradient per unit, G_u, then each G_u
        clipped to C (flat) and summed (dptrain.privacy.dpsgd.units)."""
        logits = self.gsm(x)
        losses = self.objective.per_example_loss(logits, y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            losses.sum().backward()
        with torch.no_grad():
            w = units.weights
            per_unit = []
            for p in self.params:
                g = p.grad_sample.reshape(x.shape[0], -1)
                g = g if w is None else g * w[:, None].to(g.dtype)
                per_unit.append(torch.zeros(units.n_units, g.shape[1], dtype=g.dtype, device=g.device)
                                .index_add_(0, units.index, g))
                p.grad_sample = None
                p.grad = None
            sq = torch.stack([g.pow(2).sum(1) for g in per_unit]).sum(0)
            factors = self.clip_factors(sq)
            sums = [(factors @ g).view_as(p) for p, g in zip(self.params, per_unit)]
        return sums, unit_stats(self, logits.detach(), y, losses.detach(), sq, units)


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
