"""Static analysis of a spec: parameters, MACs and a per-layer table, from the IR alone (no weights).

MACs follow the papers' "FLOPs" convention (multiply-accumulates; attention matmuls included), see
:mod:`archspec.ir.plan` for the exact counting rules.  ``macs_executed`` is what the compiled model runs with
``attn_impl='auto'``: hard-masked heads on the linear-time path
(MaiT sec. 5.3, :mod:`archspec.families.attention.rules`)
count their window work instead of ``N^2``; GPSA heads add their ``P @ v`` (``N^2 v_dim``).  BatchNorm counts
0 MACs in both (an affine map per element, folded away entirely by ``model.fuse()``); ``params_folded`` is the
parameter count after that fold.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from archspec.ir.checked import load_spec
from archspec.ir.plan import Plan, build_plan
from archspec.spec import ArchSpec


@dataclass
class LayerRow:
    """One row of the per-layer table: a node of the IR."""

    layer: str   # module path in the compiled model, e.g. "stages.0.blocks.3"
    kind: str    # what the node is: patch16, conv4, attn, levit, conv3, shrink/2, cls-pool...
    heads: str   # head kinds as letters, e.g. "M M A" (archspec.families.attention.heads.HEAD_LETTERS)
    tokens: int  # tokens N after the node
    grid: tuple[int, int]
    dim: int     # width C after the node
    params: int
    macs: int    # multiply-accumulates per image (papers' convention)
    macs_executed: int = 0  # multiply-accumulates per image as executed (linear-time masks, GPSA as SDPA + P V)


@dataclass
class Analysis:
    """Totals and per-layer rows of a spec.  ``params`` counts parameters; ``macs`` is per image.

    Memory estimates of a batch-1 float32 inference forward, in bytes (rule: :mod:`archspec.ir.plan`):
    ``peak_activation_bytes`` the input image plus the largest set of activations alive at once
    (at layer ``peak_layer``); ``weight_bytes`` 4 per parameter; ``buffer_bytes`` index/mask tables
    and eval-mode caches; ``peak_memory_bytes`` their sum, the figure the memory limit applies to.
    ``saved_activation_bytes`` is what training keeps per image for the backward pass (the sum over
    layers).  ``conv_macs`` + ``token_macs`` = ``macs``, split as LeViT Tab. 1: the layers before the tokens
    exist (stem, conv stages, a hybrid's map -> tokens interface; all of a conv net), then the rest.
    """

    name: str
    params: int
    macs: int
    input_shape: tuple[int, int, int]
    output_shape: tuple[int, ...]
    rows: list[LayerRow] = field(default_factory=list)
    peak_activation_bytes: int = 0
    peak_layer: str = ""
    weight_bytes: int = 0
    buffer_bytes: int = 0
    peak_memory_bytes: int = 0
    saved_activation_bytes: int = 0
    macs_executed: int = 0
    params_folded: int = 0
    conv_macs: int = 0
    token_macs: int = 0

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def analyze(spec: ArchSpec | str | os.PathLike | dict) -> Analysis:
    """Parameters, MACs (per image), memory estimates and a per-layer table of ``spec``, without building weights.

    No memory limit is applied: the analysis reports the estimate (``load_spec``/``compile`` refuse).

    Raises:
        SpecError: the spec is invalid (shape problems).
    """
    spec = spec if isinstance(spec, ArchSpec) else load_spec(spec, check=False)
    plan = build_plan(spec)
    rows = [
        LayerRow(layer=n["name"], kind=n["label"], heads=n["heads"], tokens=n["tokens"], grid=tuple(n["grid"]),
                 dim=n["dim"], params=n["params"], macs=n["macs"], macs_executed=n["macs_executed"])
        for n in plan.nodes if n["kind"] not in ("input",)
    ]
    h, w = spec.input.resolution
    totals = plan.totals
    return Analysis(name=spec.name, params=totals["params"], macs=totals["macs"],
                    input_shape=(spec.input.channels, h, w), output_shape=totals["output"], rows=rows,
                    peak_activation_bytes=totals["peak_activation_bytes"], peak_layer=totals["peak_node"],
                    weight_bytes=totals["weight_bytes"], buffer_bytes=totals["buffer_bytes"],
                    peak_memory_bytes=totals["peak_memory_bytes"],
                    saved_activation_bytes=totals["saved_activation_bytes"], macs_executed=totals["macs_executed"],
                    params_folded=totals["params"] - _folded_away(plan), conv_macs=totals["conv_macs"],
                    token_macs=totals["token_macs"])


def _folded_away(plan: Plan) -> int:
    """Parameters that ``model.fuse()`` removes: BatchNorm's ``weight`` and ``bias`` (2C) become the bias (C) of
    the bias-free linear / conv before it, so C per BatchNorm (``bn_channels``); one folded into a layer's existing
    bias -- the head's BatchNorm before its linear (timm ``NormLinear``), a bottleneck's ``bn2`` after its
    attention's output projection -- saves 2C (``bn_channels_into_bias``).  Counted from the plan's records."""
    return sum(n.get("bn_channels", 0) + 2 * n.get("bn_channels_into_bias", 0) for n in plan.nodes)
