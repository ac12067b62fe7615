"""The malformed-spec suite: every user mistake is a located :class:`SpecError`, never a traceback.

Each case is YAML text written to a real file; the test checks the field path, the 1-based line,
a message substring (and where useful the hint) of the reported problem, and that every problem
names the file and a line.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from archspec.errors import SpecError, format_path
from archspec.ir.checked import load_spec


@dataclass
class Case:
    id: str
    text: str
    path: str  # expected field path of the (first such) problem, as format_path writes it
    line: int  # expected 1-based line in ``text``
    message: str | tuple[str, ...]  # substring(s) the message must contain
    hint: str | None = None  # substring the hint must contain
    count: int | None = None  # expected number of problems, when it matters (no per-layer repeats)


# A Swin stage (32 px, 4x4 patches with a LayerNorm: an 8x8 grid) whose heads the window cases write on line 10.
_SWIN_STAGE = """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4, norm: layernorm}
tokens: {cls_token: none, pos_embed: none}
head: {pool: mean}
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention: """

# A valid base most cases vary: 32x32 input, 4x4 patches -> 8x8 grid, 64 wide, 4 heads.
CASES = [
    # --- YAML level ---------------------------------------------------------------------------
    Case("yaml-syntax", """\
name: t
stages:
  - depth: 2
    dim: [64
    heads: 4
""", "<root>", 5, "invalid YAML", "indentation"),
    Case("yaml-tab", "name: t\nstages:\n  - depth: 2\n\tdim: 64\n", "<root>", 4, ("invalid YAML", "'\\t'")),
    Case("yaml-bad-indent", """\
name: t
stages:
  - depth: 2
     dim: 64
""", "<root>", 4, "invalid YAML", "indentation"),
    Case("yaml-python-tag", """\
name: t
stages: !!python/object/apply:os.system ["touch @TMP@/pwned"]
""", "<root>", 2, ("YAML tag not allowed", "python/object/apply:os.system"), "refused"),
    Case("yaml-duplicate-key", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    depth: 3
""", "stages[0].depth", 6, ("duplicate key 'depth'", "line 3"), "remove one"),
    Case("yaml-empty", "", "<root>", 1, "empty"),
    Case("yaml-comments-only", "# nothing here\n", "<root>", 1, "empty"),
    Case("yaml-top-level-list", """\
- depth: 2
- dim: 64
""", "<root>", 1, ("must be a mapping", "list")),
    Case("yaml-alias-bomb", """\
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
""", "f", 6, "expands to more than", "aliases"),
    # --- schema: missing, unknown, types, ranges ----------------------------------------------
    Case("missing-stages", """\
name: t
input:
  resolution: 32
""", "stages", 1, "missing required key 'stages'", "stages:"),
    Case("missing-depth", """\
name: t
stages:
  - dim: 64
    heads: 4
""", "stages[0].depth", 3, "missing required key 'depth'", "depth:"),
    Case("unknown-key-dpeth", """\
name: t
stages:
  - dpeth: 2
    dim: 64
    heads: 4
""", "stages[0].dpeth", 3, "unknown key 'dpeth'", "did you mean 'depth'", count=1),
    Case("unknown-key-patchsize", """\
name: t
stem:
  kind: patch
  patchsize: 4
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "stem.patchsize", 4, "unknown key 'patchsize'", "did you mean 'patch_size'", count=1),
    Case("unknown-key-nested-gpsa", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention:
      gpsa:
        gating: 1.0
""", "stages[0].attention.gpsa.gating", 8, "unknown key 'gating'", "did you mean 'gating_init'"),
    Case("unknown-key-conv-stem", """\
name: t
stem:
  kind: conv
  chanels: [8, 16, 32, 64]
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "stem.chanels", 4, "unknown key 'chanels'", "did you mean 'channels'"),
    Case("wrong-type-depth", """\
name: t
stages:
  - depth: twelve
    dim: 64
    heads: 4
""", "stages[0].depth", 3, ("valid integer", "'twelve'"), "whole number"),
    Case("wrong-type-bool-depth", """\
name: t
stages:
  - depth: true
    dim: 64
    heads: 4
""", "stages[0].depth", 3, "valid integer", "whole number"),
    Case("wrong-type-quoted-heads", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: "4"
""", "stages[0].heads", 5, "valid integer", "no quotes"),
    Case("wrong-type-fractional-depth", """\
name: t
stages:
  - depth: 2.5
    dim: 64
    heads: 4
""", "stages[0].depth", 3, ("integer", "2.5"), "whole number"),
    Case("stage-not-a-mapping", """\
name: t
stages:
  - 12
""", "stages[0]", 3, ("expected a mapping", "12"), "key: value", count=1),
    Case("stages-not-a-list", """\
name: t
stages:
  depth: 2
""", "stages", 2, "valid list"),
    Case("stages-empty", """\
name: t
stages: []
""", "stages", 2, "at least 1 item"),
    Case("heads-zero", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 0
""", "stages[0].heads", 5, ("greater than or equal to 1", "got 0")),
    Case("resolution-huge", """\
name: t
input:
  resolution: 100000
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "input.resolution", 3, ("between 8 and 1024", "100000")),
    Case("dim-huge", """\
name: t
stages:
  - depth: 2
    dim: 1000000
    heads: 4
""", "stages[0].dim", 4, ("less than or equal to 4096", "1000000")),
    Case("name-bad-characters", """\
name: "my model"
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "name", 1, "'my model'", "letters, digits"),
    Case("cls-token-bad-string", """\
name: t
tokens:
  cls_token: start
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "tokens.cls_token", 3, ("'input', 'none' or a block index", "'start'"), count=1),
    Case("drop-path-one-value", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    drop_path: [0.1]
""", "stages[0].drop_path", 6, "one rate or a pair", count=1),
    Case("drop-path-out-of-range", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    drop_path: [0.1, 1.5]
""", "stages[0].drop_path", 6, "[0, 1)"),
    Case("stem-kind-unknown", """\
name: t
stem:
  kind: convolution
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "stem.kind", 3, ("unknown stem kind 'convolution'", "'patch', 'conv', 'conv_tokenizer', 'identity'"),
         "patch, conv, conv_tokenizer, identity",
         count=1),
    Case("stem-kind-missing", """\
name: t
stem:
  patch_size: 4
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "stem.kind", 3, "needs a 'kind'", "patch, conv, conv_tokenizer, identity"),
    # --- heads, masks, mixers, layer ranges ---------------------------------------------------
    Case("head-kind-unknown", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    layers:
      - range: 0-1
        heads: [mask, mask, mhsa, gspa]
""", "stages[0].layers[0].heads[3]", 8, ("unknown head kind 'gspa'", "gpsa", "mhsa", "soft_mask", "levit_bias")),
    Case("mask-even-window", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention: mask:4x4
""", "stages[0].attention.mask", 6, ("4x4", "even", "odd")),
    Case("mask-window-malformed", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention:
      mask:
        window: 3by3
""", "stages[0].attention.mask.window", 8, ("'3x3'", "'3by3'")),
    Case("mask-window-shorthand-malformed", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention: mask:3y3
""", "stages[0].attention.mask.window", 6, "'3y3'"),
    Case("gauss-mask-sigma-not-positive", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention:
      gauss_mask:
        sigma_init: 0
""", "stages[0].attention.gauss_mask.sigma_init", 8, "greater than 0"),
    Case("gauss-mask-with-a-window", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention: gauss_mask:3x3
""", "stages[0].attention", 6, ("only mask heads take a window", "'gauss_mask:3x3'"), "sigma_init"),
    Case("gauss-mask-in-talking-heads", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
stages:
  - depth: 2
    dim: 64
    heads: 4
    talking_heads: true
    layers:
      - range: 0-1
        heads: [mhsa, gauss_mask, mask, mhsa]
""", "stages[0].talking_heads", 8, ("talking-heads", "got head kinds D"), "mhsa, mask", count=1),
    Case("range-malformed", """\
name: t
stages:
  - depth: 4
    dim: 64
    heads: 4
    layers:
      - range: 0..9
        attention: mask
""", "stages[0].layers[0].range", 7, ("'0-7'", "'0..9'")),
    Case("range-reversed", """\
name: t
stages:
  - depth: 4
    dim: 64
    heads: 4
    layers:
      - range: 3-1
        attention: mask
""", "stages[0].layers[0].range", 7, "3-1 is empty"),
    Case("override-heads-and-attention", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    layers:
      - range: 0-1
        attention: mask
        heads: [mask, mask, mask, mask]
""", "stages[0].layers[0]", 7, "not both"),
    Case("override-nothing", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    layers:
      - range: 0-1
""", "stages[0].layers[0]", 7, "needs 'heads', 'attention' or 'mixer'"),
    Case("mixer-unknown", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    mixer: pooling
""", "stages[0].mixer", 6, ("'pooling'", "'attention', 'conv'")),
    Case("mixer-even-kernel", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    mixer: conv4
""", "stages[0].mixer", 6, ("odd", "got 4")),
    Case("mixer-even-kernel-mapping", """\
name: t
stages:
  - depth: 2
    dim: 64
    heads: 4
    mixer:
      kind: conv
      kernel: 4
""", "stages[0].mixer", 6, ("odd", "got 4")),
    # --- shape checks (graph) -----------------------------------------------------------------
    Case("dim-not-divisible-by-heads", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 2
    dim: 64
    heads: 5
""", "stages[0].heads", 7, "dim 64 is not divisible by 5 heads", "head_dim", count=1),
    Case("gpsa-conv-init-not-square", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: 2}
