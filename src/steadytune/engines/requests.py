"""The scale rules' resource requests to Ray, carried from the supervisor to the Ray driver.

The supervisor stays Ray-free, so it cannot call ``ray.autoscaler.sdk.request_resources``
itself. It writes the request, whole, into ``ray/attempt-<A>-request.json``; the driver of
that attempt polls the file, makes the call, and appends what it asked Ray for to
``ray/attempt-<A>-requested.jsonl`` (one writer each way), which the supervisor files as an
event and a plan revision. Ray scales on logical demand, not on GPU memory or utilisation:
a request is how a rule on those readings reaches Ray's autoscaler.

Pure and Ray-free: file formats and the bundles, no Ray calls.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steadytune.rundir import atomic_write_text


@dataclass(frozen=True)
class ResourceRequest:
    """``workers`` Ray workers' resources, each bundle one worker's, asked for because of ``reason``."""

    seq: int
    kind: str  # grow / shrink / undo
    workers: int
    bundles: tuple[dict[str, float], ...]
    reason: str
    ts: float

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "bundles": [dict(b) for b in self.bundles]})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResourceRequest:
        return cls(
            seq=int(data["seq"]),
            kind=str(data["kind"]),
            workers=int(data["workers"]),
            bundles=tuple({str(k): float(v) for k, v in b.items()} for b in data["bundles"]),
            reason=str(data.get("reason", "")),
            ts=float(data.get("ts", 0.0)),
        )


def worker_bundle(resources_per_worker: dict[str, float], use_gpu: bool) -> dict[str, float]:
    """One Ray Train worker's resources, as Ray Train itself reserves them (ScalingConfig's default:
    one GPU with ``use_gpu``, else one CPU; zero amounts dropped)."""
    bundle = {k: float(v) for k, v in resources_per_worker.items() if v}
    if not bundle:
        bundle = {"GPU": 1.0} if use_gpu else {"CPU": 1.0}
    if use_gpu:
        bundle.setdefault("GPU", 1.0)
    return bundle


def request_path(run_root: Path, attempt: int) -> Path:
    """The request the supervisor wants the driver of ``attempt`` to make (replaced whole)."""
    return run_root / "ray" / f"attempt-{attempt}-request.json"


def requested_path(run_root: Path, attempt: int) -> Path:
    """What that driver asked Ray for, one line per request made (appended by the driver)."""
    return run_root / "ray" / f"attempt-{attempt}-requested.jsonl"


def write_request(run_root: Path, attempt: int, request: ResourceRequest) -> Path:
    path = request_path(run_root, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, request.to_json())
    return path


class RequestInbox:
    """The driver's side: the request file, read again each poll; a request is new once (by its seq)."""

    def __init__(self, run_root: Path, attempt: int) -> None:
        self.path = request_path(run_root, attempt)
        self.done = requested_path(run_root, attempt)
        self.seen = 0

    def new(self) -> ResourceRequest | None:
        try:
            req = ResourceRequest.from_dict(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # none yet, or not one the supervisor wrote: nothing to ask
        if req.seq <= self.seen:
            return None
        self.seen = req.seq
        return req

    def made(
        self, request: ResourceRequest, ts: float, recorded: list[dict[str, float]] | None = None
    ) -> None:
        """Record that Ray was asked, and what Ray holds as the request just after (the supervisor turns
        the line into an event)."""
        self.done.parent.mkdir(parents=True, exist_ok=True)
        line = {**json.loads(request.to_json()), "requested_ts": ts, "recorded": recorded}
        with open(self.done, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
