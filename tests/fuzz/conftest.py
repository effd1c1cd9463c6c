"""The fuzzing harness: every reader of outside input, fed what hypothesis makes up.

Each test names one reader and its documented clean error; any other exception is a crash
and fails the test. ``make test`` runs a bounded number of cases per reader (the whole harness
in well under a minute); ``make fuzz`` runs ``STEADYTUNE_FUZZ_FACTOR`` (20) times as many, with
hypothesis's statistics, so the cases run per reader are printed.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FACTOR = max(1, int(os.environ.get("STEADYTUNE_FUZZ_FACTOR", "1")))


def cases(n: int) -> settings:
    """Hypothesis settings for ``n`` cases (times the fuzz factor), no deadline: files and sockets."""
    return settings(
        max_examples=n * FACTOR,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )
