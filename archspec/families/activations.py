"""The activations a spec names (``act: gelu``, ``stem.activation: hardswish``), as torch modules."""

from __future__ import annotations

from torch import nn

__all__ = ["ACTIVATIONS", "activation"]

ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "hardswish": nn.Hardswish, "relu": nn.ReLU}


def activation(name: str) -> type[nn.Module]:
    """The ``nn.Module`` class of ``name`` (``gelu``, ``hardswish``, ``relu``).

    Raises:
        KeyError: an unknown name (the spec's ``Literal`` fields allow only these).
    """
    return ACTIVATIONS[name]
