"""Storage and input: build directories and atomic writes (:mod:`~archspec.io.builddir`,
:mod:`~archspec.io.atomic`), saved models (:mod:`~archspec.io.artifact`), datasets
(:mod:`~archspec.io.datasets`) and images (:mod:`~archspec.io.images`)."""
