"""Building modules: the compiler (IR -> ``nn.Module``, :mod:`~archspec.nn.compiler`), the model class users
hold (:mod:`~archspec.nn.model`), BatchNorm folding (:mod:`~archspec.nn.fuse`) and the block modules gathered
under one name (:mod:`~archspec.nn.blocks`)."""
