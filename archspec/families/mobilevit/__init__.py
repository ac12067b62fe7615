"""MobileViT's conv stages (``block: mv2``, ``mobilevit``, ``conv_bn_act``: Mehta & Rastegari 2022, timm's
``mobilevit_*``): torch-free :mod:`.rules`, timm's modules in :mod:`.module`."""

from __future__ import annotations
