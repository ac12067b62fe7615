"""ResNet's residual blocks (basic and bottleneck) of a conv stage: torch-free :mod:`.rules`, timm's modules in
:mod:`.module`."""

from __future__ import annotations
