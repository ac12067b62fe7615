"""Lazy public names (PEP 562) for archspec's packages.

A package lists its public names and the modules that define them; each module is imported on first
use, so ``import archspec`` -- and the command line's front door, ``archspec validate`` included --
never imports torch, timm or Optuna for a name it does not touch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["lazy_exports"]


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
