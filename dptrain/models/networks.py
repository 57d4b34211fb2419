"""Models built from layers that per-example clipping supports (Linear + elementwise activations).

Every model maps features (n, d) to ``out_features`` outputs per example, a vector (n,) when
there is one (the model then ends in :class:`~dptrain.privacy.dpsgd.layers.Squeeze`). What the outputs mean
(logits, class scores, predictions) is the objective's business (:mod:`dptrain.models.objectives`).
Hydra instantiates them from ``conf/model/*.yaml`` (``_target_``), with ``in_features`` and, when
the objective needs more than one output, ``out_features`` filled in from the data's description.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from dptrain.core.validation import did_you_mean
from dptrain.privacy.dpsgd.layers import Squeeze

__all__ = ["Squeeze", "logit", "mlp"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
}


def _head(width: int, out_features: int) -> list[nn.Module]:
    if out_features < 1:
        raise ValueError(f"out_features={out_features!r} is not allowed: must be an integer >= 1")
    return [nn.Linear(width, out_features)] + ([Squeeze()] if out_features == 1 else [])


def logit(*, in_features: int, out_features: int = 1) -> nn.Sequential:
    """A linear model: one Linear layer to ``out_features`` outputs (logistic regression for one)."""
    return nn.Sequential(*_head(in_features, out_features))


def mlp(*, in_features: int, hidden: Sequence[int] = (64, 64), activation: str = "relu",
        out_features: int = 1) -> nn.Sequential:
    """Multi-layer perceptron: Linear -> activation -> ... -> Linear(., out_features).

    Args:
        in_features: input width (from the data).
        hidden: widths of the hidden layers, e.g. ``[256, 256]``.
        activation: one of relu, tanh, gelu, silu, elu, leaky_relu.
        out_features: outputs per example (1: a vector, for binary logistic).
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"model.activation={activation!r} is not allowed: must be one of {', '.join(_ACTIVATIONS)}"
            f"{did_you_mean(str(activation).lower(), _ACTIVATIONS)}"
        )
    widths = [in_features, *[int(h) for h in hidden]]
    if any(w <= 0 for w in widths[1:]):
        raise ValueError(f"model.hidden={list(hidden)!r} is not allowed: widths must be integers > 0")
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), _ACTIVATIONS[activation]()]
    return nn.Sequential(*layers, *_head(widths[-1], out_features))
