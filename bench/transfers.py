"""The weight transfers' figures for the README: CMHSA's conv-to-attention exactness at the paper's scale and
T-CNN's parameter / MAC growth against Tab. 2 of d'Ascoli et al.

    OMP_NUM_THREADS=2 python bench/transfers.py            # 2-4 min on 2 CPU cores, ~6 GB RAM

CMHSA: the shipped cmhsa_k{3,5}_conv specs (224 px, 16x16x3 patches, 6 layers, d = d_H = 768, 9 heads), random
init (seed 0, the spec's), transferred by archspec.transfer.conv_to_mhsa at several relative-bias peaks M; max
|logit difference| on the three real photographs of archspec.io.images.sample_batch.
Border: the same transfer without the ring of zero tokens, on cmhsa_k3_conv_digits (32 px).
T-CNN: timm resnetrs50 / resnet50d (random init; parameter and MAC counts do not depend on weights),
archspec.transfer.tcnn with the paper's defaults (last stage, stride 1); MACs by torch's FlopCounterMode at
224 px (and ResNet50-RS at 160 px, Tab. 2's own row); the exactness with alpha = lambda = 40 and the stride
kept, on the photographs at 224 px, after randomising BatchNorm (timm zero-initialises the last BN of each
residual branch, which would hide the transformed convs from the logits).
Writes bench/transfers.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def cmhsa_rows(images: torch.Tensor) -> list[dict]:
    import archspec
    from archspec.transfer import conv_to_mhsa

    rows = []
    for k in (3, 5):
        conv = archspec.compile(f"cmhsa_k{k}_conv").eval()
        with torch.no_grad():
            ref = conv(images)
        for peak in (5.0, 10.0, 20.0, 40.0):
            attn = conv_to_mhsa(conv, peak=peak)
            with torch.no_grad():
                error = (attn(images) - ref).abs().max().item()
            rows.append({"kernel": k, "peak": peak, "max_logit_error": error, "logit_scale": ref.abs().max().item()})
            print(rows[-1], flush=True)
            del attn
    return rows


def border_rows(images: torch.Tensor) -> list[dict]:
    """cmhsa_k3_conv_digits (32 px, 8x8 grid): the transfer with and without the ring of zero-padding tokens."""
    import torch.nn.functional as F

    import archspec
    from archspec.ir.checked import load_spec
    from archspec.transfer import attention_spec, conv_to_mhsa

    conv = archspec.compile("cmhsa_k3_conv_digits").eval()
    x = F.interpolate(images, size=(32, 32), mode="area")
    unpadded = attention_spec(conv.spec).model_dump()
    unpadded["stages"][0]["mixer"]["pad_tokens"] = 0
    rows = []
    with torch.no_grad():
        ref = conv(x)
        for pad, spec in ((1, None), (0, load_spec(unpadded))):
            error = (conv_to_mhsa(conv, spec=spec)(x) - ref).abs().max().item()
            rows.append({"pad_tokens": pad, "max_logit_error": error, "logit_scale": ref.abs().max().item()})
            print(rows[-1], flush=True)
    return rows


def _randomise_bn(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) * 0.4 + 0.2)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)


def tcnn_rows(images: torch.Tensor) -> list[dict]:
    import timm

    from archspec.transfer.tcnn import count_macs, tcnn, transformed_layers

    rows = []
    x224 = torch.randn(1, 3, 224, 224)
    for name in ("resnetrs50", "resnet50d"):
        torch.manual_seed(0)
        cnn = timm.create_model(name, pretrained=False).eval()
        model = tcnn(cnn).eval()
        row = {"model": name, "params_cnn": sum(p.numel() for p in cnn.parameters()),
               "params_tcnn": sum(p.numel() for p in model.parameters()),
               "macs_cnn_224": count_macs(cnn, x224), "macs_tcnn_224": count_macs(model, x224),
               "macs_cnn_160": count_macs(cnn, torch.randn(1, 3, 160, 160))}
        _randomise_bn(cnn)
        exact = tcnn(cnn, stride_one=False).eval()
        for layer in transformed_layers(exact):
            layer.set_exact(40.0, 40.0)
        with torch.no_grad():
            ref = cnn(images)
            row["max_logit_error"] = (exact(images) - ref).abs().max().item()
            row["logit_scale"] = ref.abs().max().item()
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> None:
    from archspec.io.images import sample_batch

    images = sample_batch((224, 224))
    start = time.perf_counter()
    result = {"cmhsa": cmhsa_rows(images), "border": border_rows(images), "tcnn": tcnn_rows(images),
              "torch": torch.__version__,
              "threads": torch.get_num_threads()}
    result["seconds"] = round(time.perf_counter() - start, 1)
    (HERE / "transfers.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {HERE / 'transfers.json'} in {result['seconds']} s")


if __name__ == "__main__":
    main()
