"""The modules archspec compiles specs into, under one name for users (as timm keeps ``timm.layers``).

Each is defined in its block family's folder (:mod:`archspec.families`), next to its torch-free rules;
this module only gathers them.  ``attn_impl`` switches: :func:`set_attention_impl`, :func:`attention_impl`.
"""

from archspec.families.attention.heads import coerce_heads
from archspec.families.attention.mask_terms import soft_mask_scale, window_mask
from archspec.families.attention.module import ATTN_IMPLS, Attention, ZeroPadTokens, attention_impl, set_attention_impl
from archspec.families.attention.tables import (
                                                conv_kernel_offsets,
                                                gpsa_rel_indices,
                                                grid_positions,
                                                levit_bias_idxs,
                                                signed_bias_idxs,
)
from archspec.families.block.module import LevitBlock, TransformerBlock
from archspec.families.class_attention.module import ClassAttentionBlock, ClassAttn
from archspec.families.conv_mixer.module import ConvMixer
from archspec.families.downsample.module import ConvDownsample, TokenPatchMerging
from archspec.families.shrink.module import ShrinkBlock
from archspec.families.stem.module import ConvStem, ConvTokenizer, IdentityStem, PatchStem
from archspec.families.talking_heads.module import TalkingHeadAttn

__all__ = [
    "Attention", "coerce_heads", "ATTN_IMPLS", "set_attention_impl", "attention_impl",
    "TransformerBlock", "LevitBlock", "ShrinkBlock", "TalkingHeadAttn", "ClassAttn", "ClassAttentionBlock",
    "window_mask", "soft_mask_scale",
    "ConvMixer", "ZeroPadTokens",
    "grid_positions", "gpsa_rel_indices", "levit_bias_idxs", "signed_bias_idxs", "conv_kernel_offsets",
    "ConvStem", "IdentityStem", "PatchStem",
    "ConvTokenizer", "TokenPatchMerging", "ConvDownsample",
]
