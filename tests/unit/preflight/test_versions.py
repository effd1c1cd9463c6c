"""Versions: parsing, the known-bad table, transformers' own minimums, the driver rule."""

from __future__ import annotations

import pytest

from steadytune.preflight.versions import (
    KNOWN_BAD,
    Driver,
    declared_conflicts,
    in_range,
    parse_version,
    version_checks,
)
from tests.fresh import fresh_imports

GOOD = {
    "torch": "2.5.1",
    "transformers": "5.0.0",
    "peft": "0.22.0",
    "bitsandbytes": "0.47.0",
    "accelerate": "1.2.0",
    "datasets": "3.0.0",
    "numpy": "2.1.0",
}
MINIMUMS = {"accelerate": ("1.1.0", "all"), "bitsandbytes": ("0.46.1", "qlora"), "peft": ("0.22.0", "lora")}


def checks(
    method: str = "lora",
    versions: dict | None = None,
    driver: Driver | None = None,
    cuda: str | None = None,
    attn: str = "sdpa",
    extra: dict | None = None,
):
    return version_checks(method, attn, versions or GOOD, driver or Driver(), cuda, MINIMUMS, [], extra)


def by_name(found, name):
    return [c for c in found if c.name == name]


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("2.13.0+cpu", (2, 13, 0)),
        ("0.22.0.dev0", (0, 22, 0)),
        ("2.4.0rc1", (2, 4, 0)),
        ("12.4", (12, 4)),
        ("2023.10.0", (2023, 10, 0)),
    ],
)
def test_parse_version(text: str, parsed: tuple) -> None:
    assert parse_version(text) == parsed


def test_in_range_is_half_open() -> None:
    assert in_range("2.2.9", None, "2.3") and not in_range("2.3.0", None, "2.3")
    assert in_range("2.0.0", "2", None) and not in_range("1.26.4", "2", None)


def test_every_known_bad_entry_says_why_and_how_to_fix() -> None:
    for rule in KNOWN_BAD:
        assert len(rule.reason) > 40 and rule.fix
        assert rule.high or rule.low  # a range, not "every version"


def test_a_good_stack_has_no_findings() -> None:
    found = checks()
    assert [c.status for c in found if c.name != "driver"] == ["ok"]
    assert by_name(found, "driver")[0].status == "na"


def test_old_torch_with_numpy_2_is_a_no_go() -> None:
    found = by_name(checks(versions={**GOOD, "torch": "2.2.2", "numpy": "2.0.1"}), "known_bad")
    assert len(found) == 1 and found[0].status == "fail"
    assert "NumPy 1.x" in found[0].reason and "numpy<2" in found[0].fix


def test_old_datasets_with_new_fsspec_is_a_no_go() -> None:
    found = by_name(
        checks(extra={"fsspec": "2023.10.0"}, versions={**GOOD, "datasets": "2.14.5"}), "known_bad"
    )
    assert found and "Invalid pattern" in found[0].reason


def test_qlora_without_bitsandbytes_fails_and_names_the_package() -> None:
    found = by_name(checks("qlora", {**GOOD, "bitsandbytes": None}), "required_packages")
    assert found[0].status == "fail" and "bitsandbytes" in found[0].reason


def test_flash_attention_needs_flash_attn() -> None:
    found = by_name(checks(attn="flash_attention_2"), "required_packages")
    assert found and "flash_attn" in found[0].reason
    assert not by_name(checks(attn="flash_attention_2", extra={"flash_attn": "2.7.0"}), "required_packages")


def test_transformers_minimums_fail_or_warn_by_what_they_break() -> None:
    accel = by_name(checks(versions={**GOOD, "accelerate": "1.0.0"}), "transformers_minimum")
    assert accel[0].status == "fail"  # transformers refuses to train
    bnb_full = by_name(checks("full", {**GOOD, "bitsandbytes": "0.45.0"}), "transformers_minimum")
    assert bnb_full == []  # only QLoRA loads through bitsandbytes
    bnb = by_name(checks("qlora", {**GOOD, "bitsandbytes": "0.45.0"}), "transformers_minimum")
    assert bnb[0].status == "fail"
    peft = by_name(checks("lora", {**GOOD, "peft": "0.21.2"}), "transformers_minimum")
    assert peft[0].status == "warn" and "load_adapter" in peft[0].reason  # training itself works


def test_driver_rule() -> None:
    old_major = by_name(checks(driver=Driver("470.57", "11.4", 1), cuda="12.1"), "driver")[0]
    assert old_major.status == "fail" and "too old" in old_major.reason
    old_minor = by_name(checks(driver=Driver("530.30", "12.1", 1), cuda="12.4"), "driver")[0]
    assert old_minor.status == "warn" and "minor-version" in old_minor.reason
    fine = by_name(checks(driver=Driver("550.54", "12.4", 1), cuda="12.1"), "driver")[0]
    assert fine.status == "ok"
    cpu_torch = by_name(checks(driver=Driver("550.54", "12.4", 2)), "driver")[0]
    assert cpu_torch.status == "warn" and "CPU build" in cpu_torch.reason
    no_gpu = by_name(checks(), "driver")[0]
    assert no_gpu.status == "na"


def test_declared_conflicts_reads_requirements_without_extras() -> None:
    fake = {"pkg": ["numpy<1.0", "numpy>=0.1", "torch>=99; extra == 'x'", "not-installed-anywhere>=1"]}
    found = declared_conflicts(("pkg",), requires=lambda name: fake[name])
    assert len(found) == 1 and found[0].startswith("pkg requires numpy<1.0")


def test_readers_work_on_this_environment_without_importing_torch() -> None:
    code = (
        "from steadytune.preflight.versions import installed_versions, torch_cuda_build, "
        "transformers_minimums\n"
        "versions = installed_versions()\n"
        "assert versions['numpy']\n"
        "torch_cuda_build()\n"
        "minimums = transformers_minimums()\n"
        "assert not versions.get('transformers') or 'accelerate' in minimums, minimums\n"
    )
    assert fresh_imports(code) == []  # a fresh interpreter: see tests/fresh.py
