"""Static memory estimates of one forward pass, per IR node, from shapes alone (no tensor is allocated).

:mod:`archspec.graph` calls these for every node; the rule they implement is stated in the
graph module's docstring.  Every figure is in **bytes**, for **one image** in float32 (4 bytes per
element; index tables are int64, masks bool).  Each function returns a :class:`NodeMemory`:

``act``      peak bytes of the activations alive at once while the node runs in inference, the
             node's input included (held by the caller until the node returns);
``saved``    bytes of every intermediate the node creates -- an upper bound of what autograd keeps
             for the backward pass when training;
``buffers``  persistent non-parameter tensors the node's module holds: relative-position index
             tables, mask tables, and the constant attention-bias / mask caches built by the first
             eval-mode forward (they scale with N^2 and can dominate at large grids).

The phases below follow the modules' forward code in :mod:`archspec.blocks` and timm's LeViT; where a
phase's exact count depends on the kernel, the larger count is taken (conservative).  The tests
compare against the bytes of the tensors a ``TorchDispatchMode`` sees alive at once
(tests/test_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from archspec.heads import HeadSpec

F32 = 4    # bytes per float32 element
I64 = 8    # bytes per int64 index
BOOL = 1   # bytes per bool mask entry


@dataclass(frozen=True)
class NodeMemory:
    """Bytes of one node for one image: ``act`` inference peak, ``saved`` training intermediates, ``buffers``."""

    act: int = 0
    saved: int = 0
    buffers: int = 0


def stem_memory(image: int, layer_outputs: list[int], norm_per_layer: bool) -> NodeMemory:
    """A stem: ``image`` input elements; ``layer_outputs`` output elements of each conv (one for a patch stem).

    A conv + BatchNorm layer holds its input, the conv output and the BN output at once; the
    activation between layers makes a third copy (``saved``).  The image itself is counted by the
    caller (it stays alive for the whole forward).
    """
    copies = 2 if norm_per_layer else 1
    inputs = [0] + layer_outputs[:-1]
    act = max(i + copies * o for i, o in zip(inputs, layer_outputs))
    saved = sum((copies + (1 if norm_per_layer else 0)) * o for o in layer_outputs)
    return NodeMemory(act=F32 * act, saved=F32 * saved)


def concat_memory(n_in: int, n_out: int, dim: int, pos_embed: bool) -> NodeMemory:
    """Prepending class/distillation tokens (``torch.cat``: a new tensor) and adding the position embedding."""
    x_in, x_out = n_in * dim, n_out * dim
    copies = 2 if pos_embed else 1
    return NodeMemory(act=F32 * (x_in + copies * x_out), saved=F32 * copies * x_out)


def mlp_memory(n: int, dim: int, hidden: int, batchnorm: bool, layer_scale: bool) -> NodeMemory:
    """The MLP half of a block: input, the attention residual sum, the norm output, and two hidden copies
    (fc1 output and its activation; LeViT: linear and BatchNorm outputs) at once."""
    x, hid = n * dim, n * hidden
    extra = x if layer_scale else 0
    act = 3 * x + 2 * hid + extra
    saved = (2 if batchnorm else 1) * x + (3 if batchnorm else 2) * hid + 2 * x + extra
    return NodeMemory(act=F32 * act, saved=F32 * saved)


def _logit_terms(heads: list[HeadSpec], n: int, n_patches: int) -> tuple[int, int, int]:
    """(extra ``(H, N, N)`` copies alive in the logit phase, copies saved, GPSA elements ``n_gpsa N_p^2``)."""
    n_heads = len(heads)
    gpsa = sum(h.gpsa is not None for h in heads)
    soft = any(h.mask is not None and h.mask.mode == "soft" for h in heads)
    hard = any(h.mask is not None and h.mask.mode == "hard" for h in heads)
    strict = any(h.mask is not None and h.mask.mode == "strict" for h in heads)
    bias = any(h.rel_bias is not None for h in heads)
    logits = n_heads * n * n
    if gpsa or hard or soft:  # explicit softmax path: matmul, scale, bias, mask product, softmax
        alive = 2 * logits + (logits if soft else 0) + (logits if bias else 0) + (logits // 4 if strict else 0)
        saved = (3 + bias + hard + soft + strict) * logits
    elif bias or strict:  # SDPA with a float mask: the mask (built twice for strict) and the kernel's logits
        alive = logits * (1 + bias) + ((2 * logits + logits // 4) if strict else 0)
        saved = 2 * logits + alive
    else:  # SDPA without a mask: the flash kernel keeps no (N, N) tensor; count one to stay conservative
        alive, saved = logits, 2 * logits
    g = gpsa * n_patches * n_patches
    if gpsa:  # positional scores, their softmax, the gated mix and its normalisation (ConViT eq. 5-7)
        alive = max(alive, logits + 6 * g + (logits if gpsa < n_heads else 0))
        saved += 6 * g + (logits if gpsa < n_heads else 0)
    return alive, saved, g


def attention_memory(n: int, n_patches: int, dim: int, heads: list[HeadSpec], qk_dim: int, v_dim: int,
                     batchnorm: bool) -> NodeMemory:
    """The attention half of a block on ``N`` tokens (``n_patches`` of them on the grid), width ``dim``.

    Alive throughout: the block input, the norm output (layernorm family), q/k/v; then the largest of
    the q/k copies of the ``Q K^T`` matmul, the logit phase (see :func:`_logit_terms`), ``A V`` with
    its contiguous copy of v, and the output projection.
    """
    n_heads = len(heads)
    x = n * dim
    qk, v, out = n * 2 * n_heads * qk_dim, n * n_heads * v_dim, n * n_heads * v_dim
    logits = n_heads * n * n
    alive_logits, saved_logits, _ = _logit_terms(heads, n, n_patches)
    base = x + (0 if batchnorm else x) + qk + v
    phases = [
        qk + v if batchnorm else 0,  # LinearNorm: linear output and its BatchNorm output at once
        logits + qk,                 # Q K^T: contiguous copies of q and k
        alive_logits,
        logits + v + out,            # A V: probabilities, contiguous v, output
        3 * out + 2 * x,             # transpose copy, activation, projection (+ its BatchNorm)
    ]
    act = base + max(phases) + x     # + the residual sum
    saved = base - x + (qk + v if batchnorm else 0) + saved_logits + 3 * out + 3 * x
    return NodeMemory(act=F32 * act, saved=F32 * saved, buffers=attention_buffers(heads, n, n_patches))


def attention_buffers(heads: list[HeadSpec], n: int, n_patches: int) -> int:
    """Bytes of an attention layer's index tables, masks and eval-mode caches (see :class:`~archspec.blocks.Attention`)."""
    n_heads = len(heads)
    np2, nn = n_patches * n_patches, n * n
    total = 0
    if any(h.rel_bias is not None and h.rel_bias.table == "absolute" for h in heads):
        total += I64 * np2
    if any(h.rel_bias is not None and h.rel_bias.table == "signed" for h in heads):
        total += I64 * np2
    if any(h.rel_bias is not None for h in heads):
        total += F32 * n_heads * nn  # eval-mode bias cache (H, N, N)
    if any(h.gpsa is not None for h in heads):
        total += F32 * 3 * np2       # relative indices (N_p, N_p, 3)
    n_mask = sum(h.mask is not None for h in heads)
    total += BOOL * n_mask * nn
    modes = {h.mask.mode for h in heads if h.mask is not None}
    if "hard" in modes and "soft" not in modes:
        total += F32 * n_heads * nn  # cached hard-mask multiplier (H, N, N)
    return total


