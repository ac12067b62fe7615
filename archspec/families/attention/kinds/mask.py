"""Head kind ``mask``: MaiT's attention masks (Li et al. 2022, eq. 2 and 4).

A mask keeps a ``rows x cols`` window of patches around each query.  Three modes act on the logits
before the softmax: ``hard`` (eq. 2: non-neighbours get logit exactly 0, weight ``e^0``), ``soft`` (eq. 4:
non-neighbour logits scaled by a learned ``alpha`` in (0, 1) per head) and ``strict`` (non-neighbours
``-inf``; not in the paper, a separately named option).  Class and distillation tokens are neighbours of
every token.

The rules are torch-free, among them which path a masked head takes: a hard mask alone runs linear-time where
that pays on CPU (:func:`window_path_pays`) and on explicit logits below, a hard or soft mask on FlexAttention
with ``attn_impl='flex'``.  The torch side (:class:`MaskTerms`) holds the mask tables and the soft heads'
``mask_alpha_logit``, contributes the three mask terms through :mod:`archspec.families.attention.mask_terms` (the
one mask rule it shares with CaiT's talking heads) and runs those paths through
:mod:`archspec.families.attention.kernels`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import StrictModel

from .layer_terms import KindTerms
from .registry import HeadKind, PathContext, ShorthandArgument, register_head_kind

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["MaskSpec", "FIELD", "SHORTHANDS", "LEGEND", "WINDOW_PATTERN", "parse_window", "letter", "terms", "params",
           "macs", "tables", "caches", "problems", "alpha_to_logit", "NO_WEIGHT_DECAY", "window_path_pays",
           "window_attention_macs", "path", "path_macs", "MaskTerms", "MaskMethods", "KIND"]

torch = lazy_module("torch")
nn = lazy_module("torch.nn")
kernels = lazy_module("archspec.families.attention.kernels")
mask_terms = lazy_module("archspec.families.attention.mask_terms")

FIELD = "mask"
SHORTHANDS = {"mask": {"mask": {}}, "hard_mask": {"mask": {"mode": "hard"}}, "soft_mask": {"mask": {"mode": "soft"}},
              "strict_mask": {"mask": {"mode": "strict"}}}
LEGEND = {"M": "hard mask (MaiT)", "S": "soft mask", "X": "strict mask (-inf)"}
NO_WEIGHT_DECAY = frozenset({"mask_alpha_logit"})  # a placement parameter, not a weight
#: ``rows x cols`` as YAML writes a window (``3x5``, ``3 X 5``); the JSON Schema uses the same pattern
WINDOW_PATTERN = r"\s*(\d+)\s*[xX]\s*(\d+)\s*"
MAX_WINDOW_SIDE = 129
F32, BOOL = 4, 1


def parse_window(text: str) -> tuple[int, int]:
    """``'3x5'`` -> ``(3, 5)``.

    Raises:
        ValueError: the text is not ``rows x cols``.
    """
    match = re.fullmatch(WINDOW_PATTERN, text)
    if not match:
        raise ValueError(f"window must look like '3x3' or '3x5', got {text!r}")
    return int(match.group(1)), int(match.group(2))


class MaskSpec(StrictModel):
    """MaiT attention mask for one head (MaiT eq. 2 and 4).

    The window is ``rows x cols`` patches centred on the query (``3x5`` = 3 rows, 5 columns).
    ``hard``: logits are multiplied by M in {0, 1} *before* the softmax, so non-neighbours keep
    logit 0 (weight e^0), exactly as the paper states.  ``soft``: non-neighbour logits are scaled by a
    learned alpha in (0, 1) per head, ``alpha = sigmoid(a)``.  ``strict``: non-neighbours get -inf
    (not in the paper; a separately named option).  Class and distillation tokens are treated as
    neighbours of every token, in both directions: they attend to all tokens and every patch keeps
    its logit towards them (our reading of MaiT Fig. 1, where the class token "still attends to
    all the patches").
    """

    window: tuple[int, int] = Field(
        (3, 3), strict=False, description="Window 'rows x cols' on the patch grid, e.g. 3x3, 3x5, 5x5."
    )
    depth: int | None = Field(
        None, ge=1, le=64,
        description="MaiT 'mask depth': 1 = 3x3, 2 = 5x5, d = (2d+1)x(2d+1). Overrides window when given.",
    )
    mode: Literal["hard", "soft", "strict"] = Field(
        "hard", description="hard (paper eq. 2), soft (eq. 4), or strict (-inf)."
    )
    alpha_init: float = Field(
        0.5, gt=0, lt=1, description="Initial alpha of a soft mask, in (0, 1); stored as its logit."
    )

    @field_validator("window", mode="before")
    @classmethod
    def _parse_window(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_window(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        return value

    @model_validator(mode="after")
    def _apply_depth(self) -> MaskSpec:
        if self.depth is not None:
            size = 2 * self.depth + 1
            object.__setattr__(self, "window", (size, size))
        rows, cols = self.window
        if rows < 1 or cols < 1 or rows > MAX_WINDOW_SIDE or cols > MAX_WINDOW_SIDE:
            raise ValueError(f"window {rows}x{cols} must have sides between 1 and {MAX_WINDOW_SIDE}")
        if rows % 2 == 0 or cols % 2 == 0:
            raise ValueError(
                f"window {rows}x{cols} has an even side: MaiT windows are centred on the query, "
                "use odd sizes such as 3x3 or 3x5"
            )
        return self


def letter(spec: MaskSpec) -> str:
    """Table letter: ``M`` hard, ``S`` soft, ``X`` strict."""
    return {"hard": "M", "soft": "S", "strict": "X"}[spec.mode]


def terms(spec: MaskSpec) -> frozenset[str]:
    """The logit term of each mode: ``zero`` (hard, eq. 2), ``scale`` (soft, eq. 4), ``block`` (strict, ``-inf``)."""
    return frozenset({{"hard": "zero", "soft": "scale", "strict": "block"}[spec.mode]})


def alpha_to_logit(alpha: float) -> float:
    """``logit(alpha) = log(alpha / (1 - alpha))``: the raw soft-mask parameter for a given initial alpha.

    Raises:
        ValueError: unless ``0 < alpha < 1``.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"soft-mask alpha must lie in (0, 1), got {alpha}")
    return math.log(alpha / (1.0 - alpha))


