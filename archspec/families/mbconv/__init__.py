"""MBConv blocks of a conv stage (``block: mbconv``: CoAtNet, MaxViT): torch-free :mod:`.rules`, timm's module in
:mod:`.module`."""

from __future__ import annotations
