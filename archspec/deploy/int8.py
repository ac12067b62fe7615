"""int8 post-training quantisation as LeViT did it (sec. 5.3), on PyTorch's maintained quantisation stack.

LeViT (sec. 5.3, Tab. 3) quantises with PyTorch's standard int8 library after training: convolutions fused with
their BatchNorms, weights quantised offline, the activations' affine parameters (scale, zero point) calibrated by
forwarding a few batches of training data, and the two attention matrix products and the softmax kept in
float32.  :func:`quantize` does the same with **torchao's PT2E flow** (``torchao.quantization.pt2e``), the route
the PyTorch docs name as the successor of ``torch.ao.quantization`` ("pt2e quantization has been migrated to
torchao"; PyTorch 2.15 no longer ships ``torch.ao.quantization.quantize_pt2e``):

1. fold every BatchNorm into its linear / conv (:func:`archspec.nn.fuse.fuse_model`, LeViT sec. 5.3); one with
   nothing to fold into (BoTNet's, after timm's ``BottleneckAttn``) is frozen to its per-channel affine map
   (``timm.layers.freeze_batch_norm_2d``);
2. capture the folded model with ``torch.export`` (batch dimension dynamic);
3. ``prepare_pt2e`` with ``X86InductorQuantizer``'s default static config: int8 weights, symmetric per output
   channel (``PerChannelMinMaxObserver``), uint8 activations per tensor (``HistogramObserver``) -- 7 bits
   (0..127, torchao's ``reduce_range``) on x86 CPUs without VNNI (:func:`needs_reduce_range`); the quantizer
   annotates convolutions and linears only, so ``matmul`` (Q K^T and A V), ``softmax`` and the element-wise ops
   between them run in float32 on dequantised inputs -- the paper's choice;
4. calibrate: forward the calibration batches through the observers;
5. ``convert_pt2e``: a graph of quantize / dequantize ops around the float ops (the *reference* int8 graph); with
   7-bit activations each quantize reads its input clamped to the 7-bit range (:func:`clamp_to_quant_range`), so
   that Inductor and ONNX Runtime compute what the reference graph does;
6. ``torch.compile`` with Inductor's ``freezing``: Inductor matches dequantize -> linear / conv -> quantize
   into oneDNN int8 kernels (``onednn.qlinear_pointwise``, ``qconv_pointwise``).  This step is what makes int8
   fast; the uncompiled reference graph simulates int8 in float32 and is slower than the float model.

The result is a :class:`QuantizedModel` (inference only, CPU only).  It is saved as the float weights plus the
calibration (the observers' statistics, ``int8.safetensors``, tensors only -- no pickle): :func:`load_quantized`
rebuilds the identical int8 model from them without the calibration data (steps 1-3 and 5-6 are deterministic).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
import warnings
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from timm.layers import freeze_batch_norm_2d
from torch import nn

from archspec._version import __version__
from archspec.diagnostics.timing import inductor_options
from archspec.errors import SpecError
from archspec.io.artifact import load, save, save_weights_dict, spec_digest
from archspec.io.builddir import INT8_FILE
from archspec.io.datasets import load_data
from archspec.nn.fuse import fuse_model

__all__ = ["QuantizedModel", "quantize", "load_quantized", "save_quantized", "calibration_batches",
           "load_calibration", "needs_reduce_range", "clamp_to_quant_range", "INT8_FILE", "BACKEND"]

# torchao registers an Enum with torch's pytree at import, which torch >= 2.15 answers with a deprecation warning
# on every run (torchao's to fix, nothing a user can act on): drop that one message, nothing else.
logging.getLogger("torch.utils._pytree").addFilter(lambda record: "register_constant" not in record.getMessage())

BACKEND = "torchao PT2E (X86InductorQuantizer: int8 per-channel weights, uint8 per-tensor activations) + Inductor"
MAX_BATCH = 4096  # upper bound of the exported graph's dynamic batch dimension
_OBSERVER = "activation_post_process_"
META_INT8 = "archspec_int8"
_OPTION = ("int8",)  # a problem of int8 quantisation itself (``--int8`` on the command line)
_BATCHES = ("calibration_batches",)  # quantize's parameter (the data of ``--calibrate`` on the command line)
_QUANTIZABLE = ("linear", "conv1d", "conv2d", "conv3d")
_FLOAT_KEPT = ("matmul", "bmm", "baddbmm", "scaled_dot_product_attention", "softmax", "_softmax", "layer_norm",
               "gelu", "hardswish")


@functools.lru_cache(maxsize=1)
def _torchao() -> SimpleNamespace:
    """torchao's PT2E pieces, imported the first time int8 is asked for (importing torchao takes about 0.5 s, which
    no float build or load should pay): ``version``, ``prepare_pt2e``, ``convert_pt2e``, ``X86InductorQuantizer``,
    ``get_default_x86_inductor_quantization_config``.

    Raises:
        ImportError: torchao is missing or too old (:func:`require_backend` turns it into a located message).
    """
    import torchao  # noqa: PLC0415 - torchao loads when int8 is asked for (above)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: PLC0415 - as above
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: PLC0415 - as above
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return SimpleNamespace(version=torchao.__version__, prepare_pt2e=prepare_pt2e, convert_pt2e=convert_pt2e,
                           X86InductorQuantizer=X86InductorQuantizer,
                           get_default_x86_inductor_quantization_config=get_default_x86_inductor_quantization_config)


def require_backend(option: str = "int8") -> None:
    """Check that this machine can run the x86 int8 path: an x86-64 CPU, oneDNN (mkldnn) and torchao.

    Raises:
        SpecError: at ``option``: another CPU architecture, a torch build without oneDNN, or torchao missing.
    """
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        raise SpecError.single((option,), f"int8 runs on x86-64 CPUs (oneDNN kernels through Inductor); this machine "
                                          f"is {machine}", "run the float32 model (add `fuse`) on this machine")
    if not torch.backends.mkldnn.is_available():
        raise SpecError.single((option,), "this torch build has no oneDNN (mkldnn), which the x86 int8 kernels need",
                               "install the standard torch wheel from PyPI")
    try:
        _torchao()
    except ImportError:
        raise SpecError.single((option,), "int8 quantisation needs torchao (PyTorch's quantisation library)",
                               "pip install 'torchao>=0.11'") from None


def _first_tensor(batch: Any, index: int) -> torch.Tensor:
    """A calibration batch: a ``(B, C, H, W)`` tensor, or the images of an ``(images, labels)`` pair."""
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    if not isinstance(batch, torch.Tensor):
        raise SpecError.single(_BATCHES, f"calibration batch {index} is a {type(batch).__name__}, not a tensor",
                               "pass (B, C, H, W) image tensors or (images, labels) pairs")
    return batch


def _collect(batches: Iterable[Any], shape: tuple[int, ...] | None) -> list[torch.Tensor]:
    """The calibration batches as float32 CPU tensors of one ``(C, H, W)`` shape, checked."""
    if isinstance(batches, torch.Tensor):
        raise SpecError.single(_BATCHES, "calibration_batches is one tensor, not an iterable of batches",
                               "pass [images] or a DataLoader; a (B, C, H, W) tensor alone is ambiguous")
    out = []
    for i, batch in enumerate(batches):
        x = _first_tensor(batch, i)
        if x.ndim != 4 or (shape is not None and tuple(x.shape[1:]) != tuple(shape)):
            want = f"(B, {', '.join(map(str, shape))})" if shape else "(B, C, H, W)"
            raise SpecError.single(_BATCHES, f"calibration batch {i} has shape {tuple(x.shape)}; the model "
                                                     f"takes {want}", "resize the images to the model's input size")
        if not x.is_floating_point() or not torch.isfinite(x).all():
            raise SpecError.single(_BATCHES, f"calibration batch {i} is not finite floating-point images",
                                   "normalise the images as for the float model")
        shape = tuple(x.shape[1:])
        out.append(x.detach().to("cpu", torch.float32))
    if not out:
        raise SpecError.single(_BATCHES, "no calibration batches",
                               "LeViT calibrates on a few batches of training data; pass at least one")
    return out


def _input_shape(model: nn.Module) -> tuple[int, ...] | None:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    size = cfg.get("input_size")
    return tuple(size) if size else None


def _export(folded: nn.Module, example: torch.Tensor) -> torch.fx.GraphModule:
    """``torch.export`` of the folded model with a dynamic batch dimension (traced at batch >= 2 so that it is not
    specialised to 1).

    Raises:
        SpecError: at ``int8``: torch.export cannot capture the model (the first line of its reason).
    """
    if example.shape[0] < 2:
        example = example.expand(2, *example.shape[1:]).contiguous()
    try:  # one eager forward first: a model that fails on the images is reported as such, and eval-mode caches
        with torch.no_grad():  # (timm LeViT's attention-bias cache) are filled before export, not during it
            folded(example[:2])
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise SpecError.single(_BATCHES, f"the model fails on a calibration batch: {reason}",
                               "calibrate on images of the model's input size and channels") from None
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    try:
        with torch.no_grad():
            program = torch.export.export(folded, (example[:2],), dynamic_shapes=({0: batch},), strict=False)
    except Exception as exc:  # torch.export raises many types (UserError, Unsupported, RuntimeError, ...)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise SpecError.single(_OPTION, f"torch.export cannot capture this model for PT2E quantisation: {reason}",
                               "int8 needs a model torch.export can trace with a dynamic batch (no data-dependent "
                               "Python control flow); run it in float32 (add `fuse`)") from None
    return program.module()


def needs_reduce_range() -> bool:
    """Whether this CPU's int8 kernels need 7-bit activations: ``True`` on an x86 CPU without VNNI (AVX-512 VNNI,
    AVX-VNNI or AMX).  Without VNNI, oneDNN's and ONNX Runtime's uint8 x int8 dot products (``vpmaddubsw``) add
    pairs of products in int16 and saturate; torchao's ``get_default_x86_inductor_quantization_config``: "Set
    [reduce_range] to True on earlier CPUs without VNNI to avoid accuracy issue" (OpenVINO documents the same
    saturation).  Measured on a 2-core AVX2 VM: LeViT-128S's Inductor int8 logits against the reference graph,
    relative L2 error 1.39 with 8-bit activations, 0.08 with 7 (``tests/test_deploy.py``)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    if getattr(torch.cpu, "_is_vnni_supported", lambda: False)():  # torch's check: AVX-512 VNNI
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    return not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags)


