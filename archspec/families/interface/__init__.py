"""The map-to-token interface of a hybrid (conv stages, then attention stages): torch-free :mod:`.rules`, the
module in :mod:`.module`."""

from __future__ import annotations
