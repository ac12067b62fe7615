"""Building blocks: per-head composable attention, masks, position tables, mixers, blocks and stems."""

from .attention import Attention, coerce_heads
from .block import LevitBlock, TransformerBlock
from .masks import alpha_to_logit, apply_hard_mask, apply_soft_mask, apply_strict_mask, soft_mask_scale, window_mask
from .mixers import ConvMixer, ZeroPadTokens
from .shrink import ShrinkBlock
from .position import conv_kernel_offsets, gpsa_rel_indices, grid_positions, levit_bias_idxs, signed_bias_idxs
from .stems import ConvStem, IdentityStem, PatchStem

__all__ = [
    "Attention", "coerce_heads",
    "TransformerBlock", "LevitBlock", "ShrinkBlock",
    "window_mask", "apply_hard_mask", "apply_soft_mask", "apply_strict_mask", "soft_mask_scale", "alpha_to_logit",
    "ConvMixer",
    "ZeroPadTokens",
    "grid_positions", "gpsa_rel_indices", "levit_bias_idxs", "signed_bias_idxs", "conv_kernel_offsets",
    "ConvStem", "IdentityStem", "PatchStem",
]
