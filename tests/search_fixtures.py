"""A tiny design space shared by the search tests (one stage, 16 or 32 wide, 1-2 blocks, 32 px)."""

TINY_SPACE = {
    "name": "tiny",
    "kind": "design",
    "spec": {
        "input": {"channels": 3, "resolution": 32},
        "stem": {"kind": "conv"},
        "tokens": {"cls_token": "none", "pos_embed": "none"},
        "stages": [{
            "depth": {"int": [1, 2]}, "dim": {"choice": [16, 32]}, "heads": 2, "key_dim": 8, "attn_ratio": 1,
            "mlp_ratio": 2, "norm": "batchnorm", "act": "hardswish", "qkv_bias": False, "attention": "levit_bias",
        }],
        "head": {"pool": "mean", "num_classes": 10},
    },
}


def tiny_masks_space(protocol: str, name: str = "tiny_masks") -> str:
    """A ``kind: masks`` space file of 3 points: an 8 px DeiT (patch 2: a 4x4 grid, class token), one stage of 2
    layers with 2 heads, one masked-head count for the whole stage (no ``group``: ``stages.0.heads_mix.masked``
    in 0..2); ``protocol`` is its ``protocol:`` line's flow mapping (line 3 of the file)."""
    return (f"name: {name}\nkind: masks\nprotocol: {protocol}\nspec:\n  name: {name}\n"
            "  input: {channels: 1, resolution: 8}\n  stem: {kind: patch, patch_size: 2}\n"
            "  tokens: {cls_token: input, pos_embed: learned}\n  stages:\n"
            "    - {depth: 2, dim: 16, heads: 2, heads_mix: {base: mhsa, masked: {int: [0, 2]}, window: 3x3}}\n"
            "  head: {pool: cls, num_classes: 10}\n")
