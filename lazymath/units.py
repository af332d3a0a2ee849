"""How lazymath prints sizes: one formatter for every layer (messages, tables, pictures)."""

from __future__ import annotations


def fmt_bytes(n: int) -> str:
    """`n` bytes in the largest binary unit it reaches, one decimal: 4.0 TiB, 12.0 KiB, 52 B."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
