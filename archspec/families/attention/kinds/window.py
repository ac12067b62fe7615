"""Head kind ``window``: Swin's (shifted) window attention, W-MSA and SW-MSA (Liu et al. 2021, sec. 3.2, eq. 2).

Each query attends the keys of its ``w_h x w_w`` window of a partition of the token grid, plus a learned relative
position bias per head read from a ``(2 w_h - 1)(2 w_w - 1)`` table; in a shifted block the partition is displaced
by ``shift`` tokens (a cyclic roll) and the pairs that the roll brings together from opposite borders are masked.
The numerics are timm 1.0's (``timm/models/swin_transformer.py``), in timm's order (the index rules are
:mod:`archspec.families.attention.local_rules`, the kernels :mod:`archspec.families.attention.local_kernels`, both
tested against timm's ``SwinTransformerBlock``):

1. **Shift.**  ``shift: alternate`` (the default) is Swin's rule: ``w // 2`` on every odd block of a stage (the
   stage-local index: timm ``SwinTransformerStage``, ``shift_size=0 if (i % 2 == 0) else window_size // 2``), 0 on
   the even ones, resolved per layer (:func:`at_layer`).  A number (or ``[rows, cols]``) shifts every block.
2. **Clamping** (timm ``_calc_window_shift``, ``always_partition=False``): on an axis the window covers (grid side
   <= window side) the window becomes the grid side and the shift 0.  At the spec's own input size a window *larger*
   than its grid is refused (``clamp: false``, the default: a window the spec cannot have meant); a model moved to
   another size (``set_input_size``, ``compile(img_size=)``, timm's ``img_size=``) gets ``clamp: true`` there
   (:func:`at_other_resolution`), so it is timm's model at that size: Swin-T at 128 px runs its last stage (4x4)
   with a 4x4 window, as timm does.  The bias table is the clamped window's, as timm builds it.
3. **Padding.**  A grid that is not a multiple of the window is padded at the bottom / right *after* the roll, with
   zero tokens after ``norm1``: their keys and values are what the qkv projection makes of zero, its bias, and they
   stay unmasked keys (timm pads ``x`` and runs ``qkv`` on the padded windows).  The ``N x N`` dense formula has no
   room for those keys, so the kind owns its reference too (``owns_reference``): under ``attn_impl='dense'`` its heads
   run :func:`~archspec.families.attention.local_kernels.dense_local_attention` over the grid's tokens and the
   padding keys (:func:`~archspec.families.attention.local_kernels.swin_padded_kv`).  The layer's ``N x N`` terms
   (bias, ``-inf`` outside the window), which :meth:`~archspec.families.attention.module.Attention.get_attention`
   reads for the diagnostics, leave the padding keys out (a map over the grid's tokens).
4. **Mask value.**  timm adds ``-100`` (not ``-inf``) between shifted regions; the fast path adds timm's ``-100``, the
   reference ``-inf`` (``exp(-100)`` is below fp32's resolution of the softmax's sum).
5. **No prefix tokens** (Swin has no class token; which window would it sit in?), and a window head composes with no
   other kind (it carries its own bias).  The window heads of a layer share one window and shift (one partition,
   one ``relative_position_bias_table`` under timm's name, ``((2 w_h - 1)(2 w_w - 1), n_window_heads)``); other heads
   of the layer (global, MaiT masks, ...) run beside them on their own paths.

Counts: ``(2 w_h - 1)(2 w_w - 1)`` parameters per window head (the resolved window's); the papers' MACs of ``Q K^T``
and ``A V`` are Swin's ``M^2 H W`` pairs per head (eq. 2's ``2 M^2 h w C`` over the heads, :func:`attention_pairs`);
the partition executes ``num_windows (w_h w_w)^2`` (padding included, :func:`path_macs`).  The fast path is the
window partition (:func:`~archspec.families.attention.local_kernels.window_attention`), chosen at construction for
every grid (a global ``N x N`` product is never cheaper than the partition's ``N w_h w_w``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import HINT, StrictModel

from ..local_rules import check_no_prefix_tokens, resolve_window, window_partition_pairs
from .layer_terms import KindTerms
from .registry import HeadKind, PathContext, ShorthandArgument, register_head_kind

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["WindowSpec", "FIELD", "SHORTHANDS", "LEGEND", "SIZE_PATTERN", "letter", "terms", "shift_of", "resolved",
           "at_layer", "at_other_resolution", "attention_pairs", "params", "macs", "problems", "path", "path_macs",
           "path_logits", "NO_WEIGHT_DECAY", "WindowTerms", "KIND"]

torch = lazy_module("torch")
nn = lazy_module("torch.nn")
F = lazy_module("torch.nn.functional")
timm_layers = lazy_module("timm.layers")
local_kernels = lazy_module("archspec.families.attention.local_kernels")

FIELD = "window"
SHORTHANDS = {"window": {"window": {}}}
LEGEND = {"W": "window (Swin W-MSA / SW-MSA)"}
#: timm's ``SwinTransformer.no_weight_decay``: the bias tables
NO_WEIGHT_DECAY = frozenset({"relative_position_bias_table"})
#: ``7``, ``rows x cols`` (``7x5``) or ``full`` as YAML writes a window; no groups (the JSON Schema's pattern is this
#: one, its groups stripped): a character class admits ``full``, the validator refuses anything else
SIZE_PATTERN = r"\s*[\dful]+\s*[xX]?\s*\d*\s*"
#: the window size that is the whole token grid (CoAtNet's global attention with its relative bias)
FULL = "full"
MAX_WINDOW_SIDE = 256
PATH = "swin"


def _pair(value: Any) -> Any:
    """An int as ``(v, v)``, a list as a tuple, ``'7x5'`` as ``(7, 5)``, ``'7'`` as ``(7, 7)``; anything else as it
    is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, str) and value.strip() != "alternate":
        match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", value)
        if not match:
            raise ValueError(f"a window must look like 7, '7x5' (rows x cols) or 'full', got {value!r}")
        return int(match.group(1)), int(match.group(2) or match.group(1))
    return value


