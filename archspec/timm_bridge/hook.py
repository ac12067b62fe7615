"""The one-shot hook that registers the shipped specs with timm as soon as timm is imported (stdlib only).

``import archspec`` installs it (:func:`install`), so it must cost nothing: it imports neither the spec parser
nor torch nor timm.  When timm is imported -- before or after archspec -- the shipped specs become timm
models named ``archspec_<spec name>`` (:func:`archspec.timm_bridge.registry.register_shipped`, imported then).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from typing import Any

__all__ = ["install", "register_if_deferred"]

_REGISTRY = "archspec.timm_bridge.registry"  # imported when timm is: it needs the spec parser


_deferred = False  # the hook fired while the registry itself was importing timm; it registers at its end


def _register_shipped() -> None:
    global _deferred
    registry = sys.modules.get(_REGISTRY)
    if registry is not None and not hasattr(registry, "register_shipped"):
        # ``import archspec.timm_bridge.registry`` before timm: its own ``import timm`` fired the hook while it is
        # half-initialised; calling into it now fails, and the one-shot hook would never register the specs.
        _deferred = True
        return
    importlib.import_module(_REGISTRY).register_shipped()


def register_if_deferred(register_shipped: Any) -> None:
    """Called at the end of :mod:`archspec.timm_bridge.registry`'s import: register the shipped specs if the hook
    fired while that import was under way (it imported timm itself).  Raises nothing of its own."""
    global _deferred
    if _deferred:
        _deferred = False
        register_shipped()


class _RegisterAfterTimm:
    """One-shot post-import hook: lets timm import normally, then registers the shipped specs.  A meta path finder
    by protocol (``find_spec``), not by subclassing ``importlib.abc.MetaPathFinder``: that module pulls in
    ``importlib.resources``, a third of ``import archspec``'s time."""

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname != "timm":
            return None
        sys.meta_path.remove(self)

        found = importlib.util.find_spec("timm")
        if found is None or found.loader is None:
            return found
        exec_module = found.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            try:
                _register_shipped()
            except Exception as exc:  # never let archspec break `import timm`

                warnings.warn(f"archspec could not register its specs with timm: {exc}", RuntimeWarning, stacklevel=2)

        found.loader.exec_module = exec_then_register
        return found


def install() -> None:
    """Register the shipped specs with timm now if it is imported, else right after ``import timm``."""
    if "timm.models" in sys.modules:
        _register_shipped()
    elif not any(isinstance(finder, _RegisterAfterTimm) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterTimm())
