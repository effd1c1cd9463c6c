"""Whether a checkpoint another tool wrote is whole enough to resume from.

With a steadytune manifest, the manifest decides. Otherwise: trainer_state.json
parses and names the step, and the weights are whole: a safetensors file is
exactly as long as its header says, and every shard its index names is there and
whole, which catches a save killed midway.
"""

from __future__ import annotations

import json
from pathlib import Path

from steadytune.checkpoint.manifest import MANIFEST, checkpoint_step, list_checkpoints, verify
from steadytune.regularfile import open_regular, read_text

_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not whole, or None: its header must parse and its size must be
    exactly the header plus the end of the last tensor (a save killed midway leaves it short)."""
    try:
        size = path.stat().st_size
        with open_regular(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > size - 8:
                return f"{path.name}: header length {n} does not fit in {size} bytes"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"{path.name}: unreadable header ({type(e).__name__})"
    ends = [
        int(t["data_offsets"][1])
        for k, t in header.items()
        if k != "__metadata__" and isinstance(t, dict) and "data_offsets" in t
    ]
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        return f"{path.name}: {size} bytes, the header describes {expected} (the file was cut short)"
    return None


def _shards(ckpt: Path) -> tuple[list[Path], str | None]:
    """The shard files an index (``*.safetensors.index.json``) names, and a problem if one is missing."""
    files: list[Path] = []
    for index in ckpt.glob("*.safetensors.index.json"):
        try:
            names = sorted(set(json.loads(read_text(index))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return [], f"{index.name} unreadable"
        for name in names:
            shard = ckpt / name
            if Path(name).name != name or not shard.is_file():
                return [], f"{index.name} names {name}, which is missing"
            files.append(shard)
    return files, None


def check_external_checkpoint(ckpt: Path) -> tuple[bool, str]:
    """Whether a checkpoint another tool wrote is complete enough to resume from.

    With a steadytune manifest, the manifest decides. Otherwise: trainer_state.json
    parses and names this step, and the weights file is there, non-empty and (for
    safetensors) has a readable header — the checks that catch a save killed midway.
    """
    if (ckpt / MANIFEST).exists():
        v = verify(ckpt)
        return v.ok, v.reason
    try:
        state = json.loads(read_text(ckpt / "trainer_state.json"))
    except (OSError, ValueError):
        return False, "trainer_state.json missing or unreadable (save did not finish)"
    step = checkpoint_step(ckpt)
    if step is not None and state.get("global_step") not in (None, step):
        return False, f"trainer_state.json says step {state.get('global_step')}, folder says {step}"
    weights = [ckpt / w for w in _WEIGHTS if (ckpt / w).exists()]
    shards, problem = _shards(ckpt)
    if problem:
        return False, problem
    shards += [p for p in ckpt.glob("model-*-of-*.safetensors") if p not in shards]
    if not weights and not shards:
        return False, "no model or adapter weights"
    for w in [*weights, *shards]:
        if w.stat().st_size == 0:
            return False, f"{w.name} is empty"
        if w.suffix == ".safetensors" and (why := safetensors_problem(w)):
            return False, why
    return True, ""


def newest_complete(output_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    skipped: list[tuple[Path, str]] = []
    for ckpt in list_checkpoints(output_dir):
        ok, reason = check_external_checkpoint(ckpt)
        if ok:
            return ckpt, skipped
        skipped.append((ckpt, reason))
    return None, skipped
