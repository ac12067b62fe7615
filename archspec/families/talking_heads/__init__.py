"""CaiT's talking-heads attention, optionally with MaiT masks.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
