"""timm registration: every shipped spec is a timm model named ``archspec_<spec name>``.

After ``import archspec`` (in either order with ``import timm``)::

    >>> import archspec, timm
    >>> timm.list_models("archspec_*")[:3]
    ['archspec_cmhsa_k3', 'archspec_cmhsa_k3_conv', 'archspec_convit_small']
    >>> model = timm.create_model("archspec_mait_tiny_sch2", num_classes=10, img_size=160, drop_path_rate=0.1)

The ``archspec_`` prefix keeps timm's own ``levit_128s``, ``convit_tiny``, ``deit_tiny_patch16_224`` untouched.
User specs are added with :func:`register`.  Models are built through timm's ``build_model_with_cfg``, so
``features_only`` / ``out_indices`` (timm ``FeatureGetterNet`` over ``forward_intermediates``),
``pretrained_cfg`` / ``pretrained_cfg_overlay`` and the other keyword arguments of ``timm.create_model``
behave as for timm's own models.  No weights are published: ``pretrained=True`` is refused unless
``pretrained_cfg_overlay`` names a weight source (``file=...``, e.g. an ``archspec build`` output); weights
saved at another (square) input size are resampled on the way in (:func:`archspec.nn.resample.resample_state_dict`).

Importing this module imports the spec parser and timm's model registry (it is imported when timm is, or by
:func:`archspec.register`), not archspec's model code (torch-side; imported when a model is built, so ``import
timm`` does not pay for it).  ``import archspec`` does not import it: :func:`install` (:mod:`archspec.timm_bridge.hook`,
stdlib only) registers the shipped specs right away if timm is already imported, otherwise as soon as it is (a
one-shot post-import hook on ``sys.meta_path``), so ``archspec validate`` never imports torch, and ``import
archspec`` not even the spec parser.
"""

from __future__ import annotations

import os
from typing import Any

from timm.models import build_model_with_cfg, register_model

from archspec.errors import SpecError
from archspec.families.attention.heads import at_other_resolution
from archspec.ir.checked import load_spec
from archspec.ir.plan import build_plan
from archspec.nn.layout import layout_of
from archspec.spec import SPEC_DIR, shipped_specs
from archspec.timm_bridge.hook import install, register_if_deferred

__all__ = ["PREFIX", "register", "register_shipped", "create_timm_model", "install"]

PREFIX = "archspec_"
# Keys of a pretrained cfg that name where weights come from (timm ``_PRETRAINED_SOURCE_KEYS``).
_WEIGHT_SOURCES = ("file", "url", "hf_hub_id", "state_dict")


def _spec_with_kwargs(spec: Any, num_classes: int | None, in_chans: int | None, img_size: Any,
                      drop_path_rate: float | None, global_pool: str | None) -> Any:
    """The spec with timm's keyword arguments applied (re-checked). ``drop_path_rate`` is spread
    linearly over all blocks from 0 (timm ViT: ``linspace(0, rate, depth)``)."""

    data = spec.model_dump()
    if num_classes is not None:
        data["head"] = {**data["head"], "num_classes": num_classes}
    if in_chans is not None:
        data["input"] = {**data["input"], "channels": in_chans}
    if img_size is not None:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if size != tuple(spec.input.resolution):  # as with_resolution: Swin's windows clamp there, as timm's do
            data = at_other_resolution(data)
        data["input"] = {**data["input"], "resolution": size}
    if global_pool is not None:
        pools = {"token": "cls", "avg": "mean"}
        if global_pool not in pools:
            raise SpecError.single(("global_pool",), f"must be 'token' or 'avg', got {global_pool!r}")
        data["head"] = {**data["head"], "pool": pools[global_pool]}
    if drop_path_rate is not None:
        last = max(sum(stage["depth"] for stage in data["stages"]) - 1, 1)  # conv stages' blocks too
        start = 0
        for stage in data["stages"]:
            first, end = start, start + stage["depth"] - 1
            stage["drop_path"] = (drop_path_rate * first / last, drop_path_rate * end / last)
            start += stage["depth"]
    return load_spec(data)


def _model_factory(spec: Any):
    """timm ``model_cls`` for ``build_model_with_cfg``: keyword arguments -> :class:`~archspec.nn.model.ArchModel`."""

    def build(num_classes: int | None = None, in_chans: int | None = None, img_size: Any = None,
              drop_rate: float = 0.0, drop_path_rate: float | None = None, global_pool: str | None = None,
              dynamic_img_size: bool = False, **unknown: Any):
        from archspec.nn.compiler import compile  # noqa: PLC0415 - import archspec stays torch-free; timm models are built on request

        if unknown:
            raise TypeError(f"{spec.name}: archspec models take no argument(s) {', '.join(sorted(unknown))}; "
                            "supported: num_classes, in_chans, img_size, drop_rate, drop_path_rate, global_pool, "
                            "dynamic_img_size, features_only, out_indices")
        model = compile(_spec_with_kwargs(spec, num_classes, in_chans, img_size, drop_path_rate, global_pool),
                        drop_rate=drop_rate)
        if dynamic_img_size:
            model.set_dynamic_img_size(True)
        return model

    return build


