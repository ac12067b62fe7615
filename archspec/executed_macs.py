"""MACs as archspec executes attention (torch-free, shared by :mod:`archspec.graph` and the attention kernels).

The papers' convention (:mod:`archspec.graph`) counts every head's ``QK^T`` and ``AV`` as ``N^2 (qk_dim + v_dim)``.
A hard-masked head on the linear-time path (:func:`archspec.blocks.fast_attention.hard_window_attention`,
MaiT sec. 5.3) computes far less; a GPSA head on the ``(1 - g) SDPA + g P V`` path computes ``N^2 v_dim`` more
(the ``P V`` product; it still runs faster than the explicit mixture).  These functions say when each path
is taken and what it costs.
"""

from __future__ import annotations

__all__ = ["window_path_pays", "window_attention_macs", "hard_head_on_window_path", "gpsa_head_on_sdpa_path",
           "attention_macs_change"]

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


def hard_head_on_window_path(head, num_patches: int) -> bool:
    """Whether a :class:`~archspec.heads.HeadSpec` runs linear-time under ``attn_impl='auto'``: a hard mask
    without GPSA or relative bias, on a grid past :func:`window_path_pays`."""
    mask = head.mask
    return (mask is not None and mask.mode == "hard" and head.gpsa is None and head.rel_bias is None
            and window_path_pays(num_patches, tuple(mask.window)))


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


def gpsa_head_on_sdpa_path(head) -> bool:
    """Whether a GPSA head runs as ``(1 - g) SDPA(q, k, v) + g (P @ v)`` (no hard/soft mask on its content)."""
    return head.gpsa is not None and (head.mask is None or head.mask.mode == "strict")


def attention_macs_change(heads, qk_dim: int, v_dim: int, grid: tuple[int, int], n_prefix: int) -> int:
    """Executed minus papers' MACs per image of one attention layer under ``attn_impl='auto'``.

    Each linear-time hard head: ``window_attention_macs - N^2 (qk_dim + v_dim)`` (negative); each GPSA head on the
    SDPA path: ``+ N^2 v_dim`` (its ``P @ v``).  ``heads`` are :class:`~archspec.heads.HeadSpec` objects.
    """
    n_patches = grid[0] * grid[1]
    n = n_prefix + n_patches
    change = 0
    for head in heads:
        if hard_head_on_window_path(head, n_patches):
            change += window_attention_macs(grid, tuple(head.mask.window), n_prefix, qk_dim, v_dim)
            change -= n * n * (qk_dim + v_dim)
        elif gpsa_head_on_sdpa_path(head):
            change += n * n * v_dim
    return change
