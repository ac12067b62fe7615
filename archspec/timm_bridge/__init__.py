"""timm interop: the shipped specs as timm models (:mod:`~archspec.timm_bridge.registry`) and state-dict conversion
between timm models and their compiled equivalents (:mod:`~archspec.timm_bridge.convert`).

(Inside this package ``import timm`` is the timm library: absolute imports.)"""