def _modes(heads: Sequence) -> list[str]:
    return [h.mask.mode for h in heads if h.mask is not None]


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """One learned alpha (``mask_alpha_logit``) per soft-masked head; hard and strict masks have no parameters."""
    return _modes(heads).count("soft")


def macs(heads: Sequence, grid: tuple[int, int]) -> int:
    """A mask is a multiply or fill of the logits: 0 MACs (the papers' convention)."""
    return 0


def tables(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    """Bytes of the constant mask tables: the bool ``(n_mask, N, N)`` neighbourhoods, and for each distinct window of
    the hard heads the linear-time kernel's float32 tables ``outside`` ``(N_p, rows cols)`` and ``n0`` ``(N_p,)``
    (:func:`archspec.families.attention.kernels.window_tables`; the hard term the explicit paths cache is the
    layer's, :func:`archspec.families.attention.rules.caches`)."""
    modes = _modes(heads)
    windows = {tuple(h.mask.window) for h in heads if h.mask is not None and h.mask.mode == "hard"}
    return BOOL * len(modes) * n_tokens * n_tokens + sum(F32 * n_patches * (r * c + 1) for r, c in windows)


def caches(heads: Sequence, paths: frozenset[str], n_tokens: int, n_patches: int) -> int:
    """Bytes of the bool ``(H, N, N)`` hard-mask term the layer caches (in training too: it depends on buffers only)
    when a hard head runs on explicit logits (the ``dense`` or ``hard`` path)."""
    explicit = paths & {"dense", "hard"}
    return BOOL * len(heads) * n_tokens * n_tokens if "hard" in _modes(heads) and explicit else 0


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """A window larger than the token grid (the first such head of the layer)."""
    for h_index, head in enumerate(heads):
        if head.mask is None:
            continue
        rows, cols = head.mask.window
        if rows > grid[0] or cols > grid[1]:
            path = where + (h_index, "mask", "window") if where[-1] == "heads" else where + ("mask", "window")
            return [(path, f"mask window {rows}x{cols} is larger than the {grid[0]}x{grid[1]} token grid",
                     f"use at most a {grid[0] - 1 + grid[0] % 2}x{grid[1] - 1 + grid[1] % 2} window, or a "
                     "larger token grid (larger input or smaller patches)")]
    return []


# ----------------------------------------------------------------------------------- paths
# Crossover measured with timings like bench/speed.py --part kernel (2 heads of 64, batch 1, one CPU thread,
# torch 2.14): the eager window path overtakes the dense path at about 250 patches for a 3x3 window, 350 for 5x5.
_CROSSOVER_BASE_PATCHES = 200
_CROSSOVER_PATCHES_PER_WINDOW_CELL = 6


def window_path_pays(num_patches: int, window: tuple[int, int]) -> bool:
    """Whether the linear-time hard-mask path is expected to beat the dense path on CPU (``attn_impl='auto'``).

    Rule (our measurement): ``num_patches >= 200 + 6 * rows * cols`` (3x3: 254 patches, a 16x16 grid and up;
    5x5: 350).  Below it the window path's ~30 small ops cost more than the ``N^2`` work they save.
    """
    rows, cols = window
    return num_patches >= _CROSSOVER_BASE_PATCHES + _CROSSOVER_PATCHES_PER_WINDOW_CELL * rows * cols


def window_attention_macs(grid: tuple[int, int], window: tuple[int, int], num_prefix_tokens: int,
                          qk_dim: int, v_dim: int) -> int:
    """MACs of one hard-masked head as the linear-time path executes it, per image.

    Patch queries: ``(prefix + rows * cols) * (qk_dim + v_dim)`` each (border windows counted full: the padded
    cells are computed, then discarded); prefix queries attend to all ``N`` tokens: ``N (qk_dim + v_dim)``
    each; plus ``v_dim`` per token for the global value sum.
    """
    n_patches = grid[0] * grid[1]
    n = num_prefix_tokens + n_patches
    per_patch_query = (num_prefix_tokens + window[0] * window[1]) * (qk_dim + v_dim)
    return n_patches * per_patch_query + num_prefix_tokens * n * (qk_dim + v_dim) + n * v_dim


def path(spec: MaskSpec, context: PathContext) -> tuple | None:
    """The path of a masked head: a strict mask is SDPA's ``-inf`` (None: the generic paths decide); with
    ``attn_impl='flex'`` a hard or soft mask without GPSA runs on FlexAttention, ``("flex",)``; a hard mask alone
    (no other term) runs linear-time, ``("window", (rows, cols))``, under ``'fast'``, while ``torch.compile``
    traces (``compiled``: Inductor fuses the kernel's ~30 small ops, after which it beats SDPA on every grid: 14x14
    grid + class token, 2 heads of 64, one CPU thread, torch 2.14, 0.26-0.36 ms vs SDPA's 0.38-0.49 ms) or where
    :func:`window_path_pays`, else on explicit logits, ``("hard",)``; anything else is the dense reference (None)."""
    if spec.mode == "strict":
        return None
    if context.attn_impl == "flex" and "positional" not in context.terms:
        return ("flex",)
    if context.terms != {"zero"}:
        return None
    if context.attn_impl == "fast" or context.compiled or window_path_pays(context.num_patches, tuple(spec.window)):
        return ("window", tuple(spec.window))
    return ("hard",)


def path_macs(key: tuple, grid: tuple[int, int], n_prefix: int, qk_dim: int, v_dim: int) -> int:
    """The linear-time path's saving per head, ``window_attention_macs - N^2 (qk_dim + v_dim)`` (negative); the
    explicit and Flex paths execute the papers' count."""
    if key[0] != "window":
        return 0
    n = n_prefix + grid[0] * grid[1]
    return window_attention_macs(grid, key[1], n_prefix, qk_dim, v_dim) - n * n * (qk_dim + v_dim)


# ----------------------------------------------------------------------------------- torch side
class MaskTerms(KindTerms):
    """MaiT masks in one layer: the soft heads' ``mask_alpha_logit`` ``(n_soft,)`` (``alpha = sigmoid``), the
    non-persistent bool neighbourhoods ``attn_masks`` ``(n_mask, N, N)`` (prefix tokens neighbours of every token:
    :func:`~archspec.families.attention.mask_terms.window_mask`) and, per distinct window of the hard heads, the
    linear-time kernel's tables ``window{r}x{c}_outside`` / ``window{r}x{c}_n0``.  Publishes ``layer.mask_heads``,
    ``hard_heads``, ``soft_heads``, ``strict_heads`` (head indices)."""

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        super().__init__(layer, heads)
        specs = layer.head_specs
        self.modes = [h.mask.mode if h.mask is not None else None for h in specs]
        layer.mask_heads = self.heads
        layer.hard_heads, layer.soft_heads, layer.strict_heads = (
            [i for i in self.heads if self.modes[i] == mode] for mode in ("hard", "soft", "strict"))
        if layer.soft_heads:
            layer.mask_alpha_logit = nn.Parameter(torch.zeros(len(layer.soft_heads)))

    def reset_parameters(self, layer: Any) -> None:
        """Soft-mask logits at ``logit(alpha_init)``."""
        if layer.soft_heads:
            layer.mask_alpha_logit.copy_(torch.tensor(
                [alpha_to_logit(layer.head_specs[i].mask.alpha_init) for i in layer.soft_heads]))

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """The neighbourhoods ``attn_masks`` (same windows, the new grid) and the window tables of the hard heads'
        distinct windows (:func:`~archspec.families.attention.kernels.window_tables`)."""
        specs, p = layer.head_specs, layer.num_prefix_tokens
        masks = [mask_terms.window_mask(layer.grid, specs[i].mask.window, p) for i in self.heads]
        layer.register_buffer("attn_masks", torch.stack(masks).to(device), persistent=False)
        for window in sorted({tuple(specs[i].mask.window) for i in layer.hard_heads}):
            for name, table in kernels.window_tables(layer.grid, window, p).items():
                layer.register_buffer(f"window{window[0]}x{window[1]}_{name}", table.to(device), persistent=False)

    def zero_pairs(self, layer: Any) -> Tensor | None:
        """The hard heads' non-neighbours ``(H, N, N)`` (:func:`~archspec.families.attention.mask_terms.hard_zero`),
        a constant of the buffers: cached (bool, a quarter of a float multiplier's memory)."""
        if not layer.hard_heads:
            return None
        return layer.cached_term(
            "mask.zero", lambda: mask_terms.hard_zero(layer.num_heads, self.modes, layer.attn_masks),
            layer.attn_masks.device, constant=True)

    def logit_scale(self, layer: Any, dtype: Any) -> Tensor | None:
        """The soft heads' multiplier ``M + (1 - M) alpha`` ``(H, N, N)`` (MaiT eq. 4; 1 for every other head)."""
        if not layer.soft_heads:
            return None
        return mask_terms.soft_multiplier(layer.num_heads, self.modes, layer.attn_masks, layer.mask_alpha(), dtype)

    def blocked_pairs(self, layer: Any) -> Tensor | None:
        """The strict heads' non-neighbours ``(H, N, N)``, whose logits become ``-inf``."""
        return mask_terms.strict_block(layer.num_heads, self.modes, layer.attn_masks) if layer.strict_heads else None

    def path_forward(self, layer: Any, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``("window", (r, c))``: :func:`~archspec.families.attention.kernels.hard_window_attention`; ``("hard",)``:
        :func:`~archspec.families.attention.kernels.hard_masked_attention` on the layer's zero term; ``("flex",)``:
        :func:`~archspec.families.attention.kernels.flex_masked_attention` (hard and soft heads, biased or not)."""
        if key[0] == "window":
            prefix = f"window{key[1][0]}x{key[1][1]}_"
            tables = {name: getattr(layer, prefix + name).to(q.dtype) for name in ("outside", "n0")}
            return kernels.hard_window_attention(q, k, v, layer.grid, key[1], layer.num_prefix_tokens, layer.scale,
                                                 tables)
        if key[0] == "hard":
            zero = layer.logit_terms(q.dtype)[0]
            return kernels.hard_masked_attention(q, k, v, layer.select_heads(zero, heads, dim=0), layer.scale)
        return self._flex_forward(layer, heads, q, k, v)

    def _flex_forward(self, layer: Any, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Hard/soft-masked heads (optionally biased): non-neighbours scaled by 0 (hard) or ``alpha`` (soft)."""
        sel = [self.heads.index(h) for h in heads]
        scale = torch.zeros(len(heads), dtype=q.dtype, device=q.device)
        alpha = layer.mask_alpha()
        if alpha is not None:
            soft = [pos for pos, h in enumerate(heads) if h in layer.soft_heads]
            rows = [layer.soft_heads.index(heads[pos]) for pos in soft]
            scale = scale.index_copy(0, torch.tensor(soft, device=q.device, dtype=torch.long), alpha[rows].to(q.dtype))
        bias = layer.position_bias()
        bias = None if bias is None else layer.select_heads(bias, heads, dim=0).to(q.dtype)
        return kernels.flex_masked_attention(q, k, v, layer.scale, layer.attn_masks[sel], scale, bias)


class MaskMethods:
    """What MaiT's masks add to :class:`~archspec.families.attention.module.Attention`'s public methods."""

    def mask_alpha(self) -> Tensor | None:
        """Soft-mask scale ``alpha = sigmoid(mask_alpha_logit)`` per soft head ``(n_soft,)``, or ``None``."""
        return torch.sigmoid(self.mask_alpha_logit) if self.soft_heads else None


#: ``window`` as the JSON Schema writes it (the pattern without its groups)
_WINDOW_TEXT = WINDOW_PATTERN.replace("(", "").replace(")", "")

KIND = register_head_kind(HeadKind(
    field=FIELD, spec=MaskSpec, description="MaiT attention mask.", shorthands=SHORTHANDS, legend=LEGEND,
    letter=letter, terms=terms, params=params, macs=macs, tables=tables, caches=caches, problems=problems,
    no_weight_decay=NO_WEIGHT_DECAY, hosts=frozenset({"attention", "pixel_attention", "talking_heads"}),
    shorthand_argument=ShorthandArgument("window", WINDOW_PATTERN, "a window", "mask:3x5",
                                         "a hard mask with a 3x5 window"),
    schema_alternatives={"window": ({"type": "integer", "description": "square window"},
                                    {"type": "string", "pattern": f"^{_WINDOW_TEXT}$",
                                     "description": "'rows x cols', e.g. '3x5'"})},
    hashed_when_unused=True, paths=frozenset({"window", "hard", "flex"}), path=path, path_macs=path_macs,
    standalone_paths=frozenset({"window"}),
    layer_terms=MaskTerms, layer_methods=MaskMethods))
