"""Head kind ``gauss_mask``: a learned Gaussian locality bias per head (GMM-Mask), torch-free rules.

Source: Li & Zhang, "Toward a Deeper Understanding: RetNet Viewed through Convolution" (arXiv 2309.05375; the
"Gaussian mixture mask", GMM), and the authors' code github.com/CatworldLee/Gaussian-Mixture-Mask-Attention,
``models/gmm.py``:

* ``On_attention_gaussian_mask``: ``M0[i, j] = exp(-(dx^2 + dy^2)) ** (1 / 2) = exp(-d_ij^2 / 2)``, with
  ``(dx, dy)`` the column and row offset between patches ``i`` and ``j`` in patch units;
* ``Gaussian_Mixture_Mask.forward``: ``G_h = sum_k alpha_kh * M0 ** (1 / (sigma_kh^2 + 1e-5))``
  ``= sum_k alpha_kh exp(-d_ij^2 / (2 (sigma_kh^2 + 1e-5)))``, two learnable scalars (``alpha``, ``sigma``) per
  Gaussian and head.

What archspec computes, per ``gauss_mask`` head ``h`` (our choices where the paper and code leave room, each
named):

    b_h[i, j] = alpha_h * exp(-d_ij^2 / (2 (sigma_h^2 + 1e-5)))      (patch i, patch j; 0 for prefix tokens)
    A_h = softmax(Q_h K_h^T / sqrt(d) + b_h)

1. **One Gaussian per head** (the issue's "two parameters per head"): the code's mixture with ``K = 1``
   (its default is ``--num_kernals 5``, i.e. 10 parameters per head).
2. **Added to the logits**, not multiplied.  The code multiplies the scaled logits elementwise
   (``models/vit.py``: ``dots = self.mask(dots)``, ``models/gmm.py``: ``return attn * x``); its readme says the
   GMM is "added to the attention scores using the Hadamard product" and that "adding it before and after the
   softmax does not significantly affect the results".  We add ``b_h`` to the logits: a position bias like LeViT's,
   which SDPA takes as its float ``attn_mask`` (the fast path), composes with the other kinds' biases, and never
   rescales the content logits (a multiplicative ``G_h`` near 0 would erase them, and it cannot run on SDPA).
3. **Prefix tokens** (class / distillation) get no bias, in both directions, as LeViT's and CMHSA's biases; the
   authors' GMM models drop the class token (``models/vit.py``: mean pooling when ``is_GMM``).
4. **Initialised local, deterministically**: ``alpha_init = 5``, ``sigma_init = 1`` patch (the code draws
   ``sigma ~ N(10, 10^2)`` and ``alpha ~ N(0, 2^2)``, mostly wide and of either sign).  With zero content logits a
   patch query then puts 79 % of its attention on its 3x3 window (49 % on itself) on an 8x8 grid, 56 % (34 %) on
   14x14 -- a soft 3x3 window the head can widen (``sigma``) or switch off (``alpha -> 0``).
5. **No weight decay** on ``gauss_alpha`` / ``gauss_sigma``, as archspec treats every position parameter (the
   authors' AdamW decays all parameters).

Counts: 2 parameters per head; 0 MACs (an elementwise bias built once per forward in training, once in eval, on
the ``(N_p, N_p)`` distance table, independent of the batch: the papers' convention for biases and masks, as
:mod:`.rel_bias`).  The torch side is :class:`GaussTerms` (``gauss_alpha``, ``gauss_sigma``, the distance buffer
``gauss_dist2`` and, where not every head is Gaussian, the head indices ``gauss_head_idx``, :func:`scattered`; the
bias joins :meth:`~archspec.families.attention.module.Attention.position_bias`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import HINT, StrictModel

from .layer_terms import KindTerms
from .registry import HeadKind, register_head_kind

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["GaussMaskSpec", "FIELD", "SHORTHANDS", "LEGEND", "letter", "terms", "params", "macs", "tables",
           "scattered", "problems", "NO_WEIGHT_DECAY", "SIGMA_EPS", "DEFAULT_ALPHA", "DEFAULT_SIGMA", "GaussTerms",
           "GaussMethods", "KIND"]

torch = lazy_module("torch")
nn = lazy_module("torch.nn")
grid_tables = lazy_module("archspec.families.attention.tables")

FIELD = "gauss_mask"
SHORTHANDS = {"gauss_mask": {"gauss_mask": {}}}
LEGEND = {"D": "Gaussian decay bias (GMM-Mask)"}
NO_WEIGHT_DECAY = frozenset({"gauss_alpha", "gauss_sigma"})  # position parameters, not weights
#: the authors' ``sigma ** 2 + 1e-5`` (models/gmm.py): a width of 0 stays finite
SIGMA_EPS = 1e-5
DEFAULT_ALPHA, DEFAULT_SIGMA = 5.0, 1.0
F32, I64 = 4, 8


class GaussMaskSpec(StrictModel):
    """Learned Gaussian locality bias of one head (GMM-Mask: Li & Zhang, arXiv 2309.05375, and the authors'
    models/gmm.py): ``b[i, j] = alpha exp(-d_ij^2 / (2 (sigma^2 + 1e-5)))`` added to the patch-patch logits before
    the softmax, ``d_ij`` the distance between patches ``i`` and ``j`` in patches; ``alpha`` and ``sigma`` are
    learned, two parameters per head, 0 MACs.  Our readings, where the paper's code differs or is silent: one
    Gaussian per head (the code's mixture defaults to 5); *added* to the logits, so it runs on SDPA as a float
    attn_mask (the code multiplies the scaled logits by the mask); class / distillation tokens get no bias (the
    authors' GMM models have none); a deterministic local init (the code draws sigma ~ N(10, 10^2), alpha ~ N(0, 4));
    no weight decay on alpha and sigma.

    Details and sources: ``archspec/families/attention/gauss_mask.py``.
    """
    # (that path is the kind's old home, now kinds/gauss_mask.py: the docstring is the schema's description, which the
    # search spaces' schema, archspec/search/spaces/archspec-space.schema.json, embeds -- left as it is until it can
    # be regenerated with them)

    alpha_init: float = Field(
        DEFAULT_ALPHA, gt=0, le=100,
        description="Initial amplitude alpha of the bias, in logit units (> 0: local). Default 5: with zero content "
        "logits a patch query puts 79 % of its attention on its 3x3 window on an 8x8 grid.",
    )
    sigma_init: float = Field(
        DEFAULT_SIGMA, gt=0, le=1000,
        description="Initial width sigma of the Gaussian, in patches (> 0). Default 1: the bias falls to "
        "exp(-1/2) = 0.61 alpha on the 4 nearest patches.",
    )


def letter(spec: GaussMaskSpec) -> str:
    """Table letter: ``D`` (decay; no 'G', which readers take for GPSA)."""
    return "D"


def terms(spec: GaussMaskSpec) -> frozenset[str]:
    """A Gaussian bias adds to the logits: ``bias`` (SDPA takes it as its float mask)."""
    return frozenset({"bias"})


def _count(heads: Sequence) -> int:
    return sum(getattr(h, FIELD, None) is not None for h in heads)


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """Two per Gaussian head: its amplitude ``gauss_alpha`` and width ``gauss_sigma``.  Raises nothing."""
    return 2 * _count(heads)


def macs(heads: Sequence, grid: tuple[int, int]) -> int:
    """A bias is an addition: 0 MACs (the papers' convention, as :func:`.rel_bias.macs`; its ``N_p^2`` elementwise
    exponentials per head are built once per forward, not per image).  Raises nothing."""
    return 0


def scattered(heads: Sequence) -> bool:
    """Whether a layer adds its Gaussian biases into a wider ``(H, N, N)`` bias by head index (the module's
    ``gauss_head_idx``): it has a Gaussian head, and another head is not Gaussian or a head also has a relative-bias
    table.  Otherwise (every head Gaussian, nothing else) the layer's bias is the Gaussian one itself, zero-padded for
    prefix tokens.  Raises nothing."""
    n = _count(heads)
    return bool(n) and (n < len(heads) or any(getattr(h, "rel_bias", None) is not None for h in heads))


def tables(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    """Bytes of the constant tables of a layer with a Gaussian head: the squared-distance table ``gauss_dist2``,
    float32 ``(N_p, N_p)``, and, when the layer adds the Gaussian biases by head index (:func:`scattered`), the int64
    indices ``gauss_head_idx`` ``(n_gauss,)`` (the eval-mode bias cache is the layer's,
    :func:`archspec.families.attention.rules.caches`)."""
    n = _count(heads)
    return (F32 * n_patches * n_patches + (I64 * n if scattered(heads) else 0)) if n else 0


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """No shape problems: a Gaussian fits any grid (prefix tokens get no bias)."""
    return []


# ----------------------------------------------------------------------------------- torch side
class GaussTerms(KindTerms):
    """Gaussian biases in one layer: ``gauss_alpha`` and ``gauss_sigma`` ``(n_gauss,)``, the squared-distance buffer
    ``gauss_dist2`` ``(N_p, N_p)`` (patch units) and, where the layer adds them by head index (:func:`scattered`),
    the non-persistent ``gauss_head_idx`` ``(n_gauss,)``.  Publishes ``layer.gauss_heads`` and
    ``layer.gauss_scattered``."""

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        super().__init__(layer, heads)
        layer.gauss_heads = self.heads
        layer.gauss_scattered = scattered(layer.head_specs)
        if self.heads:
            layer.gauss_alpha = nn.Parameter(torch.zeros(len(self.heads)))
            layer.gauss_sigma = nn.Parameter(torch.zeros(len(self.heads)))
        if layer.gauss_scattered:  # where the Gaussian biases are added into the layer's (H, N, N) bias
            layer.register_buffer("gauss_head_idx", torch.tensor(self.heads, dtype=torch.long), persistent=False)

    def reset_parameters(self, layer: Any) -> None:
        """``gauss_alpha`` / ``gauss_sigma`` at each head's ``alpha_init`` / ``sigma_init`` (default 5 and 1 patch:
        local)."""
        specs = layer.head_specs
        layer.gauss_alpha.copy_(torch.tensor([specs[i].gauss_mask.alpha_init for i in self.heads]))
        layer.gauss_sigma.copy_(torch.tensor([specs[i].gauss_mask.sigma_init for i in self.heads]))

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """``gauss_dist2``: squared patch distances ``d_ij^2`` (rows and columns in patches), float32
        (:func:`~archspec.families.attention.tables.squared_distances`)."""
        layer.register_buffer("gauss_dist2", grid_tables.squared_distances(layer.grid).to(device), persistent=False)

    def bias(self, layer: Any) -> list[tuple[Any, Tensor]]:
        """The Gaussian heads' :meth:`~GaussMethods.gauss_bias`, at ``gauss_head_idx`` where the layer scatters it (no
        index tensor made per forward), else on every head."""
        return [(layer.gauss_head_idx if layer.gauss_scattered else self.heads, layer.gauss_bias())]


class GaussMethods:
    """What the Gaussian bias adds to :class:`~archspec.families.attention.module.Attention`'s public methods."""

    def gauss_bias(self) -> Tensor:
        """Gaussian bias of the Gaussian heads, ``(n_gauss, N_p, N_p)`` on the patch-patch block (GMM-Mask,
        Li & Zhang, arXiv 2309.05375, authors' ``models/gmm.py`` with one Gaussian per head):

            ``b_h[i, j] = gauss_alpha_h * exp(-d_ij^2 / (2 (gauss_sigma_h^2 + 1e-5)))``

        with ``d_ij^2`` the squared distance between patches ``i`` and ``j`` in patch units (``gauss_dist2``,
        :func:`~archspec.families.attention.tables.squared_distances`), in logit units; the heads in head order.
        Differentiable in ``gauss_alpha`` and ``gauss_sigma``.

        Raises:
            ValueError: when the layer has no Gaussian head.
        """
        if not self.gauss_heads:
            raise ValueError("this attention layer has no gauss_mask head")
        sigma2 = self.gauss_sigma.pow(2) + SIGMA_EPS
        return self.gauss_alpha.view(-1, 1, 1) * torch.exp(
            -self.gauss_dist2.to(sigma2.dtype) / (2.0 * sigma2).view(-1, 1, 1))


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=GaussMaskSpec,
    description="Learned Gaussian locality bias alpha exp(-d^2 / (2 (sigma^2 + 1e-5))) on the logits, two "
    "parameters per head (GMM-Mask, arXiv 2309.05375; shorthand gauss_mask).",
    shorthands=SHORTHANDS, legend=LEGEND, letter=letter, terms=terms, params=params, macs=macs, tables=tables,
    problems=problems, no_weight_decay=NO_WEIGHT_DECAY,
    argument_hint=f"{HINT}a gauss_mask head has no window: its width is learned; start it wider with "
    "{gauss_mask: {sigma_init: 2.0}}",
    layer_terms=GaussTerms, layer_methods=GaussMethods))
