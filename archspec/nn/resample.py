"""A state dict saved at another input size, resampled to a model's (timm ``checkpoint_filter_fn`` style):
the position embedding and the relative bias tables follow the token grid, nothing else changes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from timm.layers import resample_abs_pos_embed
from torch import Tensor

from archspec.families.attention.rules import RESAMPLED_TABLES
from archspec.families.attention.tables import resample_bias_table

if TYPE_CHECKING:  # pragma: no cover
    from archspec.nn.model import ArchModel

__all__ = ["resample_state_dict"]


def _square_side(length: int, what: str) -> int:
    side = math.isqrt(length)
    if side * side != length:
        raise ValueError(f"cannot resample {what}: its saved grid ({length} entries) is not square; load it at its "
                         "own size and call set_input_size instead")
    return side


def resample_state_dict(state_dict: dict[str, Tensor], model: ArchModel) -> dict[str, Tensor]:
    """Adapt a state dict saved at another input size to ``model``'s (timm ``checkpoint_filter_fn`` style).

    Tensors whose shape differs from the model's are resampled as :meth:`ArchModel.set_input_size` does:
    ``pos_embed`` (timm ``resample_abs_pos_embed``), LeViT ``attention_biases`` ``(h, H*W)`` and CMHSA
    ``signed_biases`` ``(h, (2H-1)(2W-1))`` (:func:`~archspec.families.attention.tables.resample_bias_table`).  The
    saved grids are assumed square, as timm does (a bare state dict does not record them); everything else
    is returned unchanged, so ``load_state_dict`` still reports real mismatches.

    Raises:
        ValueError: a saved grid that is not square.
    """

    target = model.state_dict()
    out = dict(state_dict)
    for key, value in state_dict.items():
        want = target.get(key)
        if want is None or want.shape == value.shape:
            continue
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "pos_embed":
            prefix = model.num_prefix_tokens if model.cls_at == 0 else 0
            side = _square_side(value.shape[1] - prefix, key)
            out[key] = resample_abs_pos_embed(value, new_size=list(model.patch_grid), old_size=[side, side],
                                              num_prefix_tokens=prefix)
        elif leaf in RESAMPLED_TABLES:  # LeViT's (H*W) or CMHSA's ((2H-1)(2W-1)) table, on its offset grid
            side, new = _square_side(value.shape[1], key), _square_side(want.shape[1], key)
            out[key] = resample_bias_table(value, (side, side), (new, new))
    return out
