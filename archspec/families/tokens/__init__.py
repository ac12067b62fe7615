"""Class and distillation tokens and the position embedding (rules only: they are the model's parameters).

torch-free rules: :mod:`.rules`.
"""
