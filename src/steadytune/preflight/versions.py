"""Driver, CUDA and package versions, and the combinations known not to work.

Versions come from ``importlib.metadata`` and from reading files of installed packages,
never from importing them: importing torch takes seconds and the supervisor must not
hold it. Four sources of "this will not work", each a plain table or rule:

* :data:`KNOWN_BAD`: combinations people hit that no package declares, with the reason;
* the requirements each installed package declares (``pip check`` for the training stack);
* minimum versions the installed transformers enforces at run time, read from its source;
* the NVIDIA driver against the CUDA version torch was built with.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from collections.abc import Callable
from dataclasses import dataclass

from steadytune.preflight.result import Check, fail, na, ok, warn
from steadytune.telemetry.envsnap import package_dir, torch_build

# The packages the built-in runner imports, in the order they are shown.
STACK = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "datasets", "tokenizers", "numpy")

# What each method (and attention implementation) cannot start without.
REQUIRED = {
    "full": ("torch", "transformers", "accelerate", "datasets"),
    "lora": ("torch", "transformers", "accelerate", "datasets", "peft"),
    "qlora": ("torch", "transformers", "accelerate", "datasets", "peft", "bitsandbytes"),
}


@dataclass(frozen=True)
class KnownBad:
    """Two version ranges that break together, and why (ranges are ``[low, high)``)."""

    package: str
    low: str | None
    high: str | None
    other: str
    other_low: str | None
    other_high: str | None
    reason: str
    fix: str


KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(
        "torch",
        None,
        "2.3",
        "numpy",
        "2",
        None,
        "torch wheels before 2.3 were compiled against NumPy 1.x; under NumPy 2 importing them fails with "
        "'A module that was compiled using NumPy 1.x cannot be run in NumPy 2'",
        "pip install 'numpy<2', or upgrade torch to 2.3 or newer",
    ),
    KnownBad(
        "datasets",
        None,
        "2.14.6",
        "fsspec",
        "2023.10.0",
        None,
        "datasets before 2.14.6 builds glob patterns that fsspec 2023.10 rejects: loading any data file "
        "fails "
        "with \"Invalid pattern: '**' can only be an entire path component\"",
        "pip install -U 'datasets>=2.14.6'",
    ),
)

# Minimums that the installed transformers checks at run time: (constant, file, package, when).
_TRANSFORMERS_MINIMUMS = (
    ("ACCELERATE_MIN_VERSION", "utils/import_utils.py", "accelerate", "all"),
    ("BITSANDBYTES_MIN_VERSION", "utils/import_utils.py", "bitsandbytes", "qlora"),
    ("MIN_PEFT_VERSION", "integrations/peft.py", "peft", "lora"),
)


def parse_version(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; pre-release and local parts are dropped."""
    out: list[int] = []
    for part in text.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() != len(part):
            break  # "0rc1": the release part ends here
    return tuple(out)


def in_range(version: str, low: str | None, high: str | None) -> bool:
    v = parse_version(version)
    return (low is None or v >= parse_version(low)) and (high is None or v < parse_version(high))


def installed_versions(names: tuple[str, ...] = STACK) -> dict[str, str | None]:
    """Installed distribution versions; None for a package that is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built with (``torch.version.cuda``), read from its file."""
    build = torch_build().get("cuda_build")
    return build if isinstance(build, str) and build else None