stages:
  - depth: 2
    dim: 96
    heads: 3
    attention: gpsa
""", "stages[0].attention", 9, ("layers 0-1", "3 GPSA heads have conv_init", "square"), "use 1 or 4", count=1),
    Case("gpsa-with-class-token", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens:
  cls_token: input
stages:
  - depth: 2
    dim: 64
    heads: 4
    layers:
      - range: 0-1
        attention: gpsa
""", "stages[0].layers[0].attention", 12, ("layers 0-1", "GPSA", "class token"), "tokens.cls_token", count=1),
    Case("mask-window-larger-than-grid", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
stages:
  - depth: 2
    dim: 64
    heads: 4
    layers:
      - range: 0-1
        heads: [mhsa, mask:5x5, mhsa, mhsa]
""", "stages[0].layers[0].heads[1].mask.window", 10, ("5x5", "larger than the 4x4 token grid"), "3x3", count=1),
    Case("cls-token-index-beyond-depth", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens:
  cls_token: 7
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "tokens.cls_token", 5, ("block 7", "2 blocks")),
    Case("ranges-overlap", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 4
    dim: 64
    heads: 4
    attention: mhsa
    layers:
      - range: 0-2
        attention: mask
      - range: 2-3
        attention: soft_mask
""", "stages[0].layers[1].range", 12, ("2-3 overlaps range 0-2", "layers[0]", "layer 2"), count=1),
    Case("ranges-gap-without-default", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: none}
