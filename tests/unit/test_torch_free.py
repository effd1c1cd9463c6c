"""The supervisor side never imports torch: it must outlive CUDA failures and start fast.

Each check runs in a fresh interpreter (tests/fresh.py): inside the pytest process
another test may already have imported torch, and the check could not fail.
"""

from __future__ import annotations

import pytest

from tests.fresh import HEAVY, fresh_imports

TORCH_FREE = [
    "steadytune.records",
    "steadytune.config",
    "steadytune.config.yamlsafe",
    "steadytune.redact",
    "steadytune.redact.paths",
    "steadytune.telemetry.store",
    "steadytune.telemetry.events",
    "steadytune.telemetry.sampler",
    "steadytune.detect.live",
    "steadytune.policy.engine",
    "steadytune.policy.plan",
    "steadytune.supervise.supervisor",
    "steadytune.supervise.command",
    "steadytune.supervise.log_adapter",
    "steadytune.alerts.router",
    "steadytune.web.server",
    "steadytune.checkpoint.store",
    "steadytune.estimate",
    "steadytune.cli.main",
    "steadytune.preflight",
    "steadytune.forensics.inspect",
    "steadytune.telemetry.runenv",
    "steadytune.forensics.envdiff",
    "steadytune.preflight.envdrift",
    "steadytune.cli.env",
    "steadytune.server.daemon",
    "steadytune.server.api",
    "steadytune.supervise.server_link",
    "steadytune.guard.memcap",
]


def test_supervisor_side_modules_do_not_import_torch() -> None:
    code = (
        "".join(f"import {m}\n" for m in TORCH_FREE)
        + "from steadytune.cli.main import build_parser\nbuild_parser()\n"
    )
    assert fresh_imports(code) == []


# The core is Ray-free too: Ray is imported by the Ray driver and its workers, never by the supervisor.
RAY_FREE = [*TORCH_FREE, "steadytune.supervise.ray_source", "steadytune.engines.groups", "steadytune.cli.run"]


def test_supervisor_side_modules_do_not_import_ray() -> None:
    code = "".join(f"import {m}\n" for m in RAY_FREE) + (
        "from steadytune.cli.main import build_parser\nbuild_parser()\n"
    )
    assert fresh_imports(code, watch=("ray", *HEAVY)) == []


def test_the_ray_check_can_fail() -> None:
    pytest.importorskip("ray")
    assert fresh_imports("import ray\n", watch=("ray",)) == ["ray"]


def test_the_check_can_fail() -> None:
    """The same probe sees an import when there is one (else the tests above prove nothing)."""
    assert fresh_imports("import steadytune.train.sampling\n") == ["torch"]
