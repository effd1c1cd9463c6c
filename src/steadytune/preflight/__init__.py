"""Preflight: go / no-go before a run starts, with the reason and the fix for every finding.

One module per family of checks, pure where possible: ``resources`` (device memory,
RAM, disk, other GPU users, writable folders), ``versions`` (driver, CUDA, packages,
known-bad combinations), ``lints`` (config values that are likely mistakes),
``dataset``/``datascan`` (defects in the training data), ``recommend`` (the micro-batch,
accumulation, sequence length and checkpointing that fit). ``probe`` reads the host;
``core`` runs everything; ``render`` and ``result`` present it. ``cache`` manages the
tokenized-data cache. See docs/preflight.md.
"""

from steadytune.preflight.core import run_preflight
from steadytune.preflight.result import Check, PreflightReport, Recommendation, from_json, to_json

__all__ = ["Check", "PreflightReport", "Recommendation", "from_json", "run_preflight", "to_json"]