def _freeze_batchnorms(folded: nn.Module) -> int:
    """Swap, in place, each BatchNorm2d that :func:`fuse_model` left (timm's ``BottleneckAttn`` in a BoTNet block
    has no output layer to fold its ``bn2`` into) for timm's frozen one (``timm.layers.freeze_batch_norm_2d``:
    torchvision's ``FrozenBatchNorm2d``, ``(B, C, H, W) -> x * scale + shift`` from the running statistics, no
    batch_norm op); returns how many.  A BatchNorm without running statistics normalises by the batch and is left
    alone (timm's function would fail on it).  Why: with any batch_norm op left in the graph, torchao's
    ``convert_pt2e`` looks for QAT conv -> BatchNorm pairs by tracing 96 pattern graphs with ``torch.export`` (about
    18 s of CPU on a 2-core VM, issue 53), pairs that post-training quantisation of a folded model never has.  The
    quantizer annotates neither op, so the observers are the same."""
    frozen = 0
    for module in list(folded.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.BatchNorm2d) and child.running_mean is not None and child.running_var is not None:
                setattr(module, name, freeze_batch_norm_2d(child))
                frozen += 1
    return frozen


def _prepare(model: nn.Module, example: torch.Tensor, reduce_range: bool) -> tuple[torch.fx.GraphModule, nn.Module]:
    """Fold, export and insert the observers (7-bit activations with ``reduce_range``): ``(prepared graph,
    folded float model)``."""
    ao = _torchao()

    folded = fuse_model(model).cpu()  # LeViT sec. 5.3: BatchNorms folded before quantisation (a copy, eval mode)
    _freeze_batchnorms(folded)
    config = ao.get_default_x86_inductor_quantization_config(reduce_range=reduce_range)
    quantizer = ao.X86InductorQuantizer().set_global(config)
    return ao.prepare_pt2e(_export(folded, example), quantizer), folded


