"""Numbers for people: counts of parameters and MACs in tables and messages (byte sizes: :mod:`.memory`)."""

from __future__ import annotations

__all__ = ["human", "make_divisible"]


def human(n: float, unit: str = "") -> str:
    """A count with a G/M/K suffix and two decimals: ``human(2_512_000_000, "MACs") -> '2.51GMACs'``."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= factor:
            return f"{n / factor:.2f}{suffix}{unit}"
    return f"{n:g}{unit}"


def make_divisible(v: float, divisor: int = 8) -> int:
    """timm ``layers.helpers.make_divisible(v, divisor, min_value=None, round_limit=.9)``: ``v`` rounded to the
    nearest multiple of ``divisor`` (at least ``divisor``), one more multiple where rounding lost over 10 %."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v
