"""The IR's content as a plain value: :class:`Plan`, the ordered node records of a spec with their shapes,
parameter and MAC counts and memory estimates, plus the totals.

Step 2 of 3 (spec -> **IR** -> compile).  :func:`build_plan` runs the one walk over the spec
(:func:`archspec.ir.walk.walk`) at most once per spec content and keeps the result here, immutable: the records
are read-only mappings, the totals too.  Reading a spec's figures (``archspec validate``, ``list``,
:func:`archspec.analyze`, the search's static check) needs only this plan; the networkx graph that
:func:`archspec.ir.graph.build_graph` makes of it is built where a graph is used (compile, the search).  This
module imports neither torch nor networkx.

Records are in execution order (the data path).  Every record carries:

``kind``      one of ``input, stem, embed, insert, shrink, downsample, block, class_attn, head`` (a conv net:
              ``input, stem, block, head``, its blocks of family ``conv_block``, ``tokens`` the map's pixels
              ``H x W``; a hybrid: its conv stages' blocks, then ``interface`` (map -> tokens), then a token
              model's nodes)
``family``    the block family whose rules counted it (:mod:`archspec.families`); ``shape`` that family's
              typed shape, which :mod:`archspec.nn.compiler` hands to the family's ``build`` (no spec re-read)
``name``      module path in the compiled model (``stages.1.blocks.0``)
``label``     what the block is (``attn``, ``levit``, ``conv3``, ``shrink``...)
``heads``     head kinds as letters, ``"M M A"`` (see :attr:`archspec.families.attention.heads.HeadSpec.letter`)
``tokens``    tokens N after the node; ``grid`` its patch grid ``(rows, cols)``; ``dim`` width C
``params``    parameters (trainable and frozen, not buffers)
``macs``      multiply-accumulates for ONE image
``act_bytes``, ``saved_bytes``, ``buffer_bytes``  memory estimates (below; :mod:`archspec._util.memory`)

MAC convention (the papers' "FLOPs"): every matmul, linear and convolution counts
``output elements x reduction length``; attention counts ``Q K^T`` and ``A V``; GPSA counts its
positional projection ``N^2 * 3 * n_gpsa`` once per forward; softmax, norms, activations, biases
and additions count 0.  ``torch.utils.flop_counter.FlopCounterMode`` reports 2 x this.

Memory rule (bytes, batch 1, float32; each family's ``rules.memory`` has its node's formula).  Inference
memory of a forward = the input image + the largest per-node activation peak + 4 bytes per parameter +
every node's buffers.  A node's activation peak is the sum of the tensors alive at its worst moment:
its input (the caller holds it until the node returns), plus what its forward creates and still
references -- e.g. in an attention block the norm output, q, k and v, then the largest of: the
``(H, N, N)`` logits twice over (a product and its scaled copy; plus one more per additive bias,
soft-mask multiplier or strict mask), the contiguous q/k copies of ``Q K^T``, and ``A V`` with its
contiguous copy of v; in the MLP the input, the residual sum, the norm output and two copies of the
hidden layer.  Buffers are the index and mask tables and what the first eval-mode forward caches:
the bias / mask constants that scale with ``N^2`` and the stacked q/k/v weights of the attention's single
projection GEMM (:func:`archspec.families.attention.rules.caches`, equal to the module's bytes in
tests/test_families.py).  Conservative choices: the SDPA kernel is assumed to materialise the logits
when a mask or bias is passed (PyTorch's CPU kernel then does) and one copy even without; every
phase's count takes the larger of the kernels' possibilities; BatchNorm running statistics are the
only tensors left out.  On the shipped specs the estimate is 1.0-1.5x the bytes a
``TorchDispatchMode`` sees alive at once (tests/test_memory.py).

Training keeps activations for the backward pass, so its figure *sums* what every node creates
(``saved_bytes``) instead of taking the largest peak: ``saved_activation_bytes`` per image;
:func:`archspec.search._evaluation.budget.training_memory` multiplies it by the batch and adds weights,
gradients and AdamW's two moments (4 x the weight bytes).

:func:`check_memory` refuses a spec whose inference estimate exceeds a limit
(:data:`DEFAULT_MAX_MEMORY`, 8 GiB, unless ``max_memory`` says otherwise); :func:`archspec.load_spec`,
:func:`archspec.compile` and ``archspec build/validate --max-memory`` pass the limit through.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from archspec._util.memo import ContentMemo
from archspec._util.memory import format_bytes
from archspec.errors import Problem, SpecError
from archspec.ir.walk import MAX_PARAMS, MAX_TOKENS, walk
from archspec.spec import ArchSpec

__all__ = ["Plan", "build_plan", "check_memory", "check_spec", "DEFAULT_MAX_MEMORY", "MAX_TOKENS", "MAX_PARAMS"]

DEFAULT_MAX_MEMORY = 8 * 2**30  # bytes; well under a 24 GB machine, so a refused spec never reaches the allocator
# the plans built lately, by the content of the spec that built them (a search touches a few specs at a time)
_PLANS = ContentMemo(128)


@dataclass(frozen=True, eq=False)
class Plan:
    """The IR of one spec as an immutable value: node records in execution order and the totals.

    Attributes:
        spec: a copy of the spec as it was when planned (equal to it, not it: a spec changed in place later
            gets its own plan).
        nodes: one read-only mapping per node, in execution order, with the keys listed in the module docstring.
        totals: read-only: ``params``, ``macs`` (per image; split as LeViT Tab. 1 into ``conv_macs``, the nodes
            before the tokens exist, and ``token_macs``, the rest), ``macs_executed``, ``output`` (the last node's
            width, a 1-tuple), and the memory figures in bytes ``peak_activation_bytes``, ``weight_bytes``,
            ``buffer_bytes``, ``peak_memory_bytes``, ``peak_node`` (a node name), ``saved_activation_bytes``.
    """

    spec: ArchSpec
    nodes: tuple[Mapping[str, Any], ...]
    totals: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The spec's name."""
        return self.spec.name

    @property
    def order(self) -> tuple[str, ...]:
        """Node names in execution order."""
        return tuple(n["name"] for n in self.nodes)

    def node(self, name: str) -> Mapping[str, Any]:
        """The record of the node called ``name``.  Raises ``KeyError`` when there is none."""
        for n in self.nodes:
            if n["name"] == name:
                return n
        raise KeyError(name)

    def of_kind(self, kind: str) -> Iterator[Mapping[str, Any]]:
        """The records whose ``kind`` is ``kind``, in execution order."""
        return (n for n in self.nodes if n["kind"] == kind)

    def first(self, kind: str) -> Mapping[str, Any] | None:
        """The first record of ``kind``, or ``None`` when the plan has none."""
        return next(self.of_kind(kind), None)


