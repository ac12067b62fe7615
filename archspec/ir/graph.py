"""The IR as a networkx graph: :func:`build_graph` makes a ``networkx.DiGraph`` of a spec's
:class:`~archspec.ir.plan.Plan`.

Step 2 of 3 (spec -> **graph** -> compile).  The plan (:mod:`archspec.ir.plan`) holds the content -- node records
in execution order with their shapes, counts and memory estimates, and the totals -- and is what a read-only
command needs; this module turns it into the graph the compiler and the search walk: one node per record (its
attributes the record's keys), an edge between consecutive nodes (the data path), and in ``graph.graph`` the
totals plus ``order`` (node names in execution order) and ``spec`` (the plan's copy of the spec).  The graph is
built at most once per plan and shared: read it, do not modify it.  The record keys, the MAC convention and the
memory rule are stated in :mod:`archspec.ir.plan`.
"""

from __future__ import annotations

import threading
import weakref

import networkx as nx

from archspec.ir.plan import Plan, build_plan
from archspec.spec import ArchSpec

__all__ = ["build_graph", "graph_of", "nodes_in_order"]

# the graph of each plan still held (the plans themselves are kept by archspec.ir.plan's memo)
_GRAPHS: weakref.WeakKeyDictionary[Plan, nx.DiGraph] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def graph_of(plan: Plan) -> nx.DiGraph:
    """The ``networkx.DiGraph`` of ``plan``: nodes in execution order carrying their records' attributes, an edge
    from each node to the next, ``graph.graph`` = the totals plus ``order`` and ``spec``.  Built once per plan
    (kept while the plan lives) and shared by every caller.  Raises nothing."""
    with _LOCK:
        graph = _GRAPHS.get(plan)
    if graph is not None:
        return graph
    graph = nx.DiGraph(name=plan.name)
    order = plan.order
    for record in plan.nodes:
        graph.add_node(record["name"], **record)
    graph.add_edges_from(zip(order, order[1:]))
    graph.graph.update(plan.totals, order=list(order), spec=plan.spec)
    with _LOCK:
        return _GRAPHS.setdefault(plan, graph)


def build_graph(spec: ArchSpec) -> nx.DiGraph:
    """The IR of ``spec`` as a graph: :func:`graph_of` its :func:`~archspec.ir.plan.build_plan`.

    One walk per spec content (the plan's memo): analysis, compile, the search's static check and proxy reuse it,
    an equal spec (a copy, a pickle) shares it, a spec changed in place gets its own.  ``graph["spec"]`` is a copy
    of the spec as it was when built (equal to ``spec``, not ``spec`` itself).

    Returns:
        A ``networkx.DiGraph`` whose nodes, in execution order, carry the record keys listed in
        :mod:`archspec.ir.plan`; ``graph.graph`` holds the totals (``params``, ``macs``, ``conv_macs``,
        ``token_macs``, ``macs_executed``, ``output``, the memory figures), ``order`` and ``spec``.  No memory
        limit is applied here: see :func:`~archspec.ir.plan.check_memory`.

    Raises:
        SpecError: every shape problem found, with field paths (:func:`~archspec.ir.plan.build_plan`).
    """
    return graph_of(build_plan(spec))


def nodes_in_order(graph: nx.DiGraph) -> list[dict]:
    """Node attribute dicts of an IR graph in execution order.  Raises nothing."""
    return [graph.nodes[n] for n in graph.graph["order"]]
