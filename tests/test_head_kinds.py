"""The head-kind registry (archspec/families/attention/kinds/): one list of kinds, which every place that knows
kinds reads, and the plug-in promise -- a kind registered from outside archspec (tests/head_kind_plugin.py, a learned
bias on each query's own key) is a HeadSpec field, a shorthand and a letter, counted by the walk, built and run by
``Attention`` on its SDPA path and on the dense reference, with no edit anywhere else.  The plug-in's numbers are
checked against an independent float64 formula written here, not against archspec's paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from archspec.families.attention.heads import KINDS, HeadSpec
from archspec.families.attention.kinds import HEAD_KINDS, HeadKind, head_kind, hosted_by, register_head_kind
from archspec.families.attention.module import Attention
from archspec.families.talking_heads.rules import HEAD_KINDS as TALKING_KINDS

TESTS = Path(__file__).resolve().parent

# Runs in a fresh interpreter: the plug-in registers before archspec builds its spec models.
PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import pytest
from archspec.families.attention.kinds import HeadKind, register_head_kind
import head_kind_plugin  # registers self_bias

# a kind whose shorthand or letter another kind has is refused, naming the clash
clash = HeadKind(field="other", spec=head_kind_plugin.SelfBiasSpec, description="", shorthands={"mask": {}},
                 legend={"M": "again"}, letter=lambda s: "M", terms=lambda s: frozenset())
with pytest.raises(ValueError, match="shorthand 'mask' is taken; the letter 'M' is taken"):
    register_head_kind(clash)

import torch
import archspec
from archspec.families.attention.heads import HEAD_LETTERS, HeadSpec
from archspec.families.attention.module import Attention
from archspec.families.attention.rules import NO_WEIGHT_DECAY, head_path
from archspec.spec.schema import spec_schema

# HeadSpec, shorthands, letters, schema: from the registry
assert list(HeadSpec.model_fields)[-1] == "self_bias", list(HeadSpec.model_fields)
assert HeadSpec.model_validate("self_bias").letter == "Z" and HEAD_LETTERS["Z"].startswith("self bias")
assert HeadSpec.model_validate({"mask": {}, "self_bias": {"init": 2.0}}).letter == "MZ"
assert "self_bias" in spec_schema()["$defs"]["HeadSpecMapping"]["properties"]
assert "self_bias" in NO_WEIGHT_DECAY
# its path: SDPA takes an additive bias; beside a hard mask the head needs explicit logits
assert head_path(HeadSpec.model_validate("self_bias"), (3, 4)) == ("sdpa",)
assert head_path(HeadSpec.model_validate({"mask": {}, "self_bias": {}}), (3, 4)) == ("dense",)
with pytest.raises(RuntimeError, match="register head kinds before"):
    register_head_kind(HeadKind(field="late", spec=head_kind_plugin.SelfBiasSpec, description="", shorthands={},
                                legend={}, letter=lambda s: "", terms=lambda s: frozenset()))

# the walk counts it: one parameter per head of the kind
TINY = {"name": "t", "input": {"resolution": 16}, "stem": {"kind": "patch", "patch_size": 4},
        "tokens": {"cls_token": "none", "pos_embed": "learned"},
        "stages": [{"depth": 2, "dim": 16, "heads": 2, "mlp_ratio": 2, "attention": "self_bias",
                    "layers": [{"range": 0, "heads": ["self_bias", "mhsa"]}]}],
        "head": {"pool": "mean", "num_classes": 10}}
plain = {**TINY, "stages": [{**TINY["stages"][0], "attention": "mhsa", "layers": []}]}
with_kind, without = archspec.analyze(archspec.load_spec(TINY)), archspec.analyze(archspec.load_spec(plain))
assert with_kind.params - without.params == 3, (with_kind.params, without.params)
assert with_kind.macs == without.macs
model = archspec.compile(TINY)
assert sum(p.numel() for p in model.parameters()) == with_kind.params
assert {n for n in model.no_weight_decay() if n.endswith("self_bias")} == {
    "stages.0.blocks.0.attn.self_bias", "stages.0.blocks.1.attn.self_bias"}


def reference(layer, x, beta):
    # softmax(q k^T / sqrt(d) + beta on each patch query's own key) v, projected: float64, by hand
    B, N, C = x.shape
    p, H, d = layer.num_prefix_tokens, layer.num_heads, layer.qk_dim
    qk = (x.double() @ layer.qk.weight.double().T + layer.qk.bias.double()).view(B, N, 2, H, d)
    v = (x.double() @ layer.v.weight.double().T + layer.v.bias.double()).view(B, N, H, d).transpose(1, 2)
    q, k = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2)
    patches = torch.arange(p, N)
    own = torch.zeros(N, N, dtype=torch.float64)
    own[patches, patches] = 1.0
    logits = q @ k.transpose(-2, -1) / d ** 0.5 + beta.view(1, H, 1, 1) * own
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, N, H * d)
    return out @ layer.proj.weight.double().T + layer.proj.bias.double()


torch.manual_seed(0)
for impl in ("auto", "dense"):
    # two heads of the plug-in, a plain one, and a hard-masked one on a path of its own
    layer = Attention(16, [{"self_bias": {"init": 1.5}}, "mhsa", "self_bias", "mask"], (3, 4), num_prefix_tokens=1,
                      qk_dim=4, v_dim=4).set_attn_impl(impl)
    assert layer.self_bias.tolist() == [1.5, 1.0] and "self_bias" in layer.state_dict()
    if impl == "auto":
        assert [key for key, _ in layer._groups] == [("sdpa",), ("hard",)], layer._groups
    with torch.no_grad():
        layer.qk.weight.mul_(20.0)  # content logits of order 1, so neither term dominates
        layer.proj.weight[:, 12:] = 0.0  # head 3, the mask (archspec's own), leaves the output: heads 0-2 compared
    x = torch.randn(2, 13, 16)
    beta = torch.tensor([1.5, 0.0, 1.0, 0.0], dtype=torch.float64, requires_grad=True)
    expected = reference(layer, x, beta)
    with torch.no_grad():
        torch.testing.assert_close(layer.eval()(x).double(), expected.detach(), atol=1e-5, rtol=1e-5)
    out = layer.train()(x)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    g = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * g).sum().backward()
    (expected * g.double()).sum().backward()
    torch.testing.assert_close(layer.self_bias.grad.double(), beta.grad[[0, 2]], atol=1e-6, rtol=1e-4)
print("PLUGIN-OK")
"""


