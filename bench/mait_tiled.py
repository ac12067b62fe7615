"""MaiT's hard 3x3 masks on the neighbourhood kernel's tiles (issue 81 item 6): does the tiled machinery make the
masked heads faster than archspec's linear-time window path?  CPU, one thread, batch 1, forward.

    OMP_NUM_THREADS=1 taskset -c 0 python bench/mait_tiled.py          # 512 px (32x32 + class token), 2 rounds
    python bench/mait_tiled.py --quick                                # smoke run (numbers meaningless)

MaiT's hard mask (eq. 2) keeps every key: non-neighbours get logit 0 (weight ``e^0``), not ``-inf``.  The tiled
form here (not in the library: it is not faster, see docs/benchmarks.md) runs each ``T x T`` tile of patch
queries against the ``(T + 2)^2`` block of keys holding all their 3x3 windows (truncated at the border, MaiT's
reading), one batched matrix product per tile, plus the prefix keys and one virtual key per query standing for its
``n0`` non-neighbours (logit ``log n0``, value their mean: the sum of all patch values less the window's, folded
into the block's weights).  Compared, on the masked heads of mait_tiny_sch2 at 512 px (head dim 64, a class
token): archspec's linear-time path (``kernels.hard_window_attention``, the model's default there), the tiled form
at tiles 4 and 8, and SDPA without a mask (the unmasked model's heads).  Outputs are checked against the dense
formula (``softmax(M (.) Q K^T s) V``) first.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from archspec.families.attention import kernels
from archspec.families.attention.mask_terms import window_mask


def _axis(length: int, tile: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key block of each tile (``(n_tiles, kb)``, clamped inside the axis) and whether each tile query (padded
    queries copy the last position) has each block key within ``half`` (its window, truncated at the border)."""
    n, kb = -(-length // tile), min(tile + 2 * half, length)
    block = torch.tensor([min(max(t * tile - half, 0), length - kb) for t in range(n)])[:, None] + torch.arange(kb)
    query = torch.arange(n * tile).clamp(max=length - 1).view(n, tile)
    return block, (block[:, None, :] - query[:, :, None]).abs() <= half


def tiled_tables(grid: tuple[int, int], window: tuple[int, int], tile: int) -> dict:
    """The tiled form's constant tables for one grid, window and tile."""
    block_r, ok_r = _axis(grid[0], tile, window[0] // 2)
    block_c, ok_c = _axis(grid[1], tile, window[1] // 2)
    nr, nc = block_r.shape[0], block_c.shape[0]
    ok = (ok_r[:, None, :, None, :, None] & ok_c[None, :, None, :, None, :]).reshape(nr, nc, tile * tile, -1)
    return {"rows": block_r.flatten(), "cols": block_c.flatten(), "shape": (nr, nc, block_r.shape[1],
            block_c.shape[1]), "outside": torch.zeros(ok.shape).masked_fill(~ok, float("-inf")),
            "ok": ok.float(), "n0": (grid[0] * grid[1] - ok.sum(-1, keepdim=True)).float()}


def tiled_hard_mask(q, k, v, grid, prefix: int, scale: float, tables: dict, tile: int) -> torch.Tensor:
    """MaiT hard-mask attention ``(B, h, N, d)`` by tiles (module docstring); prefix queries attend every key."""
    B, h, _, d = q.shape
    nr, nc, kbr, kbc = tables["shape"]
    k_patch, v_patch = k[:, :, prefix:], v[:, :, prefix:]

    def blocks(t):
        t = t.reshape(B, h, grid[0], grid[1], -1).index_select(2, tables["rows"]).index_select(3, tables["cols"])
        return t.view(B, h, nr, kbr, nc, kbc, -1).permute(0, 1, 2, 4, 3, 5, 6).reshape(B, h, nr, nc, kbr * kbc, -1)

    qt = F.pad(q[:, :, prefix:].reshape(B, h, grid[0], grid[1], d),
               (0, 0, 0, nc * tile - grid[1], 0, nr * tile - grid[0]))
    qt = qt.view(B, h, nr, tile, nc, tile, d).permute(0, 1, 2, 4, 3, 5, 6).reshape(B, h, nr, nc, tile * tile, d)
    parts = [torch.matmul(qt, k[:, :, :prefix].transpose(-2, -1)[:, :, None, None]) * scale] if prefix else []
    parts += [torch.matmul(qt, blocks(k_patch).transpose(-2, -1)).mul_(scale) + tables["outside"],
              torch.log(tables["n0"]).expand(B, h, nr, nc, tile * tile, 1)]
    weights = torch.cat(parts, -1).softmax(-1)
    virtual = weights[..., -1:] / tables["n0"]  # per non-neighbour
    out = (weights[..., prefix:-1] - virtual * tables["ok"]) @ blocks(v_patch)
    out = out + virtual * v_patch.sum(2)[:, :, None, None, None, :]
    if prefix:
        out = out + weights[..., :prefix] @ v[:, :, :prefix][:, :, None, None]
    out = out.view(B, h, nr, nc, tile, tile, -1).permute(0, 1, 2, 4, 3, 5, 6).reshape(B, h, nr * tile, nc * tile, -1)
    out = out[:, :, :grid[0], :grid[1]].reshape(B, h, grid[0] * grid[1], -1)
    prefix_out = F.scaled_dot_product_attention(q[:, :, :prefix], k, v, scale=scale)
    return torch.cat([prefix_out, out], 2)


def _time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(grid: tuple[int, int], heads: int, rounds: int, reps: int) -> list[dict]:
    """Every form alternating, ``rounds`` times; one row per (round, form): ms and the max |diff| to dense."""
    window, prefix, dim = (3, 3), 1, 64
    n = prefix + grid[0] * grid[1]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))
    scale = dim ** -0.5
    window_tables = kernels.window_tables(grid, window, prefix)
    forms = {"linear-time window path": lambda: kernels.hard_window_attention(q, k, v, grid, window, prefix, scale,
                                                                              window_tables)}
    for tile in (4, 8):
        tables = tiled_tables(grid, window, tile)
        forms[f"tiled, tile {tile}"] = lambda t=tile, tb=tables: tiled_hard_mask(q, k, v, grid, prefix, scale, tb, t)
    forms["SDPA, no mask"] = lambda: F.scaled_dot_product_attention(q, k, v, scale=scale)
    with torch.no_grad():
        dense = ((q @ k.transpose(-2, -1)) * scale).masked_fill(~window_mask(grid, window, prefix), 0.0)
        dense = dense.softmax(-1) @ v
        diffs = {name: (fn() - dense).abs().max().item() for name, fn in forms.items() if "SDPA" not in name}
        rows = []
        for round_ in range(rounds):
            for name, fn in forms.items():
                ms = _time(fn, reps)
                rows.append({"round": round_ + 1, "form": name, "ms": round(ms, 2), "max_abs_diff": diffs.get(name)})
                diff = "" if name not in diffs else f"  (max |diff| to dense {diffs[name]:.1e})"
                print(f"round {round_ + 1}  {name:24s} {ms:7.2f} ms{diff}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", type=int, default=2, help="masked heads (mait_tiny_sch2 layers 0-7: 2)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="a 10x10 grid, 1 round, 1 rep")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, batch 1, fp32, "
          f"{args.heads} heads of 64 + a class token")
    if args.quick:
        return run((10, 10), args.heads, 1, 1)
    return run((32, 32), args.heads, args.rounds, args.reps)


if __name__ == "__main__":
    main()
