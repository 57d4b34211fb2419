"""Models built from layers that per-example clipping supports (Linear + elementwise activations).

Every model maps features (n, d) to one logit per example (n,): the loss is binary
cross-entropy. Hydra instantiates them from ``conf/model/*.yaml`` (``_target_``), with
``in_features`` filled in from the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
}


class Squeeze(nn.Module):
    """(n, 1) -> (n,)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1)


def logit(*, in_features: int) -> nn.Sequential:
    """Logistic regression: one Linear layer to a single logit."""
    return nn.Sequential(nn.Linear(in_features, 1), Squeeze())


def mlp(*, in_features: int, hidden: Sequence[int] = (64, 64), activation: str = "relu") -> nn.Sequential:
    """Multi-layer perceptron: Linear -> activation -> ... -> Linear(., 1).

    Args:
        in_features: input width (from the data).
        hidden: widths of the hidden layers, e.g. ``[256, 256]``.
        activation: one of relu, tanh, gelu, silu, elu, leaky_relu.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"model.activation={activation!r} is not allowed: must be one of {', '.join(_ACTIVATIONS)}"
        )
    widths = [in_features, *[int(h) for h in hidden]]
    if any(w <= 0 for w in widths[1:]):
        raise ValueError(f"model.hidden={list(hidden)!r} is not allowed: widths must be integers > 0")
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), _ACTIVATIONS[activation]()]
    layers += [nn.Linear(widths[-1], 1), Squeeze()]
    return nn.Sequential(*layers)
