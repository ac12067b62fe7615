"""The intermediate representation: the one walk over a spec (:mod:`~archspec.ir.walk`), its result as a plain
immutable value -- every node's typed shape, parameter and MAC counts and memory, and the totals
(:mod:`~archspec.ir.plan`) -- and the networkx graph made of it (:mod:`~archspec.ir.graph`); the checked front
door :func:`~archspec.ir.checked.load_spec`, and the static analysis users see (:mod:`~archspec.ir.analysis`).
Torch-free; only :mod:`~archspec.ir.graph` imports networkx."""
