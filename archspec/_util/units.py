"""Numbers for people: counts of parameters and MACs in tables and messages (byte sizes: :mod:`.memory`)."""

from __future__ import annotations

__all__ = ["human"]


def human(n: float, unit: str = "") -> str:
    """A count with a G/M/K suffix and two decimals: ``human(2_512_000_000, "MACs") -> '2.51GMACs'``."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.2f}{suffix}{unit}"
    return f"{n:g}{unit}"
