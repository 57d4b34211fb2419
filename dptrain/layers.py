"""Small layers shared by the models and the engines. :class:`Squeeze` is defined with the engines
(:mod:`dptrain.privacy.layers`), which recognise it by type, and offered here for the models."""

from __future__ import annotations

from dptrain.privacy.layers import Squeeze

__all__ = ["Squeeze"]
