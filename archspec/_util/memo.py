"""A bounded memo keyed by content: what the IR and the search keep of a spec, outside the spec.

A spec (:class:`archspec.spec.ArchSpec`) is a plain value: it carries nothing but its fields.  What is computed
from it -- its IR plan (:func:`archspec.ir.plan.build_plan`), a search candidate's proxy
(:mod:`archspec.search._evaluation.proxy`) -- is kept here, keyed on the spec's content
(``spec.model_dump_json()``) and the settings it was computed under, so two equal specs share it, a spec changed
in place misses it, and a copy or pickle of a spec finds it without carrying it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["ContentMemo"]


class ContentMemo:
    """The last ``size`` values by key (least recently used dropped first); safe to share between threads.

    A value is shared by every caller that finds it: read it, do not modify it.
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a memo holds at least one value, not {size}")
        self.size = size
        self._values: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value kept under ``key``, or ``None``."""
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> Any:
        """Keep ``value`` under ``key`` (dropping the least recently used beyond ``size``); returns ``value``."""
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every value."""
        with self._lock:
            self._values.clear()

    def __len__(self) -> int:
        return len(self._values)
