"""Every block family (archspec/families/): the module its ``build`` makes from a shape has the parameters its rules
count, the MACs the independent reference counts (tests/macs_reference.py: torch's FlopCounterMode / 2 on the
dense attention path, softmax and norms excluded), the output grid its shape rule states, and an activation peak
that holds its output.  Its rules import no torch.  A new family must add a sample here (the first test fails
until it does)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from macs_reference import reference_macs

from archspec.families import FAMILIES, build, rules
from archspec.families.attention.heads import coerce_heads
from archspec.families.attention.rules import AttentionShape, AttnDims
from archspec.families.block.rules import BlockShape
from archspec.families.class_attention.rules import ClassAttentionShape
from archspec.families.conv_block.rules import ConvBlockShape
from archspec.families.conv_mixer.rules import ConvMixerShape
from archspec.families.downsample.rules import DownsampleShape
from archspec.families.interface.rules import InterfaceShape, TokensToMapShape
from archspec.families.mbconv.rules import MBConvShape
from archspec.families.mobilevit.rules import ConvBNActShape, MobileViTShape, MV2Shape
from archspec.families.shrink.rules import ShrinkShape
from archspec.families.stem.rules import StemShape
from archspec.families.talking_heads.rules import TalkingHeadsShape
from archspec.nn.blocks import attention_impl

ROOT = Path(__file__).resolve().parents[1]
_MIXED = coerce_heads(["mhsa", "mask:3x3", {"gpsa": {}, "mask": {"mode": "soft"}}, "levit_bias"])
_ATTENTION = AttentionShape(32, _MIXED, (3, 5), 0, AttnDims(8, 8), True)  # GPSA: no class token (ConViT)
# family -> (shape, input shape, output tokens (None: not a token mixer), output of the module); a module making a
# map (B, C, H, W) states its pixels H x W
SAMPLES = {
    "attention": (_ATTENTION, (1, 15, 32), 15),
    "talking_heads": (TalkingHeadsShape(32, coerce_heads(["mhsa", "mask:3x3", "soft_mask", "mhsa"]), (3, 5), 1, True),
                      (1, 16, 32), 16),
    # pixel view: 48 = 2^2 * 12 channels, a 5x5 conv on the 8x6 pixel image (CMHSA Thm. 1)
    "conv_mixer": (ConvMixerShape(48, 5, (4, 3), 2), (1, 12, 48), 12),
    "block": (BlockShape(32, 15, 3.0, "layernorm", 1e-6, "gelu", 1e-5, 0.0, "attention", _ATTENTION), (1, 15, 32), 15),
    # odd grid: the subsampled grid is ceil(7 / 2) x ceil(5 / 2) = 4 x 3 (LeViT sec. 4.2, timm LevitDownsample)
    "shrink": (ShrinkShape(32, 48, 2, 8, 4.0, 2.0, (7, 5), 2), (1, 35, 32), 12),
    # Swin's patch merging on an odd grid: zero-padded to 8 x 6, merged to 4 x 3 (timm PatchMerging)
    "downsample": (DownsampleShape("patch_merging", 16, 24, (7, 5)), (1, 35, 16), 12),
    "class_attention": (ClassAttentionShape(32, 4, 17, 3.0, True, 1e-5), (1, 17, 32), 17),
    "stem": (StemShape("conv", 3, (33, 31), 16, channels=(4, 8, 16)), (1, 3, 33, 31), 20),  # 5 x 4 grid
    # ResNet-D's first block of a strided stage: avg-pool shortcut, SE; an odd map 7 x 5 -> 4 x 3
    "conv_block": (ConvBlockShape("bottleneck", 16, 32, 8, 2, (7, 5), "avg", 8, 0.25), (1, 16, 7, 5), 12),
    # a hybrid's map -> tokens: a 7 x 5 map average-pooled (adaptive, uneven bins) to 3 x 2, 1x1 conv 12 -> 16
    "interface": (InterfaceShape(12, (7, 5), (3, 2), 16, True, True), (1, 12, 7, 5), 6),
    # timm coatnet_0_rw's first MBConv: pool stride mode (2x2 avg pool: 7 x 5 -> 3 x 2), width from the input, early
    # SE with ReLU, activation after the pre-norm, no output bias
    "mbconv": (MBConvShape(16, 24, 2, (7, 5), "pool", "avg2", expansion=4.0, expand_output=False, se_ratio=0.25,
                           se_act="relu", se_early=True, act="silu", pre_norm_act=True, output_bias=False),
               (1, 16, 7, 5), 6),
    # MobileViT's block on an odd map: 7 x 5 resized to 8 x 6 for its 2x2 patches (4 sequences of 12 pixels), 2
    # layers of 4 heads, back to 7 x 5 for the fusion conv (timm MobileVitBlock)
    "mobilevit": (MobileViTShape(16, (7, 5), 24, 2, coerce_heads(["grid:2x2"] * 4), mlp_ratio=2.0), (1, 16, 7, 5),
                  35),
}
# LeViT's batchnorm attention and block, the patch and identity stems: further shapes of the same families
MORE = [
    ("attention", AttentionShape(32, coerce_heads(["strict_mask:3x5", "mask", "levit_bias", "soft_mask"]), (3, 5), 1,
                                 AttnDims(8, 8), False), (1, 16, 32), 16),
    ("attention", AttentionShape(32, coerce_heads(["levit_bias"] * 2), (4, 4), 0, AttnDims(8, 16), False, "batchnorm",
                                 "hardswish"), (1, 16, 32), 16),
    ("attention", AttentionShape(16, coerce_heads(["signed_bias", "mhsa"]), (3, 3), 0, AttnDims(16, 16), True,
                                 pad_tokens=1), (1, 9, 16), 9),
    ("attention", AttentionShape(32, coerce_heads(["gauss_mask", {"gauss_mask": {}, "rel_bias": {}}, "mask",
                                                  {"gauss_mask": {}, "mask": {"mode": "soft"}}]), (3, 5), 1,
                                 AttnDims(8, 8), True), (1, 16, 32), 16),
    ("block", BlockShape(32, 16, 2.0, "batchnorm", 1e-6, "hardswish", None, 0.0, "attention",
                         AttentionShape(32, coerce_heads(["levit_bias"] * 2), (4, 4), 0, AttnDims(8, 16), False,
                                        "batchnorm", "hardswish")), (1, 16, 32), 16),
    ("stem", StemShape("patch", 3, (32, 24), 20, patch_size=8), (1, 3, 32, 24), 12),
    ("stem", StemShape("identity", 1, (8, 8), 16, patch_size=4), (1, 1, 8, 8), 4),
    ("stem", StemShape("patch", 3, (32, 24), 20, patch_size=4, norm_eps=1e-5), (1, 3, 32, 24), 48),  # Swin's
    # NAT's tokenizer: 33 x 31 -> 17 x 16 -> 9 x 8, convs 3 -> 8 -> 16 with bias, then LayerNorm
    ("stem", StemShape("conv_tokenizer", 3, (33, 31), 16, channels=(8, 16), norm_eps=1e-5), (1, 3, 33, 31), 72),
    ("downsample", DownsampleShape("conv", 16, 32, (5, 6)), (1, 30, 16), 9),  # NAT's: 5 x 6 -> 3 x 3
    ("stem", StemShape("resnet", 3, (33, 31), 16), (1, 3, 33, 31), 72),  # 7x7 stem: 17 x 16, pooled 9 x 8
    ("stem", StemShape("resnet", 2, (30, 18), 16, stem_width=8, pool="conv"), (1, 2, 30, 18), 40),  # 8 x 5
    ("conv_block", ConvBlockShape("basic", 8, 16, 16, 2, (5, 6), "conv"), (1, 8, 5, 6), 9),
    ("conv_block", ConvBlockShape("bottleneck", 32, 32, 8, 1, (4, 4)), (1, 32, 4, 4), 16),  # identity shortcut
    ("conv_block", ConvBlockShape("bottleneck", 12, 24, 12, 1, (3, 3), "avg"), (1, 12, 3, 3), 9),  # expansion 2
    # T-CNN's GPSA in the bottleneck: strided (queries every other pixel) with SE, and BoTNet's stride 1
    ("conv_block", ConvBlockShape("bottleneck", 16, 32, 8, 2, (7, 5), "avg", 8, 0.25, mixer="gpsa"), (1, 16, 7, 5), 12),
    ("conv_block", ConvBlockShape("bottleneck", 32, 64, 32, 1, (4, 3), "conv", mixer="gpsa"), (1, 32, 4, 3), 12),
    ("interface", InterfaceShape(16, (3, 3), (3, 3), 16, False, False), (1, 16, 3, 3), 9),  # every pixel a token
    ("interface", TokensToMapShape(16, (3, 4), 1), (1, 13, 16), 12),  # a conv tail's map: class token dropped
    # MBConv: the tf ports' strided depthwise conv with SAME padding on an odd map (7 x 5 -> 4 x 3, the 2x2 pool
    # padded to match), SE from the output width; the paper's strided 1x1 with a 3x3 pool; stride 1, kernel 5, no SE
    ("mbconv", MBConvShape(16, 32, 2, (7, 5), "dw", "avg2", padding="same", se_ratio=0.25, act="gelu_tanh",
                           norm_eps=1e-3), (1, 16, 7, 5), 12),
    ("mbconv", MBConvShape(16, 32, 2, (7, 5), "1x1", "avg", expansion=2.0, se_ratio=1 / 16), (1, 16, 7, 5), 12),
    ("mbconv", MBConvShape(24, 24, 1, (4, 3), "dw", "max2", kernel=5), (1, 24, 4, 3), 12),
    ("mbconv", MBConvShape(16, 16, 2, (6, 6), "dw", "max", padding="same"), (1, 16, 6, 6), 9),  # pool, no 1x1
    # CoAtNet's / MaxViT's stem (timm maxxvit.Stem): 33 x 31 -> 17 x 16; the tf ports' SAME padding and biases
    ("stem", StemShape("maxxvit", 3, (33, 31), 16, stem_width=8, act="silu"), (1, 3, 33, 31), 272),
    ("stem", StemShape("maxxvit", 3, (32, 30), 16, stem_width=16, act="gelu_tanh", bias=True, bn_eps=1e-3,
                       padding="same"), (1, 3, 32, 30), 240),
    # MobileViT's: MV2 strided on an odd map (7 x 5 -> 4 x 3, no residual), MV2 with its residual (kernel 5), the
    # block with a 2x1 patch, without fusion, with GELU; ByobNet's final conv and a strided 3x3 conv + BN + act;
    # the stem (timm ByobNet '3x3')
    ("mobilevit", MV2Shape(16, 24, 2, (7, 5), expansion=2.0), (1, 16, 7, 5), 12),
    ("mobilevit", MV2Shape(24, 24, 1, (4, 3), expansion=4.0, kernel=5), (1, 24, 4, 3), 12),
    ("mobilevit", MobileViTShape(16, (4, 6), 32, 1, coerce_heads(["grid:2x1"] * 2), mlp_ratio=1.5, act="gelu",
                                 fusion=False), (1, 16, 4, 6), 24),
    ("mobilevit", ConvBNActShape(16, 40, 1, (4, 3)), (1, 16, 4, 3), 12),
    ("mobilevit", ConvBNActShape(16, 8, 2, (7, 5), kernel=3, act="relu"), (1, 16, 7, 5), 12),
    ("stem", StemShape("mobilevit", 3, (33, 31), 16, act="silu"), (1, 3, 33, 31), 272),
    # grid heads in archspec's Attention: a 6 x 4 grid in 2x2 and 3x1 cells beside a global head
    ("attention", AttentionShape(24, coerce_heads(["grid:2x2", "grid:3x1", "mhsa"]), (6, 4), 0, AttnDims(8, 8), True),
     (1, 24, 24), 24),
]
NO_MODULE = {"tokens", "head"}  # the model's own parameters; the head's classifier is tested in test_timm_api


def test_every_family_has_a_sample():
    assert set(SAMPLES) | NO_MODULE == set(FAMILIES)


@pytest.mark.parametrize("name, shape, x_shape, n_out", [(n, *SAMPLES[n]) for n in sorted(SAMPLES)] + MORE)
def test_family_rules_match_the_module_they_build(name, shape, x_shape, n_out, one_thread):
    rule = rules(name)
    torch.manual_seed(0)
    module = build(name, shape).eval()
    params, macs = rule.counts(shape)
    assert params == sum(p.numel() for p in module.parameters())
    x = torch.randn(*x_shape)
    with attention_impl(module, "dense"):  # the papers' count is the dense formula's
        assert macs == reference_macs(module, x)
        with torch.no_grad():
            out = module(x)
    assert (out.shape[1] if out.dim() == 3 else out.shape[2] * out.shape[3]) == n_out
    if hasattr(rule, "out_grid"):
        rows, cols = rule.out_grid(shape)
        assert rows * cols == n_out
    memory = rule.memory(shape)
    assert memory.act >= 4 * out.numel() and memory.saved > 0  # the output fits inside the stated peak
    buffers = sum(b.numel() * b.element_size() for b in module.buffers() if not b.is_floating_point() or b.numel() > 1)
    assert memory.buffers >= buffers - sum(  # index and mask tables (BatchNorm statistics are not counted)
        b.numel() * b.element_size() for n, b in module.named_buffers()
        if n.rsplit(".", 1)[-1].startswith(("running", "num_batches")))


def test_executed_macs_is_what_the_default_paths_run(one_thread):
    """The attention family's executed MACs on a grid past the linear-time crossover: the reference counter on the
    model's default paths (hard heads linear-time, GPSA as SDPA + P V) agrees within 2 %."""
    shape = AttentionShape(64, coerce_heads(["mask:3x3", "mask:3x3", "gpsa", "mhsa"]), (18, 18), 0, AttnDims(16, 16),
                           True)
    module = build("attention", shape).eval()
    executed = rules("attention").executed_macs(shape)
    assert executed < rules("attention").counts(shape)[1]
    assert abs(reference_macs(module, torch.randn(1, 324, 64)) - executed) <= 0.02 * executed


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    return {id(node) for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for statement in block.body for node in ast.walk(statement)}


