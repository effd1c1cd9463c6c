"""A job's memory need per device: the estimator's peak from its config, or the user's value."""

from __future__ import annotations

from pathlib import Path

from steadytune.server.ledger import GIB


class NeedError(Exception):
    """The need cannot be known; the message says how to give it."""


def need_from_config(config: Path, overrides: list[str], gpus: int) -> tuple[int, str]:
    """The estimated peak bytes per device of a run config, and a one-line account of it.

    The config is read as ``steadytune run`` would read it (``key=value`` overrides
    applied), with ``gpus`` data-parallel devices sharing any sharded state.

    Raises:
        NeedError: the config or its model cannot be read; the message names the fix.
    """
    from steadytune.config import ConfigError
    from steadytune.config.load import apply_overrides
    from steadytune.estimate import (
        ArchitectureError,
        SetupError,
        estimate_peak,
        format_bytes,
        load_architecture,
        load_run_config,
        setup_from_config_dict,
    )

    try:
        data = apply_overrides(load_run_config(config), overrides)
        model, setup = setup_from_config_dict(data, gpus=gpus, device="cuda")
    except ConfigError as exc:
        raise NeedError(exc.render()) from exc
    except (SetupError, ValueError) as exc:
        raise NeedError(f"{config}: {exc}; or give the need with --need-gib") from exc
    if model is None:
        raise NeedError(f"{config}: no model.name_or_path to estimate from; give the need with --need-gib")
    path = Path(model).expanduser()
    if not path.is_absolute() and not path.exists():
        path = config.parent / path
    try:
        arch = load_architecture(str(path))
    except ArchitectureError as exc:
        raise NeedError(f"{exc}; or give the need with --need-gib") from exc
    peak = estimate_peak(arch, setup).peak_bytes
    return (
        peak,
        f"estimated peak {format_bytes(peak)} per device ({setup.method}, batch {setup.batch}, seq "
        f"{setup.seq})",
    )


def need_from_user(need_gib: float) -> tuple[int, str]:
    """The user's value, in GiB per device."""
    if not need_gib > 0:
        raise NeedError(f"--need-gib {need_gib}: give the peak memory per GPU in GiB, e.g. --need-gib 20")
    return int(need_gib * GIB), f"{need_gib:g} GiB per device, given by the user"
