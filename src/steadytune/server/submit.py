"""A submission: from the client's request to a queue row with its memory need.

Everything wrong with a request is said at once, with the key, the value and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steadytune.regularfile import not_a_file
from steadytune.server.ledger import GIB
from steadytune.server.need import NeedError, need_from_config, need_from_user
from steadytune.server.queue import Job, JobQueue


class SubmitError(Exception):
    """The request cannot be queued; the message lists every reason."""


def _label(req: dict[str, Any]) -> str:
    if req.get("kind") == "run" and req.get("config"):
        return Path(str(req["config"])).stem
    cmd = req.get("cmd") or []
    return Path(str(cmd[0])).name if cmd else "job"


def check_request(req: dict[str, Any]) -> list[str]:
    """The problems of a submit request, all of them (empty when it is fine)."""
    problems = []
    kind = req.get("kind")
    if kind not in ("run", "supervise"):
        problems.append(f"kind={kind!r}: 'run' (a config) or 'supervise' (a command after --)")
    if kind == "run" and not req.get("config"):
        problems.append("a run job needs its config: steadytune submit CONFIG.yaml")
    if kind == "supervise" and not (isinstance(req.get("cmd"), list) and req["cmd"]):
        problems.append("a command job needs the command after --: steadytune submit --need-gib 20 -- CMD")
    problems += _shape_problems(req)
    gpus = req.get("gpus")
    if gpus is not None and (
        not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= MAX_GPUS
    ):
        problems.append(
            f"gpus={_short(gpus)}: give a whole number of GPUs from 1 to {MAX_GPUS}, e.g. --gpus 2"
        )
    prio = req.get("priority", 0)
    if not isinstance(prio, int) or isinstance(prio, bool) or abs(prio) > MAX_PRIORITY:
        problems.append(
            f"priority={_short(prio)}: give a whole number within ±{MAX_PRIORITY} (higher starts first), "
            "e.g. --priority 5"
        )
    cap = req.get("memory_cap_gib")
    if cap is not None and not _gib(cap):
        problems.append(
            f"memory_cap_gib={_short(cap)}: give the cap per GPU in GiB, e.g. --memory-cap-gib 20"
        )
    need = req.get("need_gib")
    if need is not None and not _gib(need):
        problems.append(f"need_gib={_short(need)}: give the peak memory per GPU in GiB, e.g. --need-gib 20")
    probe = req.get("probe_s")
    if probe is not None and (
        not isinstance(probe, (int, float)) or isinstance(probe, bool) or not 5 <= probe <= 3600
    ):
        problems.append(f"probe_s={probe!r}: give the probe's bound in seconds, 5 to 3600, e.g. --probe-s 60")
    probed = kind == "supervise" and need is None and not req.get("config")
    if probed and isinstance(gpus, int) and gpus > 1:
        problems.append(
            f"gpus={gpus}: a command without --need-gib is measured by a probe on one GPU; "
            "give its peak per GPU with --need-gib N"
        )
    if probe is not None and not probed:
        problems.append("--probe-s is for a command without --need-gib or --config (its need is measured)")
    cfg = req.get("config")
    if cfg and isinstance(cfg, str) and not _is_file(cfg):
        problems.append(f"config {_short(cfg)} {not_a_file(cfg)} (paths are read on the server's machine)")
    return problems


# What a request may carry, field by field: a client is anyone who can reach the socket, and a
# value of the wrong shape must be a refusal that names it, not an exception in the daemon.
MAX_GPUS = 1024
MAX_PRIORITY = 2**31
MAX_GIB = 1 << 20
_STR_LISTS = ("cmd", "overrides", "supervise_args")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _gib(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_GIB


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long, a NUL in it
        return False


def _shape_problems(req: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("config", "cwd", "label"):
        if req.get(key) is not None and not isinstance(req[key], str):
            problems.append(f"{key}={_short(req[key])}: give a string")
    for key in _STR_LISTS:
        value = req.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"{key}={_short(value)}: give a list of strings")
    env = req.get("env")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        problems.append("env: give an object of strings (the submitter's environment)")
    return problems


def submit(queue: JobQueue, req: dict[str, Any], user: str = "") -> Job:
    """Validate ``req``, find its need (the user's value, else the estimator's), and queue it.

    Raises:
        SubmitError: every problem at once.
    """
    problems = check_request(req)
    if problems:
        raise SubmitError("; ".join(problems))
    overrides = [str(o) for o in req.get("overrides") or []]
    config = Path(str(req["config"])) if req.get("config") else None
    gpus = req.get("gpus")
    min_gpus = None
    if req["kind"] == "run" and config is not None:
        gpus, min_gpus = _gpus_of_run(config, overrides, gpus)
    gpus = int(gpus or 1)
    try:
        if req.get("need_gib") is not None:
            need, why = need_from_user(float(req["need_gib"]))
            source = "user"
        elif config is None:
            # A command alone has nothing to estimate from: the server measures it (server/probe.py).
            need, why, source = 0, "to be measured by a probe", "probe"
        else:
            assert config is not None
            need, why = need_from_config(config, overrides, gpus)
            source = "estimate"
    except NeedError as exc:
        raise SubmitError(str(exc)) from exc
    spec = {
        "kind": req["kind"],
        "config": str(config) if config else None,
        "overrides": overrides,
        "cmd": [str(c) for c in req.get("cmd") or []],
        "supervise_args": [str(a) for a in req.get("supervise_args") or []],
        "skip_check": bool(req.get("skip_check")),
        "cwd": str(req.get("cwd") or "."),
        "env": {str(k): str(v) for k, v in (req.get("env") or {}).items()},
        "label": _label(req),
        "need": why,
        "probe_s": float(req["probe_s"]) if req.get("probe_s") is not None else None,
        # A job that may run on fewer GPUs is shrunk rather than paused when a neighbour needs room.
        "scale_min_gpus": min_gpus,
        "memory_cap_bytes": int(float(req["memory_cap_gib"]) * GIB) if req.get("memory_cap_gib") else None,
    }
    return queue.submit(
        spec,
        need,
        source,
        gpus=gpus,
        priority=int(req.get("priority", 0)),
        user=user,
        held=bool(req.get("hold")),
    )


def _gpus_of_run(config: Path, overrides: list[str], asked: int | None) -> tuple[int, int | None]:
    """The config as `steadytune run` will read it (a broken one is refused now, not at its turn):
    its GPU count, one per process (``run.nproc_per_node``), and the fewest it may shrink to
    (``scale.min_gpus``; None without ``scale:``).
    """
    from steadytune.config import ConfigError, load_config

    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        raise SubmitError(exc.render()) from exc
    nproc = cfg.run.nproc_per_node
    if asked is not None and asked != nproc:
        raise SubmitError(
            f"--gpus {asked}, but the run starts run.nproc_per_node={nproc} process(es), one per GPU: "
            f"add run.nproc_per_node={asked} to the submit, or leave --gpus out"
        )
    return nproc, cfg.scale.min_gpus if cfg.scale is not None else None
