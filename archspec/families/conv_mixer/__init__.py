"""CMHSA's convolution phase: a K x K conv on the pixel view of the tokens.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
