"""Byte quantities: binary and decimal units are kept apart."""

from __future__ import annotations

import pytest

from steadytune.estimate import format_bytes, parse_bytes
from steadytune.units import format_count


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 1024**3),
        ("24GB", 24 * 1000**3),
        ("512 MiB", 512 * 1024**2),
        ("16g", 16 * 1024**3),
        ("1.5e9", 1_500_000_000),
        ("1.5 GiB", int(1.5 * 1024**3)),
        (4096, 4096),
    ],
)
def test_parse(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "eighty", "80 GiBs", "-1GB", "80XB"])
def test_parse_rejects_with_the_value_and_the_units(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_bytes(text)
    assert repr(text) in str(info.value) and "GiB" in str(info.value)


def test_format() -> None:
    assert format_bytes(80 * 1024**3) == "80.0 GiB"
    assert format_bytes(1536 * 1024**2) == "1.50 GiB"
    assert format_bytes(512) == "512 B"


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (8_030_000_000, "8.03 B"),
        (124_440_000, "124.44 M"),
        (434_000, "0.43 M"),
        (12_500, "12.50 K"),
        (42, "42"),
    ],
)
def test_format_count_keeps_small_models_readable(count: int, expected: str) -> None:
    assert format_count(count) == expected
