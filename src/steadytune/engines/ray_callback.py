"""What Ray's controller sees and no worker can say: the group it is about to replace has failed.

Called on the Ray Train controller (``RunConfig(callbacks=[...])``), it appends each failure
to ``ray/attempt-<A>-failures.jsonl`` (one writer: the controller). The supervisor reads it
through the Ray source: until the next group starts, the job is re-forming, not hung, and is
judged by ``policy.setup_timeout_s`` instead of the step pace.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ray.train import UserCallback

from steadytune.engines.groups import failures_path


class GroupFailures(UserCallback):
    """Records which ranks failed, and how, each time Ray's worker group fails."""

    def __init__(self, run_root: str, attempt: int) -> None:
        self.path = failures_path(Path(run_root), attempt)

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        line = {
            "ts": time.time(),
            "ranks": {
                str(rank): f"{type(exc).__name__}: {exc}"[:500] for rank, exc in worker_exceptions.items()
            },
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
