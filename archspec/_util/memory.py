"""Static memory estimates: the unit every family's ``rules.memory`` returns, and byte sizes for users.

Each block family's ``rules.py`` estimates its node's memory from shapes alone (no tensor is allocated);
:mod:`archspec.ir.plan` adds them up by the rule stated in its docstring.  Every figure is in **bytes**,
for **one image** in float32 (4 bytes per element; index tables are int64, masks bool), as a
:class:`NodeMemory`:

``act``      peak bytes of the activations alive at once while the node runs in inference, the
             node's input included (held by the caller until the node returns);
``saved``    bytes of every intermediate the node creates -- an upper bound of what autograd keeps
             for the backward pass when training;
``buffers``  persistent non-parameter tensors the node's module holds: relative-position index
             tables, mask tables, and the constant attention-bias / mask caches built by the first
             eval-mode forward (they scale with N^2 and can dominate at large grids).

The families' phases follow the modules' forward code and timm's LeViT; where a phase's exact count
depends on the kernel, the larger count is taken (conservative).  The tests
compare against the bytes of the tensors a ``TorchDispatchMode`` sees alive at once
(tests/test_memory.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from archspec.errors import SpecError

F32 = 4    # bytes per float32 element
I64 = 8    # bytes per int64 index
BOOL = 1   # bytes per bool mask entry


@dataclass(frozen=True)
class NodeMemory:
    """Bytes of one node for one image: ``act`` inference peak, ``saved`` training intermediates, ``buffers``."""

    act: int = 0
    saved: int = 0
    buffers: int = 0


def format_bytes(n: float) -> str:
    """``49_392_123_904 -> '46.0 GiB'`` (binary units, as the ``--max-memory`` option reads them)."""
    for factor, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= factor:
            return f"{n / factor:.1f} {suffix}"
    return f"{n:.0f} B"


_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_memory(text: str | int | float, option: str = "--max-memory") -> int:
    """``"32G" -> 32 GiB`` in bytes.  Suffixes K, M, G, T (optionally followed by ``B`` or ``iB``) are
    binary (powers of 1024, as ``docker -m`` and ``free`` read them); a bare number is bytes.

    Raises:
        SpecError: unreadable, non-finite, zero or negative (located at ``option``).
    """


    hint = "write a size such as 8G, 32G, 512M or 1.5T (binary units: 1G = 2^30 bytes)"
    if isinstance(text, bool):
        raise SpecError.single((option,), f"expected a memory size, got {text!r}", hint)
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
        if not match:
            raise SpecError.single((option,), f"cannot read {text!r} as a memory size", hint)
        value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise SpecError.single((option,), f"a memory limit must be a positive size, got {text!r}", hint)
    return int(value)
