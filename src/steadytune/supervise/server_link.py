"""A server job's line to its server: GPUs reserved before a grow, given back after a shrink.

A job the server started has ``$STEADYTUNE_SERVER_JOB`` (its id) and
``$STEADYTUNE_SERVER_SOCKET`` in its environment. Its supervisor's scale rules then grow
onto GPUs the server hands them, not onto whatever the host has, and shrink onto the GPUs
the server wants kept when a neighbour needs the room (docs/server.md). A server that
does not answer refuses nothing silently: a grow it cannot confirm is refused, with the
reason; a shrink goes ahead, since it only gives back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from steadytune.jobenv import JOB_ENV, SOCKET_ENV


class ServerLink:
    def __init__(self, socket: Path, job_id: str) -> None:
        self.socket, self.job_id = socket, job_id

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerLink | None:
        """The link of a job the server started; None for any other run."""
        job, sock = env.get(JOB_ENV), env.get(SOCKET_ENV)
        return cls(Path(sock), job) if job and sock else None

    def _ask(self, req: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        from steadytune.server.api import request

        try:
            return request(self.socket, {**req, "job": self.job_id}, timeout_s=timeout_s)
        except ConnectionError as exc:
            return {"ok": False, "error": str(exc)}

    def grow(self, world: int, reason: str) -> tuple[list[int] | None, str]:
        """Ask for ``world`` GPUs in all; the GPUs (its own first), or None and the server's reason."""
        answer = self._ask({"op": "resize", "gpus": world, "reason": reason})
        if not answer.get("ok"):
            return None, str(answer.get("error") or "the server did not answer")
        return [int(i) for i in answer["job"]["gpus"]], ""

    def release(self, world: int, reason: str) -> list[int] | None:
        """Keep ``world`` GPUs (those the server asked to keep, else the first); the GPUs kept, if it
        answered."""
        answer = self._ask({"op": "resize", "gpus": world, "reason": reason})
        return [int(i) for i in answer["job"]["gpus"]] if answer.get("ok") else None

    def refuse(self, reason: str) -> None:
        """The shrink the server asked for cannot be made (the server pauses the job instead)."""
        self._ask({"op": "resize", "gpus": 0, "refused": reason})

    def wanted(self) -> list[int] | None:
        """The GPUs the server wants this job shrunk onto, or None."""
        answer = self._ask(
            {"op": "job"}, timeout_s=2.0
        )  # at every sample: a stuck server must not stall the loop
        want = answer.get("job", {}).get("shrink_to") if answer.get("ok") else None
        return [int(i) for i in want] if want else None
