"""Byte quantities as people write them: ``80GiB``, ``24GB``, ``512 MiB``, ``1.5e9``.

Binary (``KiB``, ``MiB``, ``GiB``, ``TiB``) and decimal (``KB``, ``MB``, ``GB``, ``TB``)
units are both accepted and kept apart, because GPU vendors sell "80GB" cards that
``torch.cuda.get_device_properties`` reports as 79.2 GiB, and mixing the two is the
classic way to be off by 7%.
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    # The one-letter forms follow `nvidia-smi`/`free -h`, which mean binary units.
    "k": KiB,
    "m": MiB,
    "g": GiB,
    "t": TiB,
}

_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Parse a byte quantity.

    Args:
        text: ``"80GiB"``, ``"24GB"``, ``"512 MiB"``, ``"16g"`` or a plain number of bytes.

    Returns:
        The number of bytes, rounded down to an integer.

    Raises:
        ValueError: the text is not a non-negative quantity with a known unit; the message
            names the value and the accepted units.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"memory size must not be negative, got {text!r}")
        return int(text)
    match = _PATTERN.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a memory size; write a number with a unit such as "
            "80GiB, 24GB, 512MiB (binary: KiB MiB GiB TiB; decimal: KB MB GB TB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: int | float) -> str:
    """Render bytes in binary units with three significant digits, e.g. ``"17.6 GiB"``."""
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= size:
            scaled = value / size
            digits = 2 if scaled < 10 else 1 if scaled < 100 else 0
            return f"{sign}{scaled:.{digits}f} {unit}"
    return f"{sign}{int(value)} B"


def format_count(n: int | float) -> str:
    """Render a count of parameters with two decimals, e.g. ``"8.03 B"``, ``"124.44 M"``.

    A model under a million parameters is still written in millions down to 0.1 M (``"0.43 M"``),
    where "0.00 B" would read as an empty model; smaller counts fall to thousands, then units.
    """
    value = float(n)
    for unit, size, floor in (("B", 1e9, 1e9), ("M", 1e6, 1e5), ("K", 1e3, 1e2)):
        if abs(value) >= floor:
            return f"{value / size:.2f} {unit}"
    return f"{int(value)}"
