"""Lazy public names (PEP 562) for archspec's packages.

A package lists its public names and the modules that define them; each module is imported on first
use, so ``import archspec`` -- and the command line's front door, ``archspec validate`` included --
never imports torch, timm or Optuna for a name it does not touch.  :func:`lazy_module` is the same idea for
one module a torch-free file calls only from its torch side (a head kind's torch half,
:mod:`archspec.families.attention.kinds`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["lazy_exports", "lazy_module", "LazyModule"]


def lazy_exports(package: str, exports: dict[str, str],
                 submodules: Iterable[str] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` pair of ``package``'s module (PEP 562).

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module defining it: absolute (``archspec.spec``), or a submodule of
            ``package`` when the name has no dot (``cmhsa``).
        submodules: submodules reachable as attributes before anything imported them.

    A name, once looked up, is stored in the package's namespace (later look-ups are plain attribute
    reads).  ``__getattr__`` raises ``AttributeError`` for any other name, as a module does.
    """
    submodules = tuple(submodules)

    def module_of(name: str) -> str:
        target = exports[name]
        return target if "." in target else f"{package}.{target}"

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name in exports:
            value = getattr(importlib.import_module(module_of(name)), name)
            vars(sys.modules[package])[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__


class LazyModule:
    """A stand-in for a module, imported on its first attribute read (``torch.zeros`` imports torch then).

    Unlike :class:`importlib.util.LazyLoader` it puts nothing in ``sys.modules`` before that read, so a front
    door that checks ``'torch' in sys.modules`` sees what was really imported.  Calls through it cost one
    attribute look-up more than a module-level import; ``torch.compile`` traces through it (Dynamo reads the
    module attribute it returns).
    """

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def __getattr__(self, attr: str) -> Any:
        module = object.__getattribute__(self, "_module")
        if module is None:
            module = importlib.import_module(object.__getattribute__(self, "_name"))
            object.__setattr__(self, "_module", module)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {object.__getattribute__(self, '_name')!r}>"


def lazy_module(name: str) -> Any:
    """A :class:`LazyModule` for ``name`` (absolute, e.g. ``"torch.nn.functional"``): module-level, so a file
    keeps its imports at the top (ruff's PLC0415) and still imports nothing heavy until a function that needs
    the module runs.  Raises ``ImportError`` (at that first read) when the module does not exist."""
    return LazyModule(name)
