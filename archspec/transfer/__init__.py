"""Weight transfers of the seed papers: CMHSA's exact conv-to-attention construction (App. A.2) with its
two-phase training pipeline, and T-CNN's re-expression of a timm ResNet's 3x3 convolutions as GPSA layers.

Names are imported on first use (PEP 562, as :mod:`archspec` does), so building the command line --
``archspec.cli.transfer`` lives in this package -- never imports torch or timm.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from archspec._util.lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS = {
    "DEFAULT_PEAK": "cmhsa", "TransferError": "cmhsa", "attention_spec": "cmhsa",
    "conv_to_attention_weights": "cmhsa", "conv_to_mhsa": "cmhsa", "patch_offsets": "cmhsa",
    "ConvGPSA": "tcnn", "conv_gpsa_macs": "tcnn", "gating_param_groups": "tcnn", "load_tcnn": "tcnn",
    "tcnn": "tcnn", "tcnn_from_recipe": "tcnn", "tcnn_model": "tcnn", "tcnn_spec": "tcnn",
    "transformed_layers": "tcnn",
}

_SUBMODULES = ("cmhsa", "two_phase", "cli")  # ``tcnn`` is a submodule too, but the name is the function

# A literal list, not ``sorted(_EXPORTS)``: the API docs (griffe) read ``__all__`` statically.
__all__ = [
    "DEFAULT_PEAK", "ConvGPSA", "TransferError", "attention_spec", "conv_gpsa_macs", "conv_to_attention_weights",
    "conv_to_mhsa", "gating_param_groups", "load_tcnn", "patch_offsets", "tcnn", "tcnn_from_recipe", "tcnn_model",
    "tcnn_spec", "transformed_layers",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .cmhsa import (
        DEFAULT_PEAK,
        TransferError,
        attention_spec,
        conv_to_attention_weights,
        conv_to_mhsa,
        patch_offsets,
    )
    from .tcnn import (
        ConvGPSA,
        conv_gpsa_macs,
        gating_param_groups,
        load_tcnn,
        tcnn,
        tcnn_from_recipe,
        tcnn_model,
        tcnn_spec,
        transformed_layers,
    )


class _Package(types.ModuleType):
    """This package's module type: ``archspec.transfer.tcnn`` stays the function.

    The import system binds a loaded submodule as an attribute of its package, and the submodule
    ``tcnn`` shares its name with the documented function ``archspec.transfer.tcnn``; the function keeps
    the attribute (``from archspec.transfer.tcnn import ...`` reads ``sys.modules``, so it still gets the module).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "tcnn" and isinstance(value, types.ModuleType):
            value = value.tcnn
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
