"""Weight transfers of the seed papers: CMHSA's exact conv-to-attention construction (App. A.2) and its
two-phase training pipeline."""

from .cmhsa import DEFAULT_PEAK, TransferError, attention_spec, conv_to_attention_weights, conv_to_mhsa, patch_offsets

__all__ = ["DEFAULT_PEAK", "TransferError", "attention_spec", "conv_to_attention_weights", "conv_to_mhsa",
           "patch_offsets"]
