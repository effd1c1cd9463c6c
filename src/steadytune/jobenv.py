"""The environment of a job the GPU server starts: what the server sets, and the job's side reads.

``server/jobs.py`` starts each job with these variables set. The job's supervisor asks the
server's socket for GPUs to grow onto (``supervise/server_link.py``) and counts the wait in
the queue into its goodput (``cli/run.py``); the job's worker caps its allocator at the
memory the job was submitted with (``guard/memcap.py``). Names and the cap's parsing only,
on the ground floor, so the server and the torch-free supervisor read them without the
guard's room.
"""

from __future__ import annotations

JOB_ENV = "STEADYTUNE_SERVER_JOB"  # the job's id in the server's queue
SOCKET_ENV = "STEADYTUNE_SERVER_SOCKET"  # where the job's supervisor asks for GPUs to grow onto
SUBMITTED_ENV = "STEADYTUNE_SERVER_SUBMITTED"  # when the queue took the job: its goodput counts the wait
MEMORY_CAP_ENV = "STEADYTUNE_MEMORY_CAP_BYTES"  # a job's GPU memory cap (submit --memory-cap-gib)


def parse_cap(value: str | None) -> int | None:
    """The cap in bytes from the variable's text; None when unset or empty.

    Raises:
        ValueError: not a whole number of bytes > 0 (the message names the variable and the fix).
    """
    if value is None or not value.strip():
        return None
    try:
        cap = int(value.strip())
    except ValueError:
        cap = 0
    if cap <= 0:
        raise ValueError(
            f"{MEMORY_CAP_ENV}={value!r}: give the cap as a whole number of bytes > 0, "
            "e.g. 21474836480 for 20 GiB (steadytune submit --memory-cap-gib 20 sets it)"
        )
    return cap