def _default_cfg(spec: Any) -> dict[str, Any]:
    """timm pretrained cfg of a spec (the model's data config, plus a note naming the spec)."""
    from archspec.nn.model import default_pretrained_cfg  # noqa: PLC0415 - import archspec stays torch-free; timm models are built on request

    note = f"archspec spec {spec.name}" + (f": {spec.source}" if spec.source else "")
    return {**default_pretrained_cfg(layout_of(build_plan(spec))), "license": "", "notes": (note,)}


def create_timm_model(spec: Any, variant: str, pretrained: bool = False, pretrained_cfg: Any = None,
                      pretrained_cfg_overlay: dict | None = None, **kwargs: Any):
    """Build ``spec`` as timm's factory would (``timm.models.build_model_with_cfg``).

    Keyword arguments (those ``timm.create_model`` passes): ``num_classes``, ``in_chans``, ``img_size``
    (int or ``(H, W)``), ``drop_rate`` (dropout before the classifier), ``drop_path_rate`` (stochastic
    depth, linear from 0 over all blocks, as timm ViT), ``global_pool`` ('token' or 'avg'),
    ``dynamic_img_size``, ``features_only`` with ``out_indices`` (default: the last 3 blocks of a one-stage
    model, as timm ViT; every stage of a multi-stage one, as timm LeViT), ``pretrained_cfg``,
    ``pretrained_cfg_overlay``.  Returns an :class:`~archspec.nn.model.ArchModel`, or timm's ``FeatureGetterNet``
    around one with ``features_only=True`` (a list of ``(B, C, H, W)`` maps).

    Raises:
        SpecError: a keyword argument makes the spec invalid (e.g. an ``img_size`` smaller than a mask window).
        ValueError: ``pretrained=True`` without a weight source in ``pretrained_cfg_overlay``.
        TypeError: an unknown keyword argument.
    """
    overlay = dict(pretrained_cfg_overlay or {})
    if pretrained and not any(overlay.get(key) for key in _WEIGHT_SOURCES):
        raise ValueError(f"{variant}: no pretrained weights are published for archspec models; create it with "
                         "pretrained=False, or load your own with "
                         "pretrained_cfg_overlay=dict(file='.../model.safetensors')"
                         ", timm.create_model(..., checkpoint_path=...) or archspec.load(build_dir)")
    kwargs.pop("cache_dir", None)
    n_stages = len(spec.stages)
    feature_cfg = {"feature_cls": "getter", "out_indices": 3 if n_stages == 1 else tuple(range(n_stages))}
    if isinstance(pretrained_cfg, str):  # a tag: archspec models have only the default one
        pretrained_cfg = None
    from archspec.nn.resample import resample_state_dict  # noqa: PLC0415 - import archspec stays torch-free; timm models are built on request

    model = build_model_with_cfg(
        _model_factory(spec), variant, pretrained, pretrained_cfg=pretrained_cfg or _default_cfg(spec),
        pretrained_cfg_overlay=overlay, feature_cfg=feature_cfg, pretrained_filter_fn=resample_state_dict, **kwargs)
    built = getattr(model, "spec", None)
    if built is not None:  # keep the data config true to the built model (img_size, in_chans, num_classes)
        model.pretrained_cfg = model.default_cfg = {
            **model.pretrained_cfg, "input_size": (built.input.channels, *built.input.resolution),
            "num_classes": built.head.num_classes}
    return model


def _entrypoint(name: str, source: Any):
    """A timm entrypoint named ``name`` building ``source`` (an ArchSpec, or a spec file read on each call)."""

    def entrypoint(pretrained: bool = False, **kwargs: Any):
        return create_timm_model(load_spec(source, check=False), name, pretrained=pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = f"archspec spec {source if isinstance(source, str) else source.name!r}; see create_timm_model."
    return entrypoint


def register(spec: Any, name: str | None = None, check: bool = True) -> str:
    """Register a spec (an :class:`~archspec.spec.ArchSpec`, path, YAML text, dict or shipped name) with timm.

    The spec is loaded and fully checked now; ``timm.create_model(name, ...)`` then compiles it (see
    :func:`create_timm_model`).  ``name`` defaults to ``archspec_<spec name>``; re-registering a name
    replaces it (timm warns when that name was taken by another model).  ``check=False`` skips the shape
    checks (they run anyway when the model is created).  Returns the name.

    Raises:
        SpecError: the spec is invalid.
        ValueError: ``name`` contains a '.' (timm reads what follows as a pretrained tag).
    """

    spec = load_spec(spec, check=check)
    return _register(name or PREFIX + spec.name, spec)


def _register(name: str, source: Any) -> str:
    if "." in name:
        raise ValueError(f"timm model names cannot contain '.', got {name!r}")
    register_model(_entrypoint(name, source))
    return name


def register_shipped() -> list[str]:
    """Register every shipped spec (``archspec list``) as ``archspec_<name>``; returns the names."""

    # Read on use, not now: parsing twelve specs would slow down every `import timm` (the suite checks them).
    return [_register(PREFIX + name, os.fspath(SPEC_DIR / f"{name}.yaml")) for name in shipped_specs()]


# Imported before timm, this module's own ``import timm`` fired the hook half-way through; register now.
register_if_deferred(register_shipped)
