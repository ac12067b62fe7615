"""T-CNN (d'Ascoli et al., sec. 2-3): timm ResNets' 3x3 convs as 9-head GPSA layers -- the weight surgery
(``archspec.transfer.tcnn``) and ``archspec tcnn``, which builds the T-CNN spec of a bottleneck ResNet (resnet26d
here, the smallest timm ResNet the spec language writes) and loads the CNN's weights into it (the spec path
itself: tests/test_tcnn_spec.py).

Pretrained weights are out of reach in CI: random-init timm models stand in, with their BatchNorm affine
parameters and running statistics randomised (timm zero-initialises the last BN of each residual branch,
which would make every branch -- and so the transformed convs -- invisible in the logits)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from macs_reference import reference_macs

from archspec.io.datasets import load_data
from archspec.train import TrainConfig, train
from archspec.transfer import TransferError
from archspec.transfer.tcnn import ConvGPSA, conv_gpsa_macs, gating_param_groups, tcnn, transformed_layers

timm = pytest.importorskip("timm")


def _cnn(name: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kw).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) * 0.4 + 0.2)  # logits O(0.1-1)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
    return model


@pytest.mark.parametrize("name", ["resnetrs50", "resnet50d"])
@pytest.mark.slow
def test_exact_with_large_alpha_and_gating_on_real_images(one_thread, real_images, name):
    """sec. 2: lambda >> 0 and alpha >> 1 reproduce the CNN; at the paper's alpha = lambda = 1 it does not."""
    cnn = _cnn(name)
    x = F.interpolate(real_images, size=(64, 64), mode="area")
    with torch.no_grad():
        ref = cnn(x)
        model = tcnn(cnn, stride_one=False).eval()
        errors = {}
        for alpha in (1.0, 10.0, 40.0):
            for layer in transformed_layers(model):
                layer.set_exact(alpha=alpha, gating=40.0)
            errors[alpha] = (model(x) - ref).abs().max().item()
        assert errors[1.0] > errors[10.0] > errors[40.0] and errors[40.0] < 1e-4, errors
        verge = tcnn(cnn, stride_one=False).eval()  # alpha = lambda = 1: "on the verge of locality"
        assert (verge(x) - ref).abs().max() > 1e-3
    assert len(transformed_layers(model)) == 3 and not any(isinstance(m, ConvGPSA) for m in cnn.modules())


@pytest.mark.slow
def test_resnetrs50_params_and_macs_against_tab2(one_thread):
    """Tab. 2: ResNet50-RS 36M -> T-ResNet50-RS 38M params; 17.6 "GFLOPs" at 224 px.  The ResNet-RS rows count
    FLOPs = 2 x MACs (ResNet50-RS at 160 px: 4.6 in the table, 2 x 2.28 GMACs by torch's counter), so the T-CNN
    row is compared as 2 x MACs; ours is 10% under (15.9), within the 12% asserted here."""
    cnn = timm.create_model("resnetrs50", pretrained=False).eval()
    model = tcnn(cnn)
    params = sum(p.numel() for p in model.parameters())
    assert abs(sum(p.numel() for p in cnn.parameters()) / 1e6 - 36) < 0.5 and abs(params / 1e6 - 38) < 0.5
    assert abs(2 * reference_macs(cnn, torch.randn(1, 3, 160, 160)) / 1e9 - 4.6) < 0.1
    flops = 2 * reference_macs(model, torch.randn(1, 3, 224, 224)) / 1e9
    assert abs(flops - 17.6) / 17.6 < 0.12, flops


def test_hand_count_of_one_layer_and_stride(one_thread):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(18, 36, 3, stride=2, padding=1)
    x = torch.randn(1, 18, 7, 6)
    for stride in (1, 2):
        layer = ConvGPSA(conv, stride=stride).set_exact(40.0, 40.0)
        assert reference_macs(layer, x) == conv_gpsa_macs(18, 36, 7, 6, stride)
        ref = F.conv2d(x, conv.weight, conv.bias, stride=stride, padding=1)
        assert layer(x).shape == ref.shape and (layer(x) - ref).abs().max() < 1e-4
    with pytest.raises(TransferError):
        ConvGPSA(torch.nn.Conv2d(8, 8, 3, padding=1, groups=2))


@pytest.mark.slow
def test_tcnn_fine_tunes_with_falling_loss_and_gating_lr(one_thread):
    data = load_data(None, 32, seed=0, max_images=200)
    model = tcnn(_cnn("resnet10t", num_classes=10))
    assert all(torch.allclose(layer.alpha, torch.ones(9)) and torch.all(layer.gating == 1)
               for layer in transformed_layers(model))
    groups = gating_param_groups(model, lr=1e-3)
    assert groups[2]["lr"] == 0.1 and len(groups[2]["params"]) == 2  # resnet10t layer4: 1 block x 2 convs
    torch.manual_seed(0)
    config = TrainConfig(steps=8, batch_size=16, lr=1e-3, warmup_steps=0, eval_every=4, augmentation="none")
    result = train(model, data, config, param_groups=groups)
    losses = [loss for _, _, loss in result.history]
    assert losses[-1] < losses[0], losses
    assert any(not torch.all(layer.gating == 1) for layer in transformed_layers(model))