head: {pool: mean}
stages:
  - depth: 4
    dim: 64
    heads: 4
    layers:
      - range: 0-1
        attention: mask
""", "stages[0].layers", 10, ("layers 2-3 are not covered", "no default 'attention'"), "attention", count=1),
    Case("range-exceeds-depth", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 4
    dim: 64
    heads: 4
    attention: mhsa
    layers:
      - range: 2-9
        attention: mask
""", "stages[0].layers[0].range", 10, ("2-9 exceeds the stage depth 4", "0-3")),
    Case("per-head-list-length", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 2
    dim: 64
    heads: 4
    layers:
      - range: 0-1
        heads: [mask, mask, mhsa]
""", "stages[0].layers[0].heads", 10, "3 head entries for a stage of 4 heads", "one entry per head"),
    Case("patch-size-does-not-divide", """\
name: t
input: {resolution: 30}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "stem.patch_size", 3, "patch size 4 does not divide the input resolution 30x30", "multiple of 4"),
    Case("patch-larger-than-input", """\
name: t
input:
  resolution: 8
stem:
  kind: patch
  patch_size: 16
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "stem", 4, "grid 0x0 is empty", "larger input resolution"),
    Case("conv-stem-tiny-input-grid", """\
name: t
input:
  resolution: 8
stem:
  kind: conv
  channels: [8, 16, 32, 64, 64, 64]
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention: mask
""", "stages[0].attention.mask.window", 11, "larger than the 1x1 token grid", "1x1", count=1),
    Case("identity-stem-wrong-dim", """\
name: t
input: {channels: 3, resolution: 32}
stem:
  kind: identity
  patch_size: 4
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "stages[0].dim", 8, ("4*4*3 = 48", "64"), "dim: 48"),
    Case("too-many-tokens", """\
name: t
input:
  resolution: 1024
stem:
  kind: patch
  patch_size: 4
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "input.resolution", 3, ("65536 tokens", "cap of 16384"), "larger patch size"),
    Case("pool-cls-without-class-token", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens:
  cls_token: none
stages:
  - depth: 2
    dim: 64
    heads: 4
head:
  pool: cls
""", "head.pool", 11, "needs a class token", "pool: mean"),
    Case("dist-token-without-distillation-head", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens:
  dist_token: true
stages:
  - depth: 2
    dim: 64
    heads: 4
""", "tokens.dist_token", 5, "without a distillation head", "head.distillation: true"),
    Case("width-change-without-shrink", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 2
    dim: 64
    heads: 4
  - depth: 2
    dim: 128
    heads: 4
""", "stages[1].dim", 9, "width changes from 64 to 128", "shrink"),
    Case("shrink-on-first-stage", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: none}
