"""Static analysis of a spec: parameters, MACs and a per-layer table, from the IR alone (no weights).

MACs follow the papers' "FLOPs" convention (multiply-accumulates; attention matmuls included), see
:mod:`archspec.graph` for the exact counting rules.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from archspec.graph import build_graph, nodes_in_order
from archspec.spec import ArchSpec, load_spec


@dataclass
class LayerRow:
    """One row of the per-layer table: a node of the IR."""

    layer: str   # module path in the compiled model, e.g. "stages.0.blocks.3"
    kind: str    # what the node is: patch16, conv4, attn, levit, conv3, shrink/2, cls-pool...
    heads: str   # head kinds as letters, e.g. "M M G" (G MHSA, P GPSA, B biased, M/S/X hard/soft/strict mask)
    tokens: int  # tokens N after the node
    grid: tuple[int, int]
    dim: int     # width C after the node
    params: int
    macs: int    # multiply-accumulates per image


@dataclass
class Analysis:
    """Totals and per-layer rows of a spec.  ``params`` counts parameters; ``macs`` is per image."""

    name: str
    params: int
    macs: int
    input_shape: tuple[int, int, int]
    output_shape: tuple[int, ...]
    rows: list[LayerRow] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def analyze(spec: "ArchSpec | str | os.PathLike | dict") -> Analysis:
    """Parameters, MACs (per image) and a per-layer table of ``spec``, without building weights.

    Raises:
        SpecError: the spec is invalid.
    """
    spec = spec if isinstance(spec, ArchSpec) else load_spec(spec, check=False)
    graph = build_graph(spec)
    rows = [
        LayerRow(layer=n["name"], kind=n["label"], heads=n["heads"], tokens=n["tokens"], grid=tuple(n["grid"]),
                 dim=n["dim"], params=n["params"], macs=n["macs"])
        for n in nodes_in_order(graph) if n["kind"] not in ("input",)
    ]
    h, w = spec.input.resolution
    return Analysis(name=spec.name, params=graph.graph["params"], macs=graph.graph["macs"],
                    input_shape=(spec.input.channels, h, w), output_shape=graph.graph["output"], rows=rows)


def human(n: float, unit: str = "") -> str:
    """``2_512_000_000 -> '2.51G'``."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.2f}{suffix}{unit}"
    return f"{n:g}{unit}"
