"""Every forensics command has --help with an example; the environment snapshot."""

from __future__ import annotations

import pytest

from steadytune.cli.main import build_parser
from steadytune.telemetry.envsnap import differences, snapshot

COMMANDS = [
    ["inspect-batch"],
    ["diff-ckpt"],
    ["repro"],
    ["mem-profile"],
    ["replay"],
    ["audit"],
    ["audit", "verify"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_help_has_an_example(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*argv, "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert "example:\n  steadytune " + argv[0] in out


def test_snapshot_without_torch():
    snap = snapshot(with_torch=False)
    assert snap["python"]["version"] and snap["os"]["system"]
    assert any(p.lower().startswith("pyyaml==") for p in snap["packages"])
    assert differences(snap, snap) == []
    changed = {**snap, "key_packages": {**snap["key_packages"], "torch": "0.0"}}
    assert differences(changed, snap)[0].startswith("torch 0.0 ->")