def build_plan(spec: ArchSpec) -> Plan:
    """The IR of ``spec`` as a :class:`Plan`: shapes, parameter and MAC counts and memory estimates of every node.

    Walked at most once per spec content: the plans built lately are kept here (a
    :class:`~archspec._util.memo.ContentMemo` of 128, keyed on ``spec.model_dump_json()``), never in the spec, so
    the steps after :func:`archspec.load_spec` (which plans the spec to check it) -- analysis, compile, the
    search's static check and proxy -- reuse it, and so does an equal spec (a copy, a pickle, the same YAML
    loaded again).  A spec changed in place (``spec.seed = 1``) has other content and gets its own plan, never a
    stale one.  No memory limit is applied here: see :func:`check_memory`.

    Raises:
        SpecError: every shape problem found (empty grids, non-dividing resolutions, windows larger
            than the grid, GPSA with a class token, head arithmetic, caps), with field paths.
    """
    key = spec.model_dump_json()
    plan = _PLANS.get(key)
    if plan is None:
        own = spec.model_copy(deep=True)
        records, totals = walk(own)
        plan = _PLANS.put(key, Plan(own, tuple(MappingProxyType(r) for r in records), MappingProxyType(totals)))
    return plan


def check_memory(plan: Plan, max_memory: float | None = None) -> list[Problem]:
    """The memory limit: a batch-1 float32 forward must fit in ``max_memory`` bytes.

    Args:
        plan: an IR from :func:`build_plan`.
        max_memory: the limit in bytes; ``None`` takes :data:`DEFAULT_MAX_MEMORY` (read at call time,
            so a program may change the module default); ``math.inf`` disables the check.

    Returns:
        One located problem (at the stage, or the stem/input, holding the peak) when the estimate
        ``plan.totals["peak_memory_bytes"]`` exceeds the limit; else an empty list.  Raises nothing.
    """
    limit = DEFAULT_MAX_MEMORY if max_memory is None else max_memory
    totals = plan.totals
    total = totals["peak_memory_bytes"]
    if total <= limit:
        return []
    node = plan.node(totals["peak_node"])
    path: tuple = (("stages", node["stage"]) if "stage" in node
                   else (("stem",) if node["kind"] == "stem" else ("input", "resolution")))
    message = (f"a batch-1 float32 forward needs an estimated {format_bytes(total)} "
               f"(peak activations {format_bytes(totals['peak_activation_bytes'])} at {node['name']}, "
               f"weights {format_bytes(totals['weight_bytes'])}, "
               f"buffers {format_bytes(totals['buffer_bytes'])}), "
               f"over the memory limit of {format_bytes(limit)}")
    hint = (f"raise the limit (archspec build/validate --max-memory {_suggest(total)}, or max_memory= in load_spec/"
            "compile) if the machine has the memory, or reduce resolution, tokens, heads or head_dim")
    return [Problem(path, message, hint)]


def _suggest(total: float) -> str:
    return f"{math.ceil(total * 1.1 / 2**30)}G"


def check_spec(spec: ArchSpec, max_memory: float | None = None) -> list[Problem]:
    """Every shape problem of ``spec``, then the memory limit (:func:`check_memory`); empty when it compiles.
    A valid spec's plan is kept (:func:`build_plan`) for the steps after.  Raises nothing."""
    try:
        plan = build_plan(spec)
    except SpecError as exc:
        return exc.problems
    return check_memory(plan, max_memory)