def _imports(path: Path) -> set[str]:
    names = set()
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            names.add(("." * node.level) + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


TORCH_SIDE = ("torch", "timm", "torchvision", ".module", ".kernels", ".local_kernels", ".mask_terms", ".tables",
              ".position_terms", ".head_paths", ".zero_pad", "archspec.nn.blocks")
# a family's torch files: module.py, and beside the attention family's the mixins its Attention inherits
# (position_terms.py, head_paths.py), CMHSA's zero tokens (zero_pad.py) and the Swin / NAT kernels (local_kernels.py)
TORCH_FILES = ("module.py", "kernels.py", "local_kernels.py", "mask_terms.py", "tables.py", "activations.py",
               "position_terms.py", "head_paths.py", "zero_pad.py")


@pytest.mark.parametrize("path", sorted((ROOT / "archspec" / "families").glob("**/*.py")), ids=lambda p: str(p.name))
def test_rules_import_no_torch(path):
    """Every torch-free file of a family (all but :data:`TORCH_FILES`) imports neither torch nor a torch-side file,
    not even in a function (imports under ``if TYPE_CHECKING:`` never run).  A head kind's module
    (``attention/kinds/``) is such a file although it holds its kind's torch half: that half reaches torch through
    ``archspec._util.lazy.lazy_module`` when a layer is built, never at import (the next test runs it)."""
    if path.name in TORCH_FILES:
        return
    bad = {m for m in _imports(path) if m.startswith(TORCH_SIDE) or m.endswith(TORCH_SIDE[3:])}
    assert not bad, f"{path} imports {bad}"


def test_the_path_reads_top_to_bottom():
    """The spec language imports nothing of the IR or the compiler; graph.py nothing of checked/compiler/model and
    no family's torch side (the import-linter contract, tests/test_lint.py, checks every layer)."""
    later = ("archspec.ir", "archspec.nn")
    for path in (ROOT / "archspec" / "spec").glob("*.py"):
        assert not {m for m in _imports(path) if m.startswith(later)}, path
    graph = _imports(ROOT / "archspec" / "ir" / "graph.py")
    later = ("archspec.ir.checked", "archspec.nn")
    assert not {m for m in graph if m.startswith(later) or m.endswith(TORCH_SIDE[3:]) or m.startswith("torch")}


def test_head_kinds_import_no_torch():
    """Importing every head kind, the registry and HeadSpec built from it imports no torch (their torch halves load
    only when a layer is built)."""
    code = ("import sys; import archspec.families.attention.kinds as k; import archspec.families.attention.heads; "
            "import archspec.families.attention.rules; assert len(k.HEAD_KINDS) >= 5; "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_validating_every_shipped_spec_imports_no_torch():
    code = ("import sys; from archspec.ir.checked import load_spec; from archspec.ir.analysis import analyze; "
            "from archspec.spec import shipped_specs; [analyze(load_spec(n)) for n in shipped_specs()]; "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("heads, grid, prefix, norm", [
    (["mask", "levit_bias"], (2, 2), 0, "layernorm"),
    (["mask:3x3", "mask", "mhsa", "mhsa"], (18, 18), 1, "layernorm"),  # hard heads on the linear-time path
    (["mask", "soft_mask"], (4, 4), 0, "layernorm"),
    (["gpsa"] * 4, (5, 5), 0, "layernorm"),
    (["levit_bias"] * 2, (4, 4), 0, "batchnorm"),
    (["strict_mask", "signed_bias", {"gpsa": {}, "mask": {}}, "soft_mask"], (6, 6), 0, "layernorm"),
    (["gauss_mask", "mhsa", {"gauss_mask": {}, "mask": {}}, "strict_mask"], (4, 4), 1, "layernorm"),
    (["gauss_mask"] * 2, (4, 4), 0, "batchnorm"),
    (["gauss_mask"] * 2, (4, 4), 1, "layernorm"),  # every head Gaussian, a class token: no head-index buffer
])
def test_attention_buffer_rule_is_the_modules_bytes(heads, grid, prefix, norm, one_thread):
    """The rule's buffer bytes equal, to the byte, the layer's buffers plus the caches its first eval forward builds
    (BatchNorm statistics aside, which the memory rule leaves out)."""
    shape = AttentionShape(32, coerce_heads(heads), grid, prefix, AttnDims(8, 8), True, norm, "hardswish")
    module = build("attention", shape).eval()
    with torch.no_grad():
        module(torch.randn(1, prefix + grid[0] * grid[1], 32))
    assert rules("attention").buffers(shape) == eval_buffer_bytes(module)


def eval_buffer_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s buffers (BatchNorm statistics aside, which the memory rule leaves out) plus the caches
    (``*_cache`` attributes: a tensor, a tuple or a dict of them) its forwards so far built."""
    real = sum(b.numel() * b.element_size() for n, b in module.named_buffers()
               if "running" not in n and "batches" not in n)
    for name, value in vars(module).items():
        if name.endswith("_cache") and value is not None:
            tensors = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else (value,)
            real += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return real
