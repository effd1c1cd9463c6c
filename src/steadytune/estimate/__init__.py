"""Memory estimation before launch: will this run fit, why, and what to change.

The public API is pure and torch-free (``measure`` is the only module that imports
torch, and only when called)::

    arch = load_architecture("examples/models/llama-3.1-8b")
    setup = TrainSetup(method="lora", dtype="bf16", batch=1, seq=2048)
    estimate_peak(arch, setup).peak_bytes
    max_micro_batch(arch, setup, parse_bytes("80GiB"))
"""

from steadytune.estimate.arch import (
    Architecture,
    ArchitectureError,
    architecture_from_dict,
    load_architecture,
)
from steadytune.estimate.limits import Suggestion, max_micro_batch, max_seq_len, suggestions
from steadytune.estimate.memory import COMPONENTS, MemoryEstimate, estimate_peak
from steadytune.estimate.runconfig import load_run_config, setup_from_config_dict
from steadytune.estimate.setup import SetupError, TrainSetup
from steadytune.units import format_bytes, parse_bytes

__all__ = [
    "COMPONENTS",
    "Architecture",
    "ArchitectureError",
    "MemoryEstimate",
    "SetupError",
    "Suggestion",
    "TrainSetup",
    "architecture_from_dict",
    "estimate_peak",
    "format_bytes",
    "load_architecture",
    "load_run_config",
    "max_micro_batch",
    "max_seq_len",
    "parse_bytes",
    "setup_from_config_dict",
    "suggestions",
]
