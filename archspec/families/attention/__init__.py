"""The attention family: per-head composable self-attention (MHSA, GPSA, relative biases, MaiT masks).

torch-free: :mod:`.heads` (what a head is, composed from the head kinds :mod:`.gpsa`, :mod:`.rel_bias`,
:mod:`.mask`) and :mod:`.rules` (shape, checks, counts, executed MACs, memory, paths).  torch:
:mod:`.module` (:class:`~.module.Attention`, ``build``), :mod:`.kernels` (the fast paths),
:mod:`.mask_terms` (the one mask rule) and :mod:`.tables` (relative-position tables).
"""
