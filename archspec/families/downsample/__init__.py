"""Token-grid downsampling between hierarchical stages: Swin's patch merging and NAT's conv downsampler.

torch-free rules: :mod:`.rules`; the torch side: :mod:`.module`.
"""