head: {pool: mean}
stages:
  - depth: 2
    dim: 64
    heads: 4
    shrink:
      stride: 2
""", "stages[0].shrink", 10, "first stage cannot start with shrinking", "later stage"),
    # --- hierarchical stages: Swin's patch merging, NAT's conv downsampler ----------------------------
    Case("downsample-on-first-stage", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4, norm: layernorm}
tokens: {cls_token: none, pos_embed: none}
head: {pool: mean, norm: before_pool}
stages:
  - depth: 2
    dim: 64
    heads: 4
    downsample: patch_merging
""", "stages[0].downsample", 10, "first stage cannot start with a downsample", "later stage"),
    Case("downsample-and-shrink", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: none}
head: {pool: mean}
stages:
  - {depth: 2, dim: 64, heads: 4}
  - depth: 2
    dim: 128
    heads: 4
    shrink: {key_dim: 16}
    downsample: {kind: patch_merging}
""", "stages[1].downsample", 12, "both shrink and downsample", "keep one"),
    Case("downsample-with-class-token", """\
name: t
input: {resolution: 32}
stem: {kind: conv_tokenizer}
stages:
  - {depth: 2, dim: 64, heads: 4}
  - {depth: 2, dim: 128, heads: 4, downsample: conv}
""", "stages[1].downsample", 6, ("conv downsampling needs a pure token grid", "class/distillation token"),
         "cls_token: none"),
    Case("downsample-on-conv-stage", """\
name: t
stem: {kind: resnet}
stages:
  - {kind: conv, block: basic, depth: 1, channels: 64}
  - {kind: conv, block: basic, depth: 1, channels: 128, stride: 2, downsample: {kind: patch_merging}}
