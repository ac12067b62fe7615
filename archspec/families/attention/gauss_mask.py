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
:mod:`.rel_bias`).  The torch side is :class:`archspec.families.attention.module.Attention` (``gauss_alpha``,
``gauss_sigma``, the distance buffer ``gauss_dist2`` and, where not every head is Gaussian, the head indices
``gauss_head_idx``, :func:`scattered`; the bias joins
:meth:`~archspec.families.attention.module.Attention.position_bias`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from archspec._util.pydantic_base import StrictModel

__all__ = ["GaussMaskSpec", "FIELD", "SHORTHANDS", "LEGEND", "letter", "params", "macs", "tables", "scattered",
           "problems", "NO_WEIGHT_DECAY", "SIGMA_EPS", "DEFAULT_ALPHA", "DEFAULT_SIGMA"]

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
