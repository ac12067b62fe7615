"""CaiT's class-attention stage.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