@pytest.mark.slow
def test_stages_and_errors():
    cnn = timm.create_model("resnet18", pretrained=False, num_classes=4)
    both = tcnn(cnn, stages=[3, "layer4"])
    assert len(transformed_layers(both)) == 8
    assert tcnn(cnn).layer4[0].downsample[0].stride == (1, 1)  # the shortcut follows the BoTNet stride 1
    assert tcnn(cnn)(torch.randn(1, 3, 64, 64)).shape == (1, 4)
    with pytest.raises(TransferError, match="no stage"):
        tcnn(cnn, stages=[7])
    with pytest.raises(TransferError, match="ResNet"):
        tcnn(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3)))


@pytest.mark.slow
def test_tcnn_cli_writes_a_loadable_model_and_refuses_bad_input(one_thread, tmp_path, capsys):
    import json

    from archspec.cli import main
    from archspec.transfer.tcnn import load_tcnn

    out = tmp_path / "t"
    assert main(["tcnn", "resnet26d", "--resolution", "64", "--num-classes", "5", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpsa_layers"] == 2 and report["params"]["tcnn"] > report["params"]["cnn"]
    assert report["analysis"] == {"params": report["params"]["tcnn"], "macs": report["macs"]["tcnn"]}
    assert report["exactness_max_layer_error"] < 1e-4 and report["exactness_max_logit_error"] < 1e-4
    model = load_tcnn(out)
    assert len(transformed_layers(model)) == 2 and model(torch.randn(1, 3, 64, 64)).shape == (1, 5)
    assert main(["tcnn", "resnet26d", "--resolution", "64", "--out", str(out)]) == 0  # replaces its own build
    assert main(["tcnn", "no_such_net", "--out", str(tmp_path / "x")]) == 2
    assert main(["tcnn", "vit_tiny_patch16_224", "--out", str(tmp_path / "x")]) == 2
    assert main(["tcnn", "resnet18", "--out", str(tmp_path / "x")]) == 2  # basic blocks: surgery only, no spec
    assert "basic blocks" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a.txt").write_text("keep")
    assert main(["tcnn", "resnet26d", "--resolution", "64", "--out", str(mine)]) == 2
    assert [p.name for p in mine.iterdir()] == ["a.txt"]


# ----------------------------------------------------------------------------------- the CLI's inputs (exit 2)
def _refused(argv: list[str], needles: list[str], capsys) -> None:
    from archspec.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(n in err for n in needles), err


@pytest.mark.parametrize("option, value", [("--alpha", "nan"), ("--alpha", "-1"), ("--alpha", "0"), ("--alpha", "inf"),
                                           ("--gating", "nan"), ("--gating", "-inf"), ("--resolution", "8"),
                                           ("--resolution", "100000"), ("--num-classes", "0")])
def test_tcnn_cli_refuses_bad_numbers_before_writing(tmp_path, capsys, option, value):
    out = tmp_path / "t"
    _refused(["tcnn", "resnet26d", "--resolution", "64", "--out", str(out), option, value], [option], capsys)
    assert not out.exists()


@pytest.mark.slow
def test_tcnn_cli_refuses_bad_checkpoints_naming_the_file(tmp_path, capsys):
    import os

    out = tmp_path / "t"
    state = timm.create_model("resnet26d").state_dict()
    cases = {"missing.pth": "cannot open it", "adir": "is a directory", "fifo.pth": "not a regular file",
             "random.safetensors": "SafetensorError", "list.pth": "cannot load it",
             "nan.pth": "non-finite values (NaN or inf) in fc.weight",
             "other_model.pth": "Missing key"}
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo.pth")
    (tmp_path / "random.safetensors").write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    torch.save([1, 2, 3], tmp_path / "list.pth")
    torch.save({**state, "fc.weight": torch.full_like(state["fc.weight"], float("nan"))}, tmp_path / "nan.pth")
    torch.save(timm.create_model("resnet18").state_dict(), tmp_path / "other_model.pth")
    for name, needle in cases.items():
        path = str(tmp_path / name)
        _refused(["tcnn", "resnet26d", "--resolution", "64", "--out", str(out), "--checkpoint", path],
                 [path, "--checkpoint", needle], capsys)
    assert not out.exists()


@pytest.mark.slow
def test_tcnn_report_describes_the_saved_model_and_files_follow_the_umask(one_thread, tmp_path, capsys):
    import json
    import os

    from archspec.cli import main
    from archspec.io.images import load_image
    from archspec.transfer import load_tcnn  # importable as the README documents it

    cnn = _cnn("resnet26d", num_classes=7)  # branches made visible (randomised BatchNorm)
    torch.save(cnn.state_dict(), tmp_path / "cnn.pth")
    out = tmp_path / "t"
    mask = os.umask(0o027)
    try:
        assert main(["tcnn", "resnet26d", "--resolution", "64", "--num-classes", "7", "--alpha", "2", "--gating", "3",
                     "--checkpoint", str(tmp_path / "cnn.pth"), "--out", str(out), "--json"]) == 0
    finally:
        os.umask(mask)
    report = json.loads(capsys.readouterr().out)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == dict.fromkeys(
        ["model.safetensors", "spec.yaml", "report.json"], 0o640)
    saved = load_tcnn(out)
    assert all(torch.allclose(layer.alpha, torch.full((9,), 2.0)) and torch.all(layer.gating == 3)
               for layer in transformed_layers(saved))
    x = load_image(None, (64, 64), 3)
    with torch.no_grad():
        distance = (saved(x) - cnn(x)).abs().max().item()
    assert report["init_max_logit_difference"] == pytest.approx(distance, rel=1e-4) and distance > 1e-3
    assert report["exactness_max_logit_error"] < 1e-4 and report["exactness_max_layer_error"] < 1e-4
