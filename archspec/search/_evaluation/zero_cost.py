"""Zero-cost proxies: score an untrained candidate from one mini-batch, before any training.

Three scores from the literature, each computed on the model as built (its initial weights):

* :func:`naswot` -- Mellor et al., "Neural Architecture Search without Training" (ICML 2021), Eq. 2:
  ``log |K_H|``, with ``K_H[i, j] = N_A - d_H(c_i, c_j)`` over the binary activation codes of the images;
* :func:`synflow` -- Tanaka et al., "Pruning neural networks without any data by iteratively conserving
  synaptic flow" (NeurIPS 2020), as a zero-cost proxy in Abdelfattah et al., "Zero-Cost Proxies for
  Lightweight NAS" (ICLR 2021), Sec. 3: ``sum_theta |theta * dR/dtheta|`` with ``R = 1^T (prod |theta|) 1``;
* :func:`grad_norm` -- Abdelfattah et al. 2021, Sec. 3: ``sum_W ||dL/dW||_F`` of the cross-entropy loss.

:func:`zero_cost_scores` runs a chosen subset and times each score.  The graph scores ``params`` and
``macs`` are not computed here: they come from :func:`archspec.analyze` (no forward pass needed).

None of these functions changes the caller's model: its parameters, buffers (BatchNorm running
statistics), ``.grad`` fields, ``requires_grad`` flags and per-module train/eval modes are as before.

Train/eval modes.  The reference codes score the model in train mode, and so do :func:`naswot` and
:func:`grad_norm`.  :func:`synflow` needs BatchNorm in eval mode (a single all-ones image has no batch
variance), but archspec's attention layers in eval mode read detached cached weights (the stacked
``qk``/``v`` projection, the bias tables), which would hide those parameters from ``dR/dtheta``.  So SynFlow
runs its copy in train mode with only the BatchNorm layers in eval mode.  In all three scores, dropout and
drop-path layers are in eval mode, so that a score is a deterministic function of the weights and the batch
(the reference search spaces have no dropout).

Model outputs: logits ``(B, num_classes)``; a tuple of heads (a distilled model after
``set_distilled_training(True)`` returns ``(cls_logits, dist_logits)`` in train mode) is averaged, which
is what such a model returns without the switch.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.dropout import _DropoutNd

from archspec.search._evaluation.protocols import ZERO_COST_SCORES, ZeroCostResult

__all__ = ["ZERO_COST_SCORES", "RECTIFIERS", "ZeroCostResult", "hamming_kernel", "naswot_kernel", "naswot",
           "synflow_saliencies", "synflow", "grad_norm", "zero_cost_scores"]


# Activations whose input sign gates the unit: NASWOT's "rectified units", extended from ReLU to the smooth
# rectifiers archspec builds (GELU, Hardswish in LeViT) and their relatives.
RECTIFIERS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Hardswish, nn.Mish)

_DROPOUTS = (_DropoutNd, DropPath)


# ------------------------------------------------------------------------------------------- helpers
def _logits(output: Tensor | Sequence[Tensor]) -> Tensor:
    """The model's logits: a tuple or list of heads is averaged (a distilled model's train-mode output)."""
    if isinstance(output, (tuple, list)):
        return torch.stack(tuple(output)).mean(0)
    return output


def _set_scoring_modes(model: nn.Module, batchnorm_eval: bool = False) -> None:
    """Train mode, with dropout / drop-path (and, for SynFlow, BatchNorm) layers in eval mode."""
    model.train()
    for module in model.modules():
        if isinstance(module, _DROPOUTS) or (batchnorm_eval and isinstance(module, _BatchNorm)):
            module.eval()


@contextmanager
def _preserved(model: nn.Module) -> Iterator[None]:
    """Restore the per-module modes, BatchNorm buffers and ``requires_grad`` flags on exit.

    Train-mode forwards update BatchNorm running statistics in place; a score must not.  ``.grad`` is never
    touched: the scores take their gradients with ``torch.autograd.grad``.
    """
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    stats = [(b, b.clone()) for m in model.modules() if isinstance(m, _BatchNorm) for b in m.buffers(recurse=False)]
    try:
        yield
    finally:
        for module, training in modes:
            module.train(training)  # per module: a caller's mixed modes come back as they were
        for param, flag in flags:
            param.requires_grad_(flag)
        with torch.no_grad():
            for buffer, saved in stats:
                buffer.copy_(saved)


def _check_images(images: Tensor) -> None:
    if images.dim() != 4 or images.shape[0] < 1:
        raise ValueError(f"images must be a (B, C, H, W) batch, got shape {tuple(images.shape)}")


# ------------------------------------------------------------------------------------------- NASWOT
def hamming_kernel(codes: Tensor) -> Tensor:
    """NASWOT kernel of binary codes: ``K[i, j] = D - d_H(c_i, c_j)``, the number of units that agree.

    With ``s = 2 c - 1`` in ``{-1, +1}``, ``s_i . s_j = (agreements) - (disagreements) = D - 2 d_H``, so
    ``K = (D + s s^T) / 2`` -- one matrix product, the same as ``c c^T + (1 - c)(1 - c)^T``.

    Args:
        codes: ``(B, D)`` bool (or 0/1) codes, one row per image.

    Returns:
        ``(B, B)`` float64 kernel, exact (integers): the product runs in float32 while its sums (at most
        ``D``) are exact there, below ``2^24``, and in float64 beyond.
    """
    units = codes.shape[1]
    dtype = torch.float32 if units < 2**24 else torch.float64
    signs = codes.to(dtype) * 2 - 1
    return (units + (signs @ signs.T).double()) / 2


def naswot_kernel(model: nn.Module, images: Tensor) -> Tensor:
    """The NASWOT kernel ``K_H`` of a batch (Mellor et al. 2021, Eq. 2), ``K_H[i, i] = N_A``.

    The code ``c_i`` of image ``i`` is ``1[pre-activation > 0]`` over every unit entering an activation
    module of a :data:`RECTIFIERS` type (forward pre-hooks, so an in-place ReLU cannot overwrite the input
    first).  For ReLU this is the paper's code; for GELU, SiLU and Hardswish the sign of the input is the
    usual extension (the unit is "on" where the activation is near-linear, "off" where it is near zero).
    Token tensors ``(B, N, C)`` and maps ``(B, C, H, W)`` are flattened per image, so every element is a
    unit, and each call of a reused module adds its own units.  ``K_H`` is summed hook by hook
    (:func:`hamming_kernel`) instead of concatenating the codes, so memory stays ``O(B^2)`` beyond one layer.

    Mode: train mode as in the paper's reference code (BatchNorm normalises with the batch's statistics),
    dropout off, under ``torch.no_grad()``; the model is left as it was (:func:`_preserved`).

    Args:
        model: the network, returning logits from ``model(images)``.
        images: ``(B, C, H, W)`` batch on the model's device; every hooked activation's input must have
            ``B`` as its leading factor.

    Returns:
        ``(B, B)`` float64 kernel.

    Raises:
        ValueError: ``images`` is not a ``(B, C, H, W)`` batch, or the model has no rectifier module.
    """
    _check_images(images)
    batch = images.shape[0]
    kernel = torch.zeros(batch, batch, dtype=torch.float64, device=images.device)

    def hook(_module: nn.Module, args: tuple) -> None:
        nonlocal kernel
        kernel = kernel + hamming_kernel(args[0].reshape(batch, -1) > 0)

    rectifiers = [m for m in model.modules() if isinstance(m, RECTIFIERS)]
    if not rectifiers:
        raise ValueError(f"NASWOT needs rectified units: {type(model).__name__} has no "
                         f"{'/'.join(t.__name__ for t in RECTIFIERS)} module")
    handles = [m.register_forward_pre_hook(hook) for m in rectifiers]
    try:
        with _preserved(model), torch.no_grad():
            _set_scoring_modes(model)
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    return kernel


def naswot(model: nn.Module, images: Tensor) -> float:
    """NASWOT score ``log |K_H|`` of a batch (Mellor et al. 2021, Eq. 2); higher is better.

    Args:
        model: the network (see :func:`naswot_kernel` for the units, the mode and the hooks).
        images: ``(B, C, H, W)`` batch of real images; the paper uses ``B = 128``.

    Returns:
        The natural log-determinant of ``K_H`` (``torch.linalg.slogdet`` in float64), or ``float("-inf")``
        when ``K_H`` is singular: two images with the same code (a duplicated image, or a network whose codes
        collapse, e.g. all-dead units) make two rows equal.  Singular means a determinant sign <= 0 (``K_H``
        is positive semi-definite) or a numerical rank below ``B`` (``torch.linalg.matrix_rank``'s default
        tolerance), so that rounding cannot turn a singular kernel into a large finite score.

    Raises:
        ValueError: as :func:`naswot_kernel`.
    """
    kernel = naswot_kernel(model, images)
    sign, logdet = torch.linalg.slogdet(kernel)
    if sign.item() <= 0 or torch.linalg.matrix_rank(kernel, hermitian=True).item() < kernel.shape[0]:
        return float("-inf")
    return logdet.item()


# ------------------------------------------------------------------------------------------- SynFlow
def synflow_saliencies(model: nn.Module, input_shape: tuple[int, int, int]) -> dict[str, Tensor]:
    """Synaptic saliency ``|theta (.) dR/dtheta|`` of every parameter (Tanaka et al. 2020), float64.

    As Abdelfattah et al.'s reference code: a deep copy of the model in float64 with every parameter
    replaced by its absolute value (buffers are kept: fresh BatchNorm statistics are mean 0, variance 1),
    ``R = sum(model(ones(1, C, H, W)))``, one backward.  The copy runs in train mode with BatchNorm in eval
    mode (running statistics: one constant image has no batch variance; the reference removes BN instead)
    and dropout off -- archspec's attention in eval mode would read detached cached weights (module
    docstring).  The absolute value of each term follows the reference code; for a network that is
    monotone in its inputs and weights (linear layers and ReLU) every term is >= 0 anyway.

    Args:
        model: the network; it is copied, never changed.
        input_shape: ``(C, H, W)`` of one image.

    Returns:
        Parameter name -> saliency tensor of the parameter's shape (zeros for a parameter that does not
        reach the output).

    Raises:
        ValueError: ``input_shape`` is not ``(C, H, W)``.
    """
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {tuple(input_shape)}")
    net = copy.deepcopy(model).double()  # .double() also drops archspec's cached constants
    _set_scoring_modes(net, batchnorm_eval=True)
    named = dict(net.named_parameters())
    with torch.no_grad():
        for param in named.values():
            param.abs_().requires_grad_(True)
    device = next(iter(named.values())).device if named else torch.device("cpu")
    flow = _logits(net(torch.ones((1, *input_shape), dtype=torch.float64, device=device))).sum()
    grads = torch.autograd.grad(flow, list(named.values()), allow_unused=True)
    return {name: torch.zeros_like(p) if g is None else (p * g).detach().abs()
            for (name, p), g in zip(named.items(), grads)}


def synflow(model: nn.Module, input_shape: tuple[int, int, int]) -> float:
    """SynFlow score: the sum of the synaptic saliencies of all parameters (Abdelfattah et al. 2021, Sec. 3).

    For a chain of ``L`` bias-free linear layers the score is ``L * R`` (Euler: ``R`` is degree-1 homogeneous
    in each layer's weights).  Unlike the reference code, which sums Conv/Linear weights only, every parameter
    counts (norm affines, biases, attention bias tables, position embeddings): they all carry the flow.

    Args:
        model: the network (copied, never changed; see :func:`synflow_saliencies`).
        input_shape: ``(C, H, W)`` of one image.

    Returns:
        The score as a Python float (float64 sum); ``float("inf")`` when ``R`` or the sum overflows float64
        (deep networks: the caller may take ``math.log10`` of finite scores to rank them).

    Raises:
        ValueError: ``input_shape`` is not ``(C, H, W)``.
    """
    saliencies = synflow_saliencies(model, input_shape)
    total = sum((s.sum() for s in saliencies.values()), torch.zeros((), dtype=torch.float64)).item()
    return float("inf") if math.isnan(total) else total  # NaN only from inf * 0 after an overflow


# ------------------------------------------------------------------------------------------- grad-norm
def grad_norm(model: nn.Module, images: Tensor, labels: Tensor) -> float:
    """grad-norm score ``sum_W ||dL/dW||_F`` (Abdelfattah et al. 2021, Sec. 3).

    ``L`` is the mean cross-entropy of the batch.  ``W`` runs over the weights of the Linear and
    Conv layers only -- as the reference code, which scores "all layers" through their ``weight``: biases,
    norm affines, bias tables and embeddings are left out.  A weight shared by two layers counts once.
    Mode: train mode (as the reference), dropout off; the gradients come from ``torch.autograd.grad``, so the
    caller's ``.grad`` fields are untouched, and the modes and BatchNorm statistics are restored.

    Args:
        model: the network, returning logits ``(B, num_classes)`` from ``model(images)``.
        images: ``(B, C, H, W)`` batch.
        labels: ``(B,)`` int64 class indices.

    Returns:
        The score as a Python float (a float64 sum of the per-tensor norms).

    Raises:
        ValueError: bad shapes, or a model without Linear / Conv weights.
    """
    _check_images(images)
    if labels.shape != images.shape[:1]:
        raise ValueError(f"labels must be ({images.shape[0]},), got {tuple(labels.shape)}")
    weights = list({id(m.weight): m.weight for m in model.modules()
                    if isinstance(m, (nn.Linear, _ConvNd)) and isinstance(m.weight, Tensor)}.values())
    if not weights:
        raise ValueError(f"grad-norm needs Linear or Conv weights: {type(model).__name__} has none")
    with _preserved(model):
        _set_scoring_modes(model)
        for weight in weights:
            weight.requires_grad_(True)  # a frozen layer still counts (restored on exit)
        loss = F.cross_entropy(_logits(model(images)), labels)
        grads = torch.autograd.grad(loss, weights, allow_unused=True)
    norms = [g.double().norm() for g in grads if g is not None]  # an unused weight has a zero gradient
    return torch.stack(norms).sum().item() if norms else 0.0


# ------------------------------------------------------------------------------------------- all
def zero_cost_scores(model: nn.Module, images: Tensor, labels: Tensor,
                     names: Sequence[str] = ZERO_COST_SCORES) -> ZeroCostResult:
    """Compute the chosen zero-cost scores of a model on one mini-batch, each timed.

    Args:
        model: the network (never changed).
        images: ``(B, C, H, W)`` batch of real images; SynFlow uses only its shape ``(C, H, W)``.
        labels: ``(B,)`` int64 class indices (for grad-norm).
        names: scores to compute, from :data:`ZERO_COST_SCORES`, in this order.

    Returns:
        A :class:`ZeroCostResult` with one score and one duration (seconds) per name.

    Raises:
        ValueError: an unknown score name (``params`` and ``macs`` come from :func:`archspec.analyze`), or as
            the score functions.
    """
    unknown = [name for name in names if name not in ZERO_COST_SCORES]
    if unknown:
        raise ValueError(f"unknown zero-cost score {unknown[0]!r}: choose from {', '.join(ZERO_COST_SCORES)} "
                         "(params and macs come from the graph: archspec.analyze)")
    compute = {"naswot": lambda: naswot(model, images), "grad_norm": lambda: grad_norm(model, images, labels),
               "synflow": lambda: synflow(model, tuple(images.shape[1:]))}
    result = ZeroCostResult()
    for name in names:
        start = time.perf_counter()
        result.scores[name] = compute[name]()
        result.seconds[name] = time.perf_counter() - start
    return result