def head_memory(n: int, dim: int, n_classes: int) -> NodeMemory:
    """Final norm (a copy of the tokens), pooling and the classifier(s)."""
    return NodeMemory(act=F32 * (2 * n * dim + 4 * (dim + n_classes)), saved=F32 * (n * dim + 4 * (dim + n_classes)))


def format_bytes(n: float) -> str:
    """``49_392_123_904 -> '46.0 GiB'`` (binary units, as the ``--max-memory`` option reads them)."""
    for factor, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= factor:
            return f"{n / factor:.1f} {suffix}"
    return f"{n:.0f} B"


_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_memory(text: "str | int | float", option: str = "--max-memory") -> int:
    """``"32G" -> 32 GiB`` in bytes.  Suffixes K, M, G, T (optionally followed by ``B`` or ``iB``) are
    binary (powers of 1024, as ``docker -m`` and ``free`` read them); a bare number is bytes.

    Raises:
        SpecError: unreadable, non-finite, zero or negative (located at ``option``).
    """
    import math
    import re

    from archspec.errors import SpecError

    hint = "write a size such as 8G, 32G, 512M or 1.5T (binary units: 1G = 2^30 bytes)"
    if isinstance(text, bool):
        raise SpecError.single((option,), f"expected a memory size, got {text!r}", hint)
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
        if not match:
            raise SpecError.single((option,), f"cannot read {text!r} as a memory size", hint)
        value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise SpecError.single((option,), f"a memory limit must be a positive size, got {text!r}", hint)
    return int(value)