def _observers(prepared: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone().contiguous() for key, value in prepared.state_dict().items()
            if key.startswith(_OBSERVER)}


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def summarize(converted: torch.fx.GraphModule) -> dict:
    """What the int8 graph computes in int8 and what stays float32.

    Returns ``{"int8": {op: count}, "float32": {op: count}, "quantize": n, "dequantize": n}``: ``int8`` counts
    the linears / convolutions whose weight is quantised; ``float32`` the compute ops left in float32 (attention
    products, softmax, normalisations, activations, and any linear / conv left unquantised).
    """
    quantized, kept = Counter(), Counter()
    quant = dequant = 0
    for node in converted.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        if name.startswith("quantize_per"):
            quant += 1
        elif name.startswith("dequantize_per"):
            dequant += 1
        elif name in _QUANTIZABLE:
            weight = node.args[1] if len(node.args) > 1 else None
            is_int8 = getattr(weight, "op", None) == "call_function" and _op_name(weight.target).startswith(
                "dequantize_per")
            (quantized if is_int8 else kept)[name] += 1
        elif name in _FLOAT_KEPT:
            kept[name.lstrip("_")] += 1
    return {"int8": dict(quantized), "float32": dict(kept), "quantize": quant, "dequantize": dequant}


# Inductor's oneDNN int8 lowering (torch 2.15) calls torch.tensor() on a tensor, which warns at every int8 compile;
# the warning is about torch's own code, so exactly that one is ignored (issued from that module, that text).
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning,
                        module=r"torch\._inductor\.mkldnn_lowerings")