@pytest.mark.slow
def test_a_kind_registered_from_outside_is_picked_up_everywhere():
    """tests/head_kind_plugin.py registers ``self_bias`` (a fresh interpreter: before the spec models exist); then a
    spec writes it as a shorthand, the walk counts its parameter per head, the compiled model holds it (no weight
    decay), and ``Attention`` runs it on the SDPA path and on the dense reference beside a hard-masked head, equal
    to the float64 formula (output and the gradient of each beta).  Nothing else in archspec names the kind."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(TESTS)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "PLUGIN-OK" in proc.stdout, proc.stderr[-4000:]


def test_the_registry_is_the_one_list_of_kinds():
    """The built-in kinds, in the order their letters compose; HeadSpec's fields are exactly the registry's."""
    assert list(HEAD_KINDS) == ["gpsa", "rel_bias", "mask", "gauss_mask", "rel_logits", "halo", "neighborhood",
                                "window", "grid"]
    assert [kind.field for kind in KINDS] == list(HEAD_KINDS) == list(HeadSpec.model_fields)
    assert HeadSpec.model_validate({"gpsa": {}, "mask": {}}).letter == "PM"
    assert head_kind("mask") is HEAD_KINDS["mask"]
    with pytest.raises(KeyError, match="no head kind 'swin'"):
        head_kind("swin")


def test_layers_take_the_kinds_their_hosts_name():
    """Talking heads take the kinds hosted by ``talking_heads`` (MaiT masks), timm's BottleneckAttn BoTNet's logits;
    archspec's Attention refuses a kind it does not host, naming where it runs."""
    assert TALKING_KINDS == hosted_by("talking_heads") == {"mask"}
    assert hosted_by("bottleneck_attn") == {"rel_logits"}
    assert hosted_by("halo_attn") == {"halo"}
    assert "window" in hosted_by("attention") and "window" not in hosted_by("pixel_attention")
    assert hosted_by("mobilevit_block") == {"grid"}
    with pytest.raises(ValueError, match="head 1 .* rel_logits, which Attention does not run .*bottleneck_attn"):
        Attention(16, ["mhsa", "botnet_rel"], (2, 2))


def test_registration_after_the_spec_models_exist_is_refused():
    """HeadSpec was built from the registry when it was imported (above): a later kind could not be a field of it,
    so registering one is refused with a message saying when to register."""
    late = HeadKind(field="late", spec=HEAD_KINDS["mask"].spec, description="", shorthands={}, legend={},
                    letter=lambda spec: "", terms=lambda spec: frozenset())
    with pytest.raises(RuntimeError, match="register head kinds before building or loading a spec"):
        register_head_kind(late)
    with pytest.raises(TypeError, match="takes a HeadKind"):
        register_head_kind("gpsa")
    assert "late" not in HEAD_KINDS
