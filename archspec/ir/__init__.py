"""The intermediate representation: the networkx graph of a spec with every node's typed shape, parameter and
MAC counts and memory (:mod:`~archspec.ir.graph`), the checked front door :func:`~archspec.ir.loader.load_spec`,
and the static analysis users see (:mod:`~archspec.ir.analysis`).  Torch-free."""
