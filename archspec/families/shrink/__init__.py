"""LeViT's shrinking attention between stages.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
