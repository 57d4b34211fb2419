"""The layers the DP engines recognise by type (a leaf module: torch only). The models
(:mod:`dptrain.models.networks`, through :mod:`dptrain.privacy.dpsgd.layers`) use them; the fast engine reads a model's
structure from them, so they live beside the engine, below the models."""

from __future__ import annotations

import torch
from torch import nn


class Squeeze(nn.Module):
    """(n, 1) -> (n,): the output layer of a model with one output per example. The fast DP
    engine recognises it by type."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1)
