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
