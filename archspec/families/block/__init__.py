"""The block around a token mixer: pre-norm ViT block, LeViT residual block.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
