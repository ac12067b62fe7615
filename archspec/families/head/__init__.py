"""The classifier head.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