def clamp_to_quant_range(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """In place: every ``quantize_per_tensor`` of the converted graph whose range is narrower than its dtype (7-bit
    activations, ``reduce_range``: ``0..127`` of a uint8) reads its input clamped to what that range represents,
    ``[(q_min - zp) s, (q_max - zp) s]`` -- the same values, since rounding the clamped input lands in
    ``q_min..q_max``.  Who runs the graph then honours the 7-bit range: Inductor's oneDNN kernels and ONNX's
    ``QuantizeLinear`` saturate at the dtype's range instead (ONNX has no ``q_max``; the clamp exports as
    ``Clip``).  Measured on LeViT-128S, 64 px, AVX2 without VNNI: Inductor's logits against the reference graph,
    relative L2 0.08 without the clamp, 0 with it; ONNX Runtime's 0.09 and 0.  8-bit
    activations get no clamp.  Returns ``graph_module``."""
    graph = graph_module.graph
    target = torch.ops.quantized_decomposed.quantize_per_tensor.default
    for node in list(graph.nodes):
        if node.target is not target or len(node.args) < 6:
            continue
        x, scale, zero_point, q_min, q_max, dtype = node.args[:6]
        if not all(isinstance(v, (int, float)) for v in (scale, zero_point, q_min, q_max)):
            continue  # tensor-valued parameters: not what the x86 quantizer makes
        info = torch.iinfo(dtype)
        if q_min <= info.min and q_max >= info.max:
            continue
        with graph.inserting_before(node):
            clamped = graph.call_function(torch.ops.aten.clamp.default,
                                          (x, (q_min - zero_point) * scale, (q_max - zero_point) * scale))
        node.replace_input_with(x, clamped)
    graph.lint()
    graph_module.recompile()
    return graph_module


def compile_int8(program: torch.fx.GraphModule) -> nn.Module:
    """``torch.compile`` of a converted PT2E graph; called under :func:`archspec.diagnostics.timing.inductor_options`
    (Inductor's ``freezing``: weights as constants), Inductor lowers dequantize -> linear/conv -> quantize to
    oneDNN int8 kernels (torchao's x86 PT2E tutorial).  Compilation happens at the first call (tens of seconds
    for a LeViT on 2 cores) and again at each new batch size: static shapes (``dynamic=False``), since Inductor's
    int8 weight prepacking in torch 2.15 fails on a symbolic batch dimension."""
    return torch.compile(program, dynamic=False)


class QuantizedModel(nn.Module):
    """An int8 model made by :func:`quantize` or :func:`load_quantized`: images ``(B, C, H, W)`` float32 ->
    logits ``(B, num_classes)`` float32, on the CPU, inference only (``train()`` raises).

    Attributes:
        program: the converted PT2E graph (quantize / dequantize ops around float ops; the reference int8 model).
        spec: the :class:`~archspec.spec.ArchSpec` of the float model (``None`` for a timm model).
        float_model: the float model it was made from (unfolded; what :func:`save_quantized` writes).
        observers: the calibrated observer statistics (``int8.safetensors``).
        calibration: what it was calibrated on (JSON-ready).
        summary: :func:`summarize` of ``program``: ops in int8, ops kept in float32.
        compiled: whether ``forward`` runs the Inductor-compiled graph (fast) or the reference graph (slow,
            simulated int8; for checks and ONNX export).
    """

    def __init__(self, program: torch.fx.GraphModule, float_model: nn.Module, observers: dict[str, torch.Tensor],
                 calibration: dict, torch_compile: bool = True):
        super().__init__()
        self.program = program
        self.spec = getattr(float_model, "spec", None)
        self.observers = observers
        self.calibration = calibration
        self.summary = summarize(program)
        self.compiled = torch_compile
        self.pretrained_cfg = getattr(float_model, "pretrained_cfg", None)
        # plain attributes, not sub-modules: no second copy of the weights in state_dict(), and eval() reaches
        # neither (an exported graph refuses .eval()/.train())
        object.__setattr__(self, "float_model", float_model)
        object.__setattr__(self, "_runner", compile_int8(program) if torch_compile else program)
        self.training = False

    def save_build(self, directory: str | os.PathLike) -> Path:
        """:func:`save_quantized` of this model (what :func:`archspec.save` calls for an int8 model)."""
        return save_quantized(self, directory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of images ``(B, C, H, W)`` (any batch size up to 4096)."""

        with torch.no_grad(), inductor_options():
            return self._runner(x)

    def train(self, mode: bool = True) -> QuantizedModel:
        """``eval()`` is a no-op; ``train()`` raises ``RuntimeError`` (int8 is for inference: train the float
        model and quantise it again)."""
        if mode:
            raise RuntimeError("an int8 model is for inference only; train the float model and quantise it again")
        return self

    def reference(self) -> QuantizedModel:
        """The same int8 model running the uncompiled reference graph (no Inductor; slow, for checks)."""
        return QuantizedModel(self.program, self.float_model, self.observers, self.calibration, torch_compile=False)


def quantize(model: nn.Module, calibration_batches: Iterable[Any], *, torch_compile: bool = True,
             description: dict | None = None, reduce_range: bool | None = None) -> QuantizedModel:
    """int8 post-training quantisation of ``model`` as LeViT did it (sec. 5.3; see the module docstring).

    Args:
        model: an archspec model (or a timm-style model); left unchanged (a folded copy is quantised).
        calibration_batches: an iterable of images ``(B, C, H, W)`` float32, normalised as for the float model,
            or of ``(images, labels)`` pairs (a ``DataLoader``); LeViT used "a few batches of training data"
            (:func:`calibration_batches` makes them from a dataset).
        torch_compile: run the int8 graph through ``torch.compile`` (Inductor, oneDNN int8 kernels: the fast path;
            compiles at the first call).  ``False``: the reference graph, simulated int8 (slow).
        description: what the batches are (JSON-ready; stored with the model, e.g. the dataset's name).
        reduce_range: 7-bit activations (0..127) so that CPUs without VNNI do not saturate; ``None`` (default):
            :func:`needs_reduce_range` of this CPU.  Recorded in ``calibration["reduce_range"]`` and saved, so a
            build loads as it was made wherever it is loaded.

    Returns:
        :class:`QuantizedModel`: logits ``(B, num_classes)`` for images ``(B, C, H, W)``.

    Raises:
        SpecError: what cannot be quantised, with the reason: a non-x86 CPU, torch without oneDNN, torchao
            missing (at ``int8``); no calibration batches, batches of the wrong shape or not finite (at
            ``calibration_batches``); a model torch.export cannot capture; a model with no linear or convolution.
    """
    require_backend()
    batches = _collect(calibration_batches, _input_shape(model))
    convert_pt2e = _torchao().convert_pt2e

    reduce_range = needs_reduce_range() if reduce_range is None else bool(reduce_range)
    was = model.training
    try:
        prepared, _ = _prepare(model, batches[0], reduce_range)
    finally:
        model.train(was)
    with torch.no_grad():
        for x in batches:
            prepared(x)
    observers = _observers(prepared)
    converted = clamp_to_quant_range(convert_pt2e(prepared))
    calibration = {"batches": len(batches), "images": sum(len(x) for x in batches),
                   "input_shape": list(batches[0].shape[1:]), "reduce_range": reduce_range, **(description or {})}
    quantized = QuantizedModel(converted, model, observers, calibration, torch_compile=torch_compile)
    if not quantized.summary["int8"]:
        raise SpecError.single(_OPTION, "the model has no linear or convolution the x86 quantizer can quantise",
                               "nothing would run in int8; run it in float32")
    return quantized


def calibration_batches(data: Any, channels: int, resolution: tuple[int, int], batches: int = 4,
                        batch_size: int = 32, seed: int = 0) -> list[torch.Tensor]:
    """``batches`` batches of ``batch_size`` training images of an :class:`archspec.io.datasets.Dataset`, resized to
    ``resolution`` ``(H, W)`` and brought to ``channels`` (grey repeated to RGB, RGB averaged to grey), in a
    seeded order: the calibration set LeViT describes ("a few batches of training data").

    Returns:
        a list of ``(B, channels, H, W)`` float32 tensors (fewer images when the training split is smaller).
    """
    images = data.at_size(tuple(resolution)).train.tensors[0]
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:batches * batch_size]
    x = images[order]
    if x.shape[1] != channels:
        x = x.mean(dim=1, keepdim=True) if channels == 1 else x[:, torch.arange(channels) % x.shape[1]]
    return [chunk.contiguous() for chunk in x.split(batch_size)]


def load_calibration(source: str | os.PathLike | None, channels: int, resolution: tuple[int, int], batches: int = 4,
                     batch_size: int = 32, seed: int = 0) -> tuple[list[torch.Tensor], dict]:
    """The calibration batches of ``archspec build --int8 --calibrate SOURCE``: :func:`calibration_batches` of
    :func:`archspec.io.datasets.load_data` (``None``: the embedded digits), loading only a stratified subset a little
    larger than the ``batches * batch_size`` training images needed (Fashion-MNIST in full at 224 px would be
    14 GB).  Returns ``(batches, description)``, the description JSON-ready (data set, source, seed).

    Raises:
        SpecError: at ``source``: what :func:`archspec.io.datasets.load_data` raises (at its ``data``).
    """


    pool = max(2, math.ceil(batches * batch_size / 0.75))  # every source keeps >= 75% of its images for training
    try:
        data = load_data(source, max(resolution), seed=seed, max_images=pool)
    except SpecError as exc:  # load_data speaks of `data`, this function's `source`
        raise exc.renamed("data", "source") from None
    out = calibration_batches(data, channels, resolution, batches, batch_size, seed)
    return out, {"data": data.name, "source": str(source or "digits"), "seed": seed}


def save_quantized(model: QuantizedModel, directory: str | os.PathLike) -> Path:
    """Write ``model`` to ``directory``: the float build (``spec.yaml``, ``model.safetensors``, as
    :func:`archspec.save`) plus ``int8.safetensors``, the calibrated observer statistics (tensors only) with the
    calibration, the torch / torchao versions and the spec digest in its metadata.  Returns the directory.

    Raises:
        SpecError: the model was not made from an archspec model (no spec to save).
        OSError: a file cannot be written.
    """

    if model.spec is None:
        raise SpecError.single((), "only an int8 model made from an archspec model can be saved (it has no spec)",
                               "quantise archspec.compile(...) or archspec.load(...)")
    directory = save(model.float_model, directory)
    save_weights_dict(model.observers, directory / INT8_FILE, {
        "format": "pt", "archspec_version": __version__, "archspec_spec_sha256": spec_digest(model.spec),
        META_INT8: json.dumps(_provenance(model.calibration), sort_keys=True)})
    return directory


def _provenance(calibration: dict) -> dict:
    return {"backend": BACKEND, "torch": torch.__version__, "torchao": _torchao().version,
            "calibration": calibration}


def load_quantized(directory: str | os.PathLike, torch_compile: bool = True,
                   allow_spec_change: bool = False) -> QuantizedModel:
    """Rebuild the int8 model saved in ``directory`` (``archspec build --int8`` or :func:`save_quantized`).

    The float model is loaded as :func:`archspec.load` does, folded, exported and given fresh observers; the
    saved statistics replace theirs and ``convert_pt2e`` makes the same int8 graph (no calibration data needed).

    Raises:
        SpecError: no ``int8.safetensors`` (with the command that writes one), an unreadable file, statistics
            of another model or another torch / torchao version whose graph differs, and everything
            :func:`archspec.load` raises; what :func:`quantize` refuses.
    """
    require_backend()
    convert_pt2e = _torchao().convert_pt2e
    directory = Path(directory)
    path = directory / INT8_FILE
    float_model = load(directory, allow_spec_change=allow_spec_change)
    if not path.is_file():
        raise SpecError.single((), f"no {INT8_FILE}: this build holds float weights only",
                               "rebuild it with `archspec build SPEC --int8`, or quantise with "
                               "archspec.quantize(archspec.load(dir), batches)", str(directory))
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            saved = {key: handle.get_tensor(key) for key in handle.keys()}
        provenance = json.loads(metadata[META_INT8])
    except (SafetensorError, OSError, ValueError, KeyError) as exc:
        raise SpecError.single((), f"not an int8 calibration file archspec wrote: {str(exc).splitlines()[0]}",
                               "rebuild it with `archspec build SPEC --int8`", str(path)) from None
    if metadata.get("archspec_spec_sha256") != spec_digest(float_model.spec) and not allow_spec_change:
        raise SpecError.single((), "was calibrated for another spec than this directory's spec.yaml",
                               "rebuild it with `archspec build SPEC --int8`", str(path))
    shape = _saved_input_shape(provenance, float_model, path)
    reduce_range = provenance["calibration"].get("reduce_range", False)  # files before it was recorded: 8 bits
    if not isinstance(reduce_range, bool):
        raise SpecError.single((), "not an int8 calibration file archspec wrote: its calibration's reduce_range is "
                                   f"{reduce_range!r}, not true or false", "rebuild it with `archspec build SPEC "
                                   "--int8`", str(path))
    prepared, _ = _prepare(float_model, torch.zeros(2, *shape), reduce_range)
    if set(_observers(prepared)) != set(saved):  # (a per-channel observer's shape is set when it first observes)
        raise SpecError.single((), f"its observers do not match the graph this torch {torch.__version__} / torchao "
                                   f"{_torchao().version} makes (saved with torch {provenance.get('torch')}, "
                                   f"torchao {provenance.get('torchao')})",
                               "calibrate again: `archspec build SPEC --int8 --calibrate DATA`", str(path))
    state = OrderedDict(saved)
    # the observers' version metadata: without it they read the file as an old (version < 3) state and reset eps
    state._metadata = getattr(prepared.state_dict(), "_metadata", None)
    try:
        prepared.load_state_dict(state, strict=False)
        unchanged = all(torch.equal(value, saved[key]) for key, value in _observers(prepared).items())
        converted = clamp_to_quant_range(convert_pt2e(prepared)) if unchanged else None
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:  # e.g. a reshaped statistic
        raise SpecError.single((), f"its observer statistics do not fit this model's observers: "
                                   f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                               "calibrate again: `archspec build SPEC --int8 --calibrate DATA`", str(path)) from None
    if not unchanged:
        raise SpecError.single((), "its observer statistics did not load unchanged into this torchao's observers",
                               "calibrate again: `archspec build SPEC --int8 --calibrate DATA`", str(path))
    return QuantizedModel(converted, float_model, saved, provenance["calibration"], torch_compile=torch_compile)


def _saved_input_shape(provenance: Any, float_model: nn.Module, path: Path) -> tuple[int, ...]:
    """The calibration's input shape ``(C, H, W)`` from the file's metadata, which must be the model's own input
    (so nothing is allocated at a size the file alone decides).

    Raises:
        SpecError: naming ``path``: no calibration record, or a shape other than the model's input.
    """
    calibration = provenance.get("calibration") if isinstance(provenance, dict) else None
    shape = calibration.get("input_shape") if isinstance(calibration, dict) else None
    if not (isinstance(shape, list) and shape and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                      for v in shape)):
        raise SpecError.single((), "not an int8 calibration file archspec wrote: its metadata has no calibration "
                                   "input shape", "rebuild it with `archspec build SPEC --int8`", str(path))
    expected = _input_shape(float_model)
    if expected is not None and tuple(shape) != tuple(expected):
        raise SpecError.single((), f"its calibration input shape {tuple(shape)} is not the model's input "
                                   f"{tuple(expected)}", "rebuild it with `archspec build SPEC --int8`", str(path))
    if expected is None and len(shape) > 4:
        raise SpecError.single((), f"its calibration input shape {tuple(shape)} is not an image's",
                               "rebuild it with `archspec build SPEC --int8`", str(path))
    return tuple(shape)
