"""The activations a spec names (``act: gelu``, ``stem.activation: hardswish``), as torch modules."""

from __future__ import annotations

from timm.layers.activations import GELUTanh
from torch import nn

__all__ = ["ACTIVATIONS", "activation"]

#: ``gelu_tanh``: TensorFlow's tanh-approximated GELU, timm's ``GELUTanh`` (the MaxViT ``_tf`` ports)
ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "gelu_tanh": GELUTanh, "hardswish": nn.Hardswish,
                                           "relu": nn.ReLU}


def activation(name: str) -> type[nn.Module]:
    """The ``nn.Module`` class of ``name`` (``gelu``, ``gelu_tanh``, ``hardswish``, ``relu``).

    Raises:
        KeyError: an unknown name (the spec's ``Literal`` fields allow only these).
    """
    return ACTIVATIONS[name]
