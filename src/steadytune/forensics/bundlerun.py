"""What a repro bundle points at: its run, its config with the paths it can use, its checkpoint and
its samples; and the refusal of code a stranger's bundle would run."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from steadytune.checkpoint.manifest import inside
from steadytune.config.yamlsafe import read_yaml
from steadytune.forensics.unpack import UnsafeBundle
from steadytune.telemetry.jsonl import JsonlReader


def included_checkpoint(folder: Path, meta: dict[str, Any]) -> Path | None:
    """The folder of the checkpoint copied into the bundle (``checkpoint/<name>``), if any."""
    ref = meta.get("checkpoint")
    if not isinstance(ref, dict):
        return None
    name = ref.get("name")
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise UnsafeBundle(f"bundle.json names the checkpoint {name!r}, which is not a folder name")
    path = folder / "checkpoint" / name
    return path if path.is_dir() and inside(path, folder) else None


def guard_code(folder: Path, meta: dict[str, Any], cfg: Any, trust_remote_code: bool = False) -> None:
    """Refuse what would run code that came with the bundle; set ``cfg.model.trust_remote_code``.

    A bundle is meant to be attached to a bug report, so its config is not trusted:
    ``trust_remote_code`` stays off unless the person checking asks for it, and a
    model path inside the bundle (a relative path resolves against its folder) is
    accepted only for the checkpoint the bundle includes. Torch-free.

    Raises:
        UnsafeBundle: with what was refused and how to proceed.
    """
    if cfg.model.trust_remote_code and not trust_remote_code:
        raise UnsafeBundle(
            "the bundle's config.yaml sets model.trust_remote_code: true, which lets the model folder "
            "run its own Python code; repro --check does not do that for a bundle unless you pass "
            "--trust-remote-code (only for a bundle and a model you trust)"
        )
    cfg.model.trust_remote_code = bool(trust_remote_code and cfg.model.trust_remote_code)
    model = Path(cfg.model.name_or_path).expanduser()
    if model.exists() and inside(model, folder):
        allowed = included_checkpoint(folder, meta)
        if allowed is None or os.path.realpath(model) != os.path.realpath(allowed):
            raise UnsafeBundle(
                f"the bundle's config.yaml points model.name_or_path at {cfg.model.name_or_path!r}, a folder "
                "inside the bundle; a bundle carries no model (only its included checkpoint is loaded from "
                "it): pass --model PATH to use a model folder of your own"
            )


REDACTED = "<abs>"  # what a redacted bundle writes for an absolute path outside the run and home


def _redacted(value: Any) -> bool:
    return isinstance(value, str) and REDACTED in value


def _shown(value: str) -> str:
    """A redacted path as the bundle wrote it (the config loader put the bundle's folder before it)."""
    return value[value.index(REDACTED) :] if REDACTED in value else value


def locate_run(meta: dict[str, Any], bundle: Path | None, run: Path | None) -> Path | None:
    """The run directory a bundle came from: ``run`` when given, else the folder the bundle still
    sits in (``bundle.json`` says where in its run it was written), when that folder is named
    after the bundle's run and has a ``config.yaml``."""
    if run is not None:
        return Path(run)
    rel = meta.get("bundle_in_run")
    if bundle is None or not isinstance(rel, str) or not rel:
        return None
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or ".." in parts:
        return None
    here = Path(os.path.abspath(bundle)).parts
    if len(here) <= len(parts) or tuple(here[-len(parts) :]) != parts:
        return None
    root = Path(*here[: -len(parts)])
    return root if root.name == meta.get("run_id") and (root / "config.yaml").is_file() else None


def _run_paths(run: Path | None) -> dict[str, Any]:
    """The model and data paths of the run's own (unredacted) config, where there is one."""
    if run is None:
        return {}
    try:
        data = read_yaml(Path(run) / "config.yaml")
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    model, dataset = data.get("model") or {}, data.get("data") or {}
    return {
        "model": model.get("name_or_path") if isinstance(model, dict) else None,
        "data": dataset.get("train_file") if isinstance(dataset, dict) else None,
    }


_ELSEWHERE = "or check the bundle next to its run: steadytune repro --check BUNDLE RUN"


def prepare(
    folder: Path,
    model: Path | None = None,
    trust_remote_code: bool = False,
    run: Path | None = None,
    data: Path | None = None,
) -> tuple[Any, Any]:
    """``(bundle.json, validated config)`` of an unpacked bundle, checked by :func:`guard_code`. Torch-free.

    Paths a bundle redacted are taken from ``model``, the bundle's included checkpoint
    (a full fine-tune's holds the model and tokenizer) or the config of ``run``; a
    redacted path nothing replaces is an error that says what to pass.
    """
    from steadytune.forensics.runview import training_config

    meta = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or not isinstance(meta.get("replay"), list) or not meta["replay"]:
        raise ValueError("bundle.json lists no step to replay: not a steadytune repro bundle")
    cfg = training_config(folder / "config.yaml")
    theirs = _run_paths(run)
    if model is not None:
        cfg.model.name_or_path = str(Path(model).expanduser().resolve())  # the user's own choice
    elif _redacted(cfg.model.name_or_path):
        included = included_checkpoint(folder, meta)
        if theirs.get("model"):
            cfg.model.name_or_path = str(theirs["model"])
        elif included is not None and cfg.method == "full":
            cfg.model.name_or_path = str(included)
        else:
            raise ValueError(
                f"the bundle's model path is redacted ({_shown(cfg.model.name_or_path)}): pass --model PATH, "
                + _ELSEWHERE
            )
    if data is None and not (folder / "data" / "samples.jsonl").exists() and _redacted(cfg.data.train_file):
        if not theirs.get("data"):
            raise ValueError(
                f"the bundle's dataset path is redacted ({_shown(cfg.data.train_file)}): pass --data PATH, "
                + _ELSEWHERE
            )
        cfg.data.train_file = str(theirs["data"])
    guard_code(folder, meta, cfg, trust_remote_code)
    return meta, cfg


def resolve_checkpoint(
    folder: Path, meta: dict[str, Any], override: Path | None, run: Path | None = None
) -> Path | None:
    """The checkpoint to start from: ``override``, the bundle's copy, or the one it names (a
    redacted bundle names it relative to its run), checked against the recorded manifest hash."""
    from steadytune.checkpoint.manifest import MANIFEST, sha256_file, verify

    ref = meta.get("checkpoint")
    if ref is None:
        return None
    path = override or included_checkpoint(folder, meta)
    if path is None:
        named = str(ref.get("path") or "")
        if named.startswith("/"):
            path = Path(named)  # an unredacted bundle
        elif run is None or not named or _redacted(named) or ".." in PurePosixPath(named).parts:
            raise FileNotFoundError(
                f"the bundle names its checkpoint relative to its run ({named or ref.get('name')}): pass "
                "--checkpoint PATH, " + _ELSEWHERE + ", or make the bundle with --include-checkpoint"
            )
        else:
            path = Path(run) / named
    if not (path / MANIFEST).exists():
        raise FileNotFoundError(
            f"checkpoint {path} is not there; pass --checkpoint PATH or make the bundle with "
            "--include-checkpoint"
        )
    if sha256_file(path / MANIFEST) != ref["manifest_sha256"]:
        raise ValueError(f"{path} is not the checkpoint the bundle names (its MANIFEST.json sha256 differs)")
    v = verify(path)
    if not v.ok:
        raise ValueError(f"checkpoint {path} does not verify: {v.reason}")
    return path


def bundle_rows(
    folder: Path, meta: dict[str, Any], cfg: Any, override: Path | None
) -> dict[int, dict[str, Any]]:
    from steadytune.forensics.inspect import fetch_rows

    wanted = {i for s in meta["replay"] for i in s["indices"]}
    included = folder / "data" / "samples.jsonl"
    if override is None and included.exists():
        rows = {}
        for n, obj in JsonlReader(included).values(final=True):
            try:
                rows[int(obj["st_sample_id"])] = obj["row"]
            except (TypeError, KeyError, ValueError) as e:
                raise ValueError(
                    f"{included} line {n} is not a sample of the bundle "
                    "({'st_sample_id': N, 'row': {...}}): the bundle is damaged; pass --data PATH to read "
                    "the samples from the dataset"
                ) from e
        return rows
    path = override or cfg.data.train_file
    if _redacted(str(path)):
        raise ValueError(f"the bundle's dataset path is redacted ({_shown(str(path))}): pass --data PATH")
    rows, _ = fetch_rows(path, wanted)
    return rows
