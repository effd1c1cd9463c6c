"""A helper process that must not outlive the process that started it.

The kernel can send a process a signal when its parent dies (Linux's ``PR_SET_PDEATHSIG``): a
child stuck in a read, or busy, dies with its parent, where a child that only waits for its stdin
to close lives on for as long as the read takes (for good, on a FIFO or ``/dev/zero``). The
signal follows the *thread* that started the child: a child started by a thread that ends first
is signalled then.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def parent_death_signal(sig: int) -> bool:
    """Have the kernel send ``sig`` when the parent dies (0: no longer); False where it cannot (no prctl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with(parent: int) -> None:
    """Be killed when process ``parent`` (this one's parent) dies; exit now if it is already gone.

    A parent that died before the signal was asked for sends none: the child was handed to
    another process (init, a subreaper) meanwhile, which :func:`os.getppid` shows.
    """
    parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)