def transformers_minimums() -> dict[str, tuple[str, str]]:
    """``{package: (minimum, when)}`` as the installed transformers enforces them."""
    folder = package_dir("transformers")
    out: dict[str, tuple[str, str]] = {}
    if folder is None:
        return out
    for const, rel, package, when in _TRANSFORMERS_MINIMUMS:
        try:
            text = (folder / rel).read_text(encoding="utf-8")
        except OSError:
            continue
        m = re.search(rf"^{const}\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if m:
            out[package] = (m.group(1), when)
    return out


def declared_conflicts(
    names: tuple[str, ...] = STACK, requires: Callable[[str], list[str] | None] = md.requires
) -> list[str]:
    """Requirements the training stack declares that the installed versions break."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # pragma: no cover - packaging ships with every pip
        return []
    out: list[str] = []
    for name in names:
        try:
            lines = requires(name) or []
        except md.PackageNotFoundError:
            continue
        for line in lines:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an optional extra or another platform
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                continue  # a missing dependency shows up as a missing package where it matters
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                out.append(f"{name} requires {req.name}{req.specifier}, installed {have}")
    return out


@dataclass(frozen=True)
class Driver:
    """What NVML says about the driver; all None without NVML."""

    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the newest CUDA the driver supports, e.g. "12.4"
    gpu_count: int = 0


def version_checks(
    method: str,
    attn: str,
    versions: dict[str, str | None],
    driver: Driver,
    torch_cuda: str | None,
    minimums: dict[str, tuple[str, str]],
    conflicts: list[str],
    extra: dict[str, str | None] | None = None,
) -> list[Check]:
    """Judge the versions (pure: every reading is passed in)."""
    f = "versions"
    out: list[Check] = []
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    out.append(ok(f, "stack", shown or "no training packages found", **{k: v for k, v in versions.items()}))

    needed = list(REQUIRED.get(method, REQUIRED["full"]))
    if attn == "flash_attention_2":
        needed.append("flash_attn")
    everything = {**versions, **(extra or {})}
    missing = [p for p in needed if not everything.get(p)]
    if missing:
        out.append(
            fail(
                f,
                "required_packages",
                f"method {method} needs {', '.join(missing)}, not installed",
                "pip install 'steadytune[train]'" + (" flash-attn" if "flash_attn" in missing else ""),
            )
        )

    for rule in KNOWN_BAD:
        a, b = everything.get(rule.package), everything.get(rule.other)
        if a and b and in_range(a, rule.low, rule.high) and in_range(b, rule.other_low, rule.other_high):
            out.append(
                fail(f, "known_bad", f"{rule.package} {a} with {rule.other} {b}: {rule.reason}", rule.fix)
            )

    for package, (minimum, when) in minimums.items():
        have = versions.get(package)
        if not have or parse_version(have) >= parse_version(minimum):
            continue
        tv = versions.get("transformers")
        if when == "all" or (when == "qlora" and method == "qlora"):
            out.append(
                fail(
                    f,
                    "transformers_minimum",
                    f"transformers {tv} refuses {package} {have} (needs >= {minimum})",
                    f"pip install -U '{package}>={minimum}'",
                )
            )
        elif when == "lora" and method in ("lora", "qlora"):
            # steadytune's LoRA path calls peft directly, so training works; transformers' own
            # adapter API (model.load_adapter / add_adapter) on the result does not.
            out.append(
                warn(
                    f,
                    "transformers_minimum",
                    f"transformers {tv} wants {package} >= {minimum} for model.load_adapter/add_adapter; "
                    f"installed {have}. Training works, loading the adapter through transformers fails",
                    f"pip install -U '{package}>={minimum}'",
                )
            )
    for text in conflicts:
        out.append(
            warn(f, "declared_requirement", text, "reinstall so the declared requirements hold (pip check)")
        )

    out.append(_driver_check(driver, torch_cuda))
    return out


def _driver_check(driver: Driver, torch_cuda: str | None) -> Check:
    f = "versions"
    if driver.driver_version is None:
        if torch_cuda:
            return na(
                f,
                "driver",
                f"torch is built for CUDA {torch_cuda}; no NVIDIA driver readable (NVML)",
                "install nvidia-ml-py to check the driver (steadytune[gpu])",
            )
        return na(f, "driver", "no NVIDIA driver (CPU-only machine)")
    if torch_cuda is None:
        if driver.gpu_count:
            return warn(
                f,
                "driver",
                f"{driver.gpu_count} GPU(s) with driver {driver.driver_version}, but torch is a "
                "CPU build: the run would train on the CPU",
                "install a CUDA build of torch (https://pytorch.org/get-started/locally/)",
            )
        return ok(f, "driver", f"driver {driver.driver_version}; torch is a CPU build")
    have = parse_version(driver.cuda_driver_version or "0")
    need = parse_version(torch_cuda)
    text = (
        f"driver {driver.driver_version} supports CUDA {driver.cuda_driver_version}; torch built for "
        f"CUDA {torch_cuda}"
    )
    if have[:1] < need[:1]:
        return fail(
            f,
            "driver",
            text + ": the driver is too old for this major CUDA version",
            f"upgrade the NVIDIA driver to one that supports CUDA {torch_cuda}, or install a torch "
            f"build for CUDA {driver.cuda_driver_version}",
        )
    if have[:2] < need[:2]:
        # CUDA minor-version compatibility runs most kernels; JIT-compiled PTX may still fail.
        return warn(
            f,
            "driver",
            text + ": runs under minor-version compatibility; PTX JIT kernels may fail",
            f"upgrade the driver to one that supports CUDA {torch_cuda}",
        )
    return ok(f, "driver", text)
