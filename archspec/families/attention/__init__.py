"""The attention family: per-head composable self-attention (MHSA plus any registered head kinds).

torch-free to import: :mod:`.kinds` (the head kinds, one module each with its rules and its torch half, and their
registry), :mod:`.heads` (what a head is: :class:`~.heads.HeadSpec`, built from the registry) and :mod:`.rules`
(shape, checks, counts, executed MACs, memory, paths).  torch: :mod:`.module` (:class:`~.module.Attention`,
``build``) with its mixins :mod:`.position_terms` and :mod:`.head_paths`, :mod:`.kernels` (the fast kernels),
:mod:`.mask_terms` (the one mask rule) and :mod:`.tables` (relative-position tables).
"""