class WindowSpec(StrictModel):
    """Swin window attention of one head (Liu et al. 2021, sec. 3.2; timm ``SwinTransformerBlock``): the head
    attends within ``size`` windows of the token grid, shifted by ``shift`` (cyclic, timm's -100 mask across the
    seam), plus a learned relative-position bias table per head of ``(2 rows - 1)(2 cols - 1)`` entries.  A grid
    that is not a multiple of the window is padded after the roll with zero tokens (keys and values: the qkv bias),
    as timm pads.  No class token.  ``shift: alternate`` is Swin's rule: ``size // 2`` in every odd block of the
    stage, 0 in the even ones.
    """

    size: tuple[int, int] | Literal["full"] = Field(
        (7, 7), description="Window 'rows x cols' in tokens (Swin's M: 7 at 224 px, 12 at 384 px); "
        "an int for a square window; 'full': the whole token grid, at every input size (CoAtNet's global "
        "relative attention, timm TransformerBlock2d).")
    shift: int | tuple[int, int] | Literal["alternate"] = Field(
        "alternate", description="Cyclic shift of the partition in tokens, 0 <= shift < size (W-MSA: "
        "0, SW-MSA: size // 2); 'alternate' is Swin's rule, size // 2 in the odd blocks of the stage, 0 in the "
        "even ones.")
    clamp: bool = Field(
        False, description="A window larger than its token grid is clamped to the grid, shift 0 (timm's rule); "
        "false refuses it.  archspec sets it on a model moved to another input size.")
    pad: bool = Field(
        True, description="A grid that is not a multiple of the window is padded at the bottom / right (Swin, "
        "timm); false refuses it (MaxViT's block attention: timm window_partition asserts the window divides the "
        "map).")
    rel_pos: Literal["bias", "bias_tf", "mlp"] = Field(
        "bias", description="The relative-position term: 'bias' a learned ((2h-1)(2w-1), heads) table (Swin, timm "
        "RelPosBias), 'bias_tf' a (heads, 2h-1, 2w-1) table read at key minus query (timm RelPosBiasTf, the "
        "TensorFlow MaxViT ports), 'mlp' an MLP on log-spaced offsets (timm RelPosMlp, 'rmlp' models).")
    rel_pos_dim: int = Field(512, ge=1, le=4096, description="Hidden width of rel_pos: mlp (timm rel_pos_dim).")

    @field_validator("size", mode="before")
    @classmethod
    def _parse_size(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() == FULL:
            return FULL
        return _pair(value)

    @field_validator("size")
    @classmethod
    def _sides(cls, value: tuple[int, int] | str) -> tuple[int, int] | str:
        if value == FULL:
            return value
        if min(value) < 1 or max(value) > MAX_WINDOW_SIDE:
            raise ValueError(f"window {value[0]}x{value[1]} must have sides between 1 and {MAX_WINDOW_SIDE}")
        return value

    @field_validator("shift", mode="before")
    @classmethod
    def _parse_shift(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() != "alternate":
            raise ValueError(f"shift must be a number of tokens, [rows, cols] or 'alternate', got {value!r}")
        return _pair(value)

    @field_validator("shift")
    @classmethod
    def _below_window(cls, value: Any, info: ValidationInfo) -> Any:
        size = info.data.get("size")
        if value == "alternate" or size is None:
            return value
        if size == FULL:
            if any(value):
                raise ValueError(f"a full window covers the grid: there is nothing to shift, got shift {list(value)}"
                                 f"{HINT}use shift: 0 with size: full")
            return value
        for side, s in zip(size, value):
            if not 0 <= s < side:
                raise ValueError(f"shift {s} must be in [0, window) = [0, {side}){HINT}Swin shifts by window // 2 "
                                 f"= {side // 2} in every other block: shift: alternate (or 0 for W-MSA only)")
        return value


def letter(spec: WindowSpec) -> str:
    """Table letter: ``W`` (shifted or not)."""
    return "W"


def terms(spec: WindowSpec) -> frozenset[str]:
    """As ``N x N`` logit terms, a window is a bias and ``-inf`` outside the window (the padding keys aside: the kind
    runs its own path and reference)."""
    return frozenset({"bias", "block"})


def shift_of(spec: WindowSpec) -> tuple[int, int]:
    """The spec's shift; ``alternate`` not resolved to a layer (a head outside a stage) is block 0's, no shift."""
    return (0, 0) if spec.shift == "alternate" else tuple(spec.shift)


def size_on(spec: WindowSpec, grid: Sequence[int]) -> tuple[int, int]:
    """The window's requested size on ``grid``: ``size``, or the grid itself for ``size: full``."""
    return (int(grid[0]), int(grid[1])) if spec.size == FULL else tuple(spec.size)


def resolved(spec: WindowSpec, grid: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(window, shift)`` as the layer runs them on ``grid`` (timm's clamp, whatever ``clamp`` says: the check of a
    window larger than the grid is :func:`problems`'; a full window is the grid, unshifted).  Raises nothing for a
    valid spec."""
    return resolve_window(tuple(grid), size_on(spec, grid), shift_of(spec))


def at_layer(spec: WindowSpec, layer: int) -> WindowSpec:
    """``shift: alternate`` resolved for the stage-local block ``layer``: ``size // 2`` when it is odd, else 0
    (timm ``SwinTransformerStage``); a full window is never shifted."""
    if spec.shift != "alternate":
        return spec
    shift = (spec.size[0] // 2, spec.size[1] // 2) if layer % 2 and spec.size != FULL else (0, 0)
    return spec.model_copy(update={"shift": shift})


def at_other_resolution(spec: WindowSpec) -> WindowSpec:
    """At another input size the window clamps to a smaller grid, as timm's does: ``clamp: true``; a full window is
    the grid at every size and stays as written."""
    return spec if spec.size == FULL else spec.model_copy(update={"clamp": True})


def attention_pairs(spec: WindowSpec, grid: tuple[int, int], n_prefix: int) -> int:
    """Papers' pairs of one head: ``H W w_h w_w`` (Swin eq. 2, ``M^2 h w``, on the resolved window)."""
    (wh, ww), _ = resolved(spec, grid)
    return grid[0] * grid[1] * wh * ww


def _windows(heads: Sequence) -> list[tuple[int, WindowSpec]]:
    return [(i, h.window) for i, h in enumerate(heads) if getattr(h, FIELD, None) is not None]


def offsets(spec: WindowSpec, grid: Sequence[int]) -> int:
    """Relative offsets of the window resolved on ``grid``, ``(2 w_h - 1)(2 w_w - 1)``: the rows of a bias table, the
    points an MLP term is evaluated at."""
    (wh, ww), _ = resolved(spec, grid)
    return (2 * wh - 1) * (2 * ww - 1)


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """A table's ``(2 w_h - 1)(2 w_w - 1)`` entries per window head (``bias``, ``bias_tf``; the window resolved on
    ``grid``), or the layer's one MLP (``mlp``, timm ``RelPosMlp``: ``Linear(2, d)``, ReLU, ``Linear(d, n)`` with
    biases, ``n`` the window heads)."""
    found = _windows(heads)
    if not found:
        return 0
    spec = found[0][1]
    if spec.rel_pos == "mlp":
        hidden = spec.rel_pos_dim
        return 3 * hidden + (hidden + 1) * len(found)
    return sum(offsets(s, grid) for _, s in found)


def macs(heads: Sequence, grid: tuple[int, int]) -> int:
    """The bias and the region mask are additions: 0 MACs (the papers' convention; the products are counted through
    :func:`attention_pairs`); ``rel_pos: mlp`` evaluates its MLP at every offset, ``T (2 d + d n)`` (``T`` offsets,
    hidden ``d``, ``n`` window heads), once per forward."""
    found = _windows(heads)
    if not found or found[0][1].rel_pos != "mlp":
        return 0
    spec = found[0][1]
    return offsets(spec, grid) * spec.rel_pos_dim * (2 + len(found))


def _at(where: tuple, index: int, name: str) -> tuple:
    return where + (index, FIELD, name) if where[-1] == "heads" else where + (FIELD, name)


def _split(message: str) -> tuple[str, str]:
    text, _, hint = message.partition(HINT)
    return text, hint


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """A window head composed with another kind, in a layer with prefix tokens, with a window larger than the grid
    (unless ``clamp``), or window heads of one layer with different windows or shifts (the first of each)."""
    found = _windows(heads)
    if not found:
        return []
    out = []
    for index, _ in found:
        if len(heads[index].kinds) > 1:
            others = ", ".join(sorted(heads[index].kinds - {FIELD}))
            out.append((_at(where, index, "size")[:-1], f"a window head composes with no other kind, got {others}",
                        "write the other kind on a head of its own (a window head carries its own relative bias)"))
            break
    if n_prefix:
        try:
            check_no_prefix_tokens("window", n_prefix)
        except ValueError as exc:
            out.append((_at(where, found[0][0], "size")[:-1], *_split(str(exc))))
    for index, spec in found:
        if not spec.clamp and spec.size != FULL:
            try:
                resolve_window(grid, spec.size, shift_of(spec), clamp=False)
            except ValueError as exc:
                text, hint = _split(str(exc))
                out.append((_at(where, index, "size"), text, hint + "; or clamp: true (timm's rule)"))
                break
    for index, spec in found:
        if not spec.pad:
            (wh, ww), _ = resolved(spec, grid)
            if grid[0] % wh or grid[1] % ww:
                out.append((_at(where, index, "size"), f"window {wh}x{ww} does not divide the {grid[0]}x{grid[1]} "
                            "token grid, and pad: false refuses padding (MaxViT's window partition)",
                            f"use a window dividing the grid (rows: {_divisors(grid[0])}; cols: {_divisors(grid[1])}), "
                            "an input size whose grid here is a multiple of the window, or pad: true (Swin's)"))
                break
    layouts = {(spec.size, spec.shift, spec.clamp, spec.pad, spec.rel_pos, spec.rel_pos_dim) for _, spec in found}
    if len(layouts) > 1:
        out.append((_at(where, found[-1][0], "size")[:-1], "the window heads of a layer share one window partition "
                    f"and one relative-position term, but this layer has {len(layouts)} settings",
                    "give every window head of the layer the same size, shift, pad and rel_pos (other heads may be "
                    "of any kind)"))
    return out


def _divisors(side: int) -> str:
    """The largest few divisors of ``side`` (a hint's windows that fit), ascending."""
    return ", ".join(str(d) for d in [d for d in range(1, min(side, MAX_WINDOW_SIDE) + 1) if side % d == 0][-4:])


def path(spec: WindowSpec, context: PathContext) -> tuple:
    """Every window head runs on the window partition: ``("swin", window, shift)`` as resolved on the layer's grid
    (under ``attn_impl='dense'`` the kind's own dense reference on the same key).  Never SDPA over ``N x N``: the
    partition multiplies ``N w_h w_w`` pairs, never more than ``N^2``, and the padding keys are the kind's."""
    win, shift = resolved(spec, context.grid)
    return (PATH, win, shift)


def path_macs(key: tuple, grid: tuple[int, int], n_prefix: int, qk_dim: int, v_dim: int) -> int:
    """Executed minus the dense products of one head (``HeadKind.path_macs``): the padded grid's windows against every
    pair, ``(num_windows (w_h w_w)^2 - N^2)(qk_dim + v_dim)``; with the papers' ``H W w_h w_w`` pairs
    (:func:`attention_pairs`) the executed count exceeds the papers' only by the padding."""
    _, win, shift = key
    n = n_prefix + grid[0] * grid[1]
    return (window_partition_pairs(grid, win, shift) - n * n) * (qk_dim + v_dim)


def path_logits(key: tuple, grid: tuple[int, int], n_prefix: int) -> int:
    """Logit elements of one head on the partition: ``num_windows (w_h w_w)^2``."""
    _, win, shift = key
    return window_partition_pairs(grid, win, shift)


# ----------------------------------------------------------------------------------- torch side
_MASKS: dict[tuple, tuple[Tensor, Tensor]] = {}


def _padded_mask(grid: tuple[int, int], window: tuple[int, int], shift: tuple[int, int],
                 device: Any) -> tuple[Tensor, Tensor]:
    """:func:`~archspec.families.attention.local_kernels.swin_window_mask`, bool and long ``(N, N_k)`` (the grid's
    tokens, then timm's padding keys) on ``device``, kept per arguments (the last few): what the dense reference
    and, over the grid's tokens only (:func:`_grid_mask`), the ``N x N`` terms read."""
    key = (tuple(grid), tuple(window), tuple(shift), str(device))
    if key not in _MASKS:
        if len(_MASKS) >= 8:
            _MASKS.clear()
        with torch.device("cpu"):  # index lists on the CPU, whatever device context is active (meta)
            allowed, index = local_kernels.swin_window_mask(grid, window, shift)
        _MASKS[key] = allowed.to(device), index.to(device)
    return _MASKS[key]


def _grid_mask(grid: tuple[int, int], window: tuple[int, int], shift: tuple[int, int],
               device: Any) -> tuple[Tensor, Tensor]:
    """:func:`_padded_mask` over the grid's tokens only, ``(N, N)``: the padding keys left out."""
    allowed, index = _padded_mask(grid, window, shift, device)
    n = grid[0] * grid[1]
    return allowed[:, :n], index[:, :n]


class WindowTerms(KindTerms):
    """Windows in one layer: their relative-position term (the window resolved on the layer's grid) -- ``bias``: timm's
    ``relative_position_bias_table`` ``((2 w_h - 1)(2 w_w - 1), n_window)`` (trunc-normal 0.02 as timm's
    ``WindowAttention.reset_parameters`` and ``RelPosBias``); ``bias_tf``: the same name, ``(n_window, 2 w_h - 1,
    2 w_w - 1)`` read at key minus query (normal 0.02, timm ``RelPosBiasTf``); ``mlp``: ``rel_pos_mlp``, timm's ``Mlp(2,
    rel_pos_dim, n_window)`` with ReLU and dropout 0.125 after it, on the log-spaced offsets (timm ``RelPosMlp``, mode
    ``cr``) --, the ``N x N`` terms for the diagnostics, the partition path and its dense reference.  Publishes
    ``layer.window_heads``.

    Raises (construction):
        ValueError: window heads in a ``batchnorm`` layer (LeViT's: its padding tokens' keys would be a BatchNorm's
            of zero), with prefix tokens, or with different windows, shifts or terms in one layer.
    """

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        super().__init__(layer, heads)
        layer.window_heads = self.heads
        if not self.heads:
            return
        specs = [layer.head_specs[i].window for i in self.heads]
        if layer.norm != "layernorm":
            raise ValueError("window heads run in layernorm attention layers (Swin's), not batchnorm ones")
        check_no_prefix_tokens("window", layer.num_prefix_tokens)
        if len({(s.size, s.shift, s.rel_pos, s.rel_pos_dim) for s in specs}) > 1:
            raise ValueError("the window heads of a layer share one window size, shift and relative-position term")
        self.spec = layer.head_specs[self.heads[0]].window
        self.all_heads = self.heads == list(range(layer.num_heads))
        n = len(self.heads)
        if self.spec.rel_pos == "mlp":
            layer.rel_pos_mlp = timm_layers.Mlp(2, hidden_features=self.spec.rel_pos_dim, out_features=n,
                                                act_layer=nn.ReLU, bias=True, drop=(0.125, 0.0))
            return
        (wh, ww), _ = resolved(self.spec, layer.grid)
        shape = ((2 * wh - 1) * (2 * ww - 1), n) if self.spec.rel_pos == "bias" else (n, 2 * wh - 1, 2 * ww - 1)
        layer.relative_position_bias_table = nn.Parameter(torch.zeros(shape))

    def reset_parameters(self, layer: Any) -> None:
        """``bias``: ``trunc_normal_(std=.02)`` (timm ``WindowAttention``, ``RelPosBias``); ``bias_tf``: ``normal_(std=
        .02)`` (timm ``RelPosBiasTf``); ``mlp``: the layer's own rule for its linears (``layer.init_linear``: timm ViT's
        trunc-normal, or ``MaxxVit``'s xavier-uniform with the biases of an ``mlp`` at ``normal(1e-6)``)."""
        if self.spec.rel_pos == "mlp":
            for linear in (layer.rel_pos_mlp.fc1, layer.rel_pos_mlp.fc2):
                layer.init_linear(linear, mlp=True)
        elif self.spec.rel_pos == "bias":
            timm_layers.trunc_normal_(layer.relative_position_bias_table, std=0.02)
        else:
            nn.init.normal_(layer.relative_position_bias_table, std=0.02)

    def table(self, layer: Any, heads: Sequence[int] | None = None) -> Tensor:
        """The term as Swin's table ``((2 w_h - 1)(2 w_w - 1), len(heads))``, row ``(dy + w_h - 1)(2 w_w - 1) + dx + w_w
        - 1`` for the offset query minus key (timm's ``relative_position_index``), for the layer's window heads
        ``heads`` (default all): ``bias`` as stored; ``bias_tf`` flipped on both axes (it is read at key minus query);
        ``mlp`` evaluated at the window's log-spaced offsets (a constant per window:
        :func:`~archspec.families.attention.local_kernels.log_offsets`)."""
        if self.spec.rel_pos == "mlp":
            (wh, ww), _ = resolved(self.spec, layer.grid)
            coords = local_kernels.log_offsets((wh, ww), layer.parameter_device)
            flat = layer.rel_pos_mlp(coords.to(layer.rel_pos_mlp.fc1.weight.dtype)).view(-1, len(self.heads))
        elif self.spec.rel_pos == "bias_tf":
            table = layer.relative_position_bias_table
            flat = table.flip(1, 2).reshape(table.shape[0], -1).t()
        else:
            flat = layer.relative_position_bias_table
        if heads is None or list(heads) == self.heads:
            return flat
        return flat[:, [self.heads.index(h) for h in heads]]

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """timm's region mask and relative-position index for the layer's grid, built now (kept by
        :func:`~archspec.families.attention.local_kernels.swin_window_tables`, not on the layer), so that
        ``torch.compile`` reads them instead of tracing the Python that builds them; the MLP term's offsets too."""
        win, shift = resolved(self.spec, layer.grid)
        local_kernels.swin_window_tables(layer.grid, win, shift, device)
        if self.spec.rel_pos == "mlp":
            local_kernels.log_offsets(win, device)

    def resize_grid(self, layer: Any, old: tuple[int, int], new: tuple[int, int]) -> None:
        """Where the resolved window changes (a grid smaller than the window; a full window on any new grid), the
        table resampled to it as timm's ``WindowAttention.set_window_size`` and ``RelPosBias(Tf).set_window_size``
        (``resize_rel_pos_bias_table``); the MLP term has nothing to resample (timm ``RelPosMlp``)."""
        before, _ = resolved(self.spec, old)
        after, _ = resolved(self.spec, new)
        if before == after or self.spec.rel_pos == "mlp":
            return
        table = layer.relative_position_bias_table
        if self.spec.rel_pos == "bias":
            shape = ((2 * after[0] - 1) * (2 * after[1] - 1), table.shape[1])
            resized = timm_layers.resize_rel_pos_bias_table(table.data, new_window_size=after, new_bias_shape=shape,
                                                            old_window_size=before)
        else:
            shape = (table.shape[0], 2 * after[0] - 1, 2 * after[1] - 1)
            resized = timm_layers.resize_rel_pos_bias_table(table.data, new_window_size=after, new_bias_shape=shape)
        layer.relative_position_bias_table = nn.Parameter(resized, requires_grad=table.requires_grad)

    # ------------------------------------------------------------------ N x N terms (diagnostics, mixed layers)
    def _mask(self, layer: Any) -> tuple[Tensor, Tensor]:
        """``(allowed, index)`` over the grid's tokens ``(N, N)`` (the padding keys left out), kept per grid and
        device outside the layer (:func:`_grid_mask`): only the ``N x N`` paths of a layer mixing window heads with
        others, and the diagnostics, read them."""
        win, shift = resolved(self.spec, layer.grid)
        return _grid_mask(layer.grid, win, shift, layer.parameter_device)

    def bias(self, layer: Any) -> list[tuple[Any, Tensor]]:
        """The window heads' table read at each pair's offset inside its window, ``(n_window, N, N)``."""
        _, index = self._mask(layer)
        return [(self.heads, local_kernels.relative_bias(self.table(layer).t(), index))]

    def blocked_pairs(self, layer: Any) -> Tensor:
        """``(H, N, N)``: the pairs outside a window head's window (or across timm's shifted regions)."""
        allowed, _ = self._mask(layer)
        block = torch.zeros(layer.num_heads, *allowed.shape, dtype=torch.bool, device=allowed.device)
        block[self.heads] = ~allowed
        return block

    # ------------------------------------------------------------------ the partition and its reference
    def _pad_kv(self, layer: Any, heads: list[int]) -> tuple[Tensor, Tensor] | None:
        """Keys and values of a padding token ``(h, 1, d)``: the qkv projection of zero, its bias (None: no bias)."""
        if layer.qk.bias is None:
            return None
        k_bias = layer.qk.bias.view(2, layer.num_heads, layer.qk_dim)[1]
        v_bias = layer.v.bias.view(layer.num_heads, layer.v_dim)
        if len(heads) != layer.num_heads:
            k_bias, v_bias = k_bias[heads], v_bias[heads]
        return k_bias.unsqueeze(1), v_bias.unsqueeze(1)

    def token_roll(self, layer: Any, key: tuple) -> tuple[int, int] | None:
        """A layer whose heads are all window heads rolls its input by ``-shift`` before its q/k/v projection and its
        output back after the output projection, as timm rolls ``x`` (one roll, not three of q, k, v): the
        projections act per token, so the result is the same.  None without shift."""
        _, _, shift = key
        return tuple(shift) if any(shift) else None

    def path_forward(self, layer: Any, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``("swin", window, shift)``: timm's partition (:func:`~archspec.families.attention.local_kernels.
        window_attention`; on q, k, v the layer already rolled where ``layer.token_roll`` is set), or under the dense
        reference (``layer.uses_dense_reference()``) SDPA over the grid's tokens and the padding keys with the window
        as its mask (``-inf`` outside) and attention dropout."""
        _, win, shift = key
        table = self.table(layer, heads)
        pad_kv = self._pad_kv(layer, heads)
        if not layer.uses_dense_reference():
            return local_kernels.window_attention(q, k, v, layer.grid, win, shift, bias_table=table,
                                                  scale=layer.scale, pad_kv=pad_kv,
                                                  rolled=layer.token_roll is not None)
        allowed, index = _padded_mask(layer.grid, win, shift, q.device)
        keys, values = local_kernels.swin_padded_kv(k, v, layer.grid, win, shift, pad_kv)
        mask = local_kernels.relative_bias(table.t(), index).to(q.dtype).masked_fill(~allowed, float("-inf"))
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask.unsqueeze(0), scale=layer.scale,
                                              dropout_p=layer.attn_drop_p if layer.training else 0.0)


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=WindowSpec,
    description="Swin window attention (W-MSA; shifted, SW-MSA) with its relative-position bias table (Liu et al. "
    "2021; timm SwinTransformerBlock; shorthand window, window:12).",
    shorthands=SHORTHANDS, legend=LEGEND, letter=letter, terms=terms, params=params, macs=macs, problems=problems,
    no_weight_decay=NO_WEIGHT_DECAY, hosts=frozenset({"attention"}),
    shorthand_argument=ShorthandArgument("size", SIZE_PATTERN, "a window size", "window:12",
                                         "a 12x12 window, Swin's shift alternating"),
    schema_alternatives={"size": ({"type": "integer", "description": "square window"},
                                  {"type": "string", "pattern": rf"^{SIZE_PATTERN}$",
                                   "description": "'rows x cols', e.g. '7x5'"})},
    at_layer=at_layer, at_other_resolution=at_other_resolution, pairs=attention_pairs,
    paths=frozenset({PATH}), path=path, path_macs=path_macs, path_logits=path_logits,
    standalone_paths=frozenset({PATH}), owns_reference=True, layer_terms=WindowTerms))
