"""Weight transfers of the seed papers: CMHSA's exact conv-to-attention construction (App. A.2) with its
two-phase training pipeline, and T-CNN's re-expression of a timm ResNet's 3x3 convolutions as GPSA layers."""

from .cmhsa import DEFAULT_PEAK, TransferError, attention_spec, conv_to_attention_weights, conv_to_mhsa, patch_offsets
from .tcnn import ConvGPSA, conv_gpsa_macs, gating_param_groups, load_tcnn, tcnn, tcnn_from_recipe, transformed_layers

# ``tcnn`` here is the function: it hides the submodule of the same name as an attribute of this package
# (``from archspec.transfer.tcnn import ...`` still reads the module), so every public name of the
# submodule is re-exported above.
__all__ = ["DEFAULT_PEAK", "TransferError", "attention_spec", "conv_to_attention_weights", "conv_to_mhsa",
           "patch_offsets", "ConvGPSA", "conv_gpsa_macs", "gating_param_groups", "load_tcnn", "tcnn",
           "tcnn_from_recipe", "transformed_layers"]
