"""Optimizer parameter groups that a model's layers ask for: T-CNN's gating parameters (d'Ascoli et al. 2021,
"Transformed CNNs", sec. 3: the gating ``lambda_h`` trains at a larger learning rate, 0.1, without weight decay).

Here, with the training loop that uses them, rather than in :mod:`archspec.transfer.tcnn` (which re-exports both
names), because training sits below the transfers in the layers.
"""

from __future__ import annotations

from torch import nn

from archspec.families.conv_block.module import ConvGPSA

__all__ = ["gating_param_groups", "transformed_layers"]


def transformed_layers(model: nn.Module) -> list[ConvGPSA]:
    """The :class:`ConvGPSA` layers of a T-CNN, in order."""
    return [m for m in model.modules() if isinstance(m, ConvGPSA)]


def gating_param_groups(model: nn.Module, lr: float, gating_lr: float = 0.1, weight_decay: float = 0.05) -> list[dict]:
    """Optimizer groups for fine-tuning a T-CNN (sec. 3): the gating ``lambda_h`` at ``gating_lr`` (paper 0.1) and
    no weight decay; other 1-d parameters (norms, biases, locality, centres) without weight decay; the rest
    with it.  Pass to ``torch.optim.AdamW`` or :func:`archspec.train.train` (``param_groups``)."""
    layers = transformed_layers(model)
    gating = {id(m.gating) for m in layers}
    positional = {id(m.centers) for m in layers}  # 2-d, but positions: no weight decay (as timm's pos_proj-free GPSA)
    groups = {"gating": [], "no_decay": [], "decay": []}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        key = "gating" if id(p) in gating else ("no_decay" if p.ndim <= 1 or id(p) in positional else "decay")
        groups[key].append(p)
    return [{"params": groups["decay"], "lr": lr, "weight_decay": weight_decay},
            {"params": groups["no_decay"], "lr": lr, "weight_decay": 0.0},
            {"params": groups["gating"], "lr": gating_lr, "weight_decay": 0.0}]