""", "stages[1].downsample", 5, ("conv stage's downsample is its first block's shortcut", "attention stages"),
         "stride: 2"),
    Case("downsample-unknown-kind", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: none}
head: {pool: mean}
stages:
  - {depth: 2, dim: 64, heads: 4}
  - {depth: 2, dim: 128, heads: 4, downsample: merging}
""", "stages[1].downsample", 8, "downsample must be one of patch_merging, conv", "NAT"),
    Case("downsample-opening-a-hybrid", """\
name: t
input: {resolution: 64}
stem: {kind: resnet}
tokens: {cls_token: none}
head: {pool: mean}
stages:
  - {kind: conv, block: basic, depth: 1, channels: 64}
  - {depth: 1, dim: 64, heads: 4, downsample: conv}
""", "stages[1].downsample", 8, "a downsample cannot open it", "from_map"),
    Case("head-norm-after-pool-with-class-token", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - {depth: 2, dim: 64, heads: 4}
head: {pool: cls, norm: after_pool}
""", "head", 6, "norm: after_pool needs pool: mean", "before_pool"),
    Case("head-norm-on-batchnorm-head", """\
name: t
input: {resolution: 32}
stem: {kind: conv, channels: [16, 32, 64]}
tokens: {cls_token: none}
stages:
  - {depth: 2, dim: 64, heads: 4, norm: batchnorm, act: hardswish}
head: {pool: mean, norm: before_pool}
""", "head.norm", 7, "no final LayerNorm", "remove head.norm"),
    Case("conv-mixer-with-class-token", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 2
    dim: 64
    heads: 4
    mixer: conv
""", "stages[0].mixer", 8, ("layers 0-1", "conv token mixer", "class/distillation token"), "cls_token: none",
         count=1),
    Case("conv-mixer-override-with-class-token", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 2
    dim: 64
    heads: 4
    layers:
      - range: 0-1
        mixer: conv3
""", "stages[0].layers[0].mixer", 10, "conv token mixer", "cls_token: none", count=1),
    # --- the "every spec that validates builds" issue: these validated and then crashed in build ---------
    Case("shrink-value-dim-rounds-to-0", """\
name: t
input: {resolution: 32}
stem: {kind: conv, channels: [16, 32]}
tokens: {cls_token: none, pos_embed: none}
head: {pool: mean}
stages:
  - {depth: 1, dim: 32, heads: 2, norm: batchnorm}
  - depth: 1
    dim: 48
    heads: 2
    norm: batchnorm
    shrink: {key_dim: 16, attn_ratio: 0.01}
""", "stages[1].shrink.attn_ratio", 12, "0.01 * 16 rounds to 0", "attn_ratio >= 0.0625"),
    Case("stage-value-dim-rounds-to-0", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
stages:
  - depth: 1
    dim: 32
    heads: 2
    key_dim: 8
    attn_ratio: 0.1
""", "stages[0].attn_ratio", 9, "0.1 * 8 rounds to 0", "attn_ratio >= 0.125"),
    Case("gpsa-layer-mixed-gating-trainable", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
tokens: {cls_token: 1}
stages:
  - depth: 2
    dim: 32
    heads: 2
    attention: mhsa
    layers:
      - range: 0
        heads: [{gpsa: {gating_trainable: false}}, gpsa]
""", "stages[0].layers[0].heads", 12, ("disagree on gating_trainable", "frozen: head 0"),
         "same gating_trainable"),
    Case("mlp-hidden-rounds-to-0", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
stages:
  - {depth: 1, dim: 16, heads: 2, mlp_ratio: 0.01}
""", "stages[0].mlp_ratio", 5, "int(16 * 0.01) is 0", "mlp_ratio >= 0.0625"),
    Case("shrink-mlp-hidden-rounds-to-0", """\
name: t
input: {resolution: 32}
stem: {kind: conv, channels: [16, 32]}
tokens: {cls_token: none, pos_embed: none}
head: {pool: mean}
stages:
  - {depth: 1, dim: 32, heads: 2, norm: batchnorm}
  - depth: 1
    dim: 48
    heads: 2
    norm: batchnorm
    shrink:
      mlp_ratio: 0.01
""", "stages[1].shrink.mlp_ratio", 13, "int(48 * 0.01) is 0", "mlp_ratio >= 0.0208333"),
    Case("memory-over-the-limit", """\
name: t
input: {resolution: [1008, 1024]}
stem: {kind: patch, patch_size: 16}
stages:
  - depth: 4
    dim: 64
    heads: 64
    head_dim: 4096
""", "stages[0]", 5,
         # 24.7 GiB of activations and weights, plus 780.0 MiB of buffers: each block's eval cache of the
         # stacked q/k/v weights and biases, 4 * (3*64*4096*64 + 3*64*4096) * 4 bytes = 780.0 MiB
         ("25.4 GiB", "buffers 780.0 MiB", "over the memory limit of 8.0 GiB"), "--max-memory"),
    Case("conv-mixer-kernel-larger-than-grid", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
tokens: {cls_token: none}
head: {pool: mean}
stages:
  - depth: 2
    dim: 64
    heads: 4
    mixer: token_conv15
""", "stages[0].mixer.kernel", 10, "kernel 15 is larger than the 4x4 token grid", "at most 9", count=1),
    # --- Swin's window head kind (_SWIN_STAGE: a Swin stage on an 8x8 grid, its heads on line 10) ---------------
    Case("window-larger-than-grid", _SWIN_STAGE + "{window: {size: 12}}\n", "stages[0].attention.window.size", 10,
         "window 12x12 is larger than the 8x8 token grid", "clamp: true", count=1),
    Case("window-shift-not-below-window", _SWIN_STAGE + "{window: {size: 4, shift: 4}}\n",
         "stages[0].attention.window.shift", 10, "shift 4 must be in [0, window) = [0, 4)", "window // 2"),
    Case("window-on-a-conv-stage", """\
name: t
input: {resolution: 64}
stem: {kind: resnet}
stages:
  - kind: conv
    block: bottleneck
    depth: 1
    channels: 256
    mixer: {kind: attention, heads: 4, attention: "window:4"}
""", "stages[0].mixer.attention", 9, "head kind window does not run in a bottleneck's attention",
         "attention stage"),
    Case("window-with-class-token", """\
name: t
input: {resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: input}
stages:
  - depth: 2
    dim: 64
    heads: 4
    attention: "window:4"
""", "stages[0].attention.window", 9, "prefix (class/distillation) token", "global average pooling", count=1),
]


def _write(tmp_path, case: Case):
    path = tmp_path / f"{case.id}.yaml"
    path.write_text(case.text.replace("@TMP@", str(tmp_path)), encoding="utf-8")
    return path


def _problem_at(problems, expected_path):
    for problem in problems:
        if format_path(problem.path) == expected_path:
            return problem
    raise AssertionError(f"no problem at {expected_path!r}; got:\n" + "\n".join(p.format() for p in problems))


def test_at_least_30_cases():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_malformed_spec(tmp_path, case: Case):
    path = _write(tmp_path, case)
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    problems = info.value.problems
    assert problems, "a SpecError must carry at least one problem"
    for problem in problems:  # every problem is located in the file
        assert problem.file == str(path), problem.format()
        assert isinstance(problem.line, int) and problem.line >= 1, problem.format()
        assert "Traceback" not in problem.message
    problem = _problem_at(problems, case.path)
    assert problem.line == case.line, problem.format()
    for needle in (case.message,) if isinstance(case.message, str) else case.message:
        assert needle in problem.message, problem.format()
    if case.hint is not None:
        assert problem.hint and case.hint in problem.hint, problem.format()
    if case.count is not None:
        assert len(problems) == case.count, str(info.value)
    # The rendered error starts with file:line and names the field.
    rendered = str(info.value)
    assert f"{path}:{case.line}:" in rendered
    assert format_path(problem.path) in rendered if problem.path else "<root>" not in rendered


def test_python_tag_executes_nothing(tmp_path):
    case = next(c for c in CASES if c.id == "yaml-python-tag")
    path = _write(tmp_path, case)
    with pytest.raises(SpecError):
        load_spec(str(path))
    assert not (tmp_path / "pwned").exists()


def test_dict_spec_has_path_but_no_line():
    with pytest.raises(SpecError) as info:
        load_spec({"stages": [{"depth": 2, "dim": 64, "heads": 0}]})
    (problem,) = info.value.problems
    assert format_path(problem.path) == "stages[0].heads"
    assert problem.line is None and problem.column is None and problem.file is None
    assert "greater than or equal to 1" in problem.message


def test_dict_spec_shape_error_has_path_but_no_line():
    with pytest.raises(SpecError) as info:
        load_spec({"input": {"resolution": 32}, "stem": {"kind": "patch", "patch_size": 4},
                   "stages": [{"depth": 2, "dim": 64, "heads": 5}]})
    (problem,) = info.value.problems
    assert format_path(problem.path) == "stages[0].heads"
    assert problem.line is None and problem.file is None


def test_yaml_text_is_located_in_string(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec("name: t\nstages:\n  - depth: 2\n    dim: 64\n    heads: 0\n")
    (problem,) = info.value.problems
    assert (problem.file, problem.line, format_path(problem.path)) == ("<string>", 5, "stages[0].heads")


VALID = {
    "convit-mait": """\
name: rt_convit_mait
input: {channels: 3, resolution: 64}
stem: {kind: patch, patch_size: 8}
tokens: {cls_token: 2}
stages:
  - depth: 4
    dim: 64
    heads: 4
    attention: mhsa
    drop_path: [0.0, 0.1]
    layers:
      - range: 0-1
        attention: gpsa
      - range: 2-3
        heads: [mask:3x5, soft_mask, levit_bias, mhsa]
head: {num_classes: 10}
""",
    "levit": """\
name: rt_levit
input: {resolution: 64}
stem: {kind: conv, channels: [16, 32, 64, 128]}
tokens: {cls_token: none}
stages:
  - {depth: 2, dim: 128, heads: 4, key_dim: 16, attn_ratio: 2, mlp_ratio: 2, norm: batchnorm, act: hardswish,
     qkv_bias: false}
  - depth: 2
    dim: 192
    heads: 6
    key_dim: 16
    attn_ratio: 2
    mlp_ratio: 2
    norm: batchnorm
    act: hardswish
    qkv_bias: false
    shrink: {stride: 2, key_dim: 16}
head: {pool: mean, num_classes: 10, distillation: true}
""",
    "swin-nat": """\
name: rt_swin_nat
input: {resolution: 40}
stem: {kind: conv_tokenizer}
tokens: {cls_token: none, pos_embed: none}
stages:
  - {depth: 1, dim: 32, heads: 2, norm_eps: 1.0e-5}
  - {depth: 1, dim: 64, heads: 2, norm_eps: 1.0e-5, downsample: patch_merging}
  - {depth: 1, dim: 96, heads: 2, norm_eps: 1.0e-5, downsample: {kind: conv}}
head: {pool: mean, norm: before_pool, num_classes: 10}
""",
    "cmhsa": """\
name: rt_cmhsa
input: {channels: 3, resolution: 32}
stem: {kind: identity, patch_size: 4}
tokens: {cls_token: none, pos_embed: none}
stages:
  - depth: 3
    dim: 48
    heads: 4
    head_dim: 48
    layers:
      - {range: 0, mixer: conv5}
      - {range: 1-2, attention: signed_bias}
head: {pool: mean, num_classes: 10}
""",
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_spec_round_trips(name):
    spec = load_spec(VALID[name])
    text = spec.to_yaml()
    again = load_spec(text)
    assert again == spec
    assert again.to_yaml() == text


def _cli_main():
    cli = pytest.importorskip("archspec.cli")
    if not hasattr(cli, "main"):
        pytest.skip("archspec.cli has no main()")
    return cli.main


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cli_validate_reports_located_problem(tmp_path, capsys, case: Case):
    main = _cli_main()
    path = _write(tmp_path, case)
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert f"{path}:{case.line}" in err, err
    assert (f": {case.path}: " in err) if case.path != "<root>" else ("<root>" not in err), err
    assert "Traceback" not in out + err
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_class_token_inserted_after_a_shrink_builds():
    """It validated and then crashed (the token had the first stage's width); now it has its stage's width."""
    import torch

    from archspec import analyze, compile

    spec = load_spec("""\
input: {resolution: 32}
stem: {kind: conv, channels: [16, 32]}
tokens: {cls_token: 2, pos_embed: none}
stages:
  - {depth: 1, dim: 32, heads: 2, norm: batchnorm, key_dim: 8}
  - {depth: 2, dim: 48, heads: 2, norm: batchnorm, key_dim: 8, shrink: {key_dim: 8}}
head: {pool: cls, num_classes: 10}
""")
    model = compile(spec).eval()
    assert model.cls_token.shape == (1, 1, 48)
    assert sum(p.numel() for p in model.parameters()) == analyze(spec).params
    with torch.inference_mode():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
