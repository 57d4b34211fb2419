"""The loss an engine uses when it is built without an objective: binary cross-entropy on one
logit per example. The objectives (:mod:`dptrain.models.objectives`) build on it; it lives here so
that privacy/ imports nothing from the layers above it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class BinaryCrossEntropy:
    """What an engine needs from an objective, for one logit per example and 0/1 labels: each
    example's loss, its gradient with respect to the logit, and the number classified correctly."""

    def per_example_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs, y, reduction="none")

    def output_gradient(self, outputs: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """d BCE(z, y) / dz = sigmoid(z) - y (written into ``out`` when given)."""
        return torch.sigmoid(outputs, out=out).sub_(y) if out is not None else torch.sigmoid(outputs).sub_(y)

    def correct(self, outputs: torch.Tensor, y: torch.Tensor) -> int:
        return int(((outputs > 0).to(y.dtype) == y).sum())


#: the engines' default loss
BCE = BinaryCrossEntropy()
