"""Stems: ViT patch embedding, LeViT conv stem, CMHSA identity stem.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
