"""The server side is torch-free; the CLI words become the right requests; `queue` prints what waits
and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.cli.main import build_parser
from steadytune.cli.queue import render
from steadytune.cli.submit import build_request
from tests.fresh import fresh_imports

SERVER_MODULES = [
    "steadytune.server.daemon", "steadytune.server.api", "steadytune.server.submit", "steadytune.server.gpus",
    "steadytune.cli.server", "steadytune.cli.submit", "steadytune.cli.queue", "steadytune.cli.jobs",
]  # fmt: skip


def test_server_modules_do_not_import_torch() -> None:
    code = "".join(f"import {m}\n" for m in SERVER_MODULES) + "import steadytune.server.submit as s\n"
    code += "s.submit\nfrom steadytune.server.need import need_from_config\n"
    assert fresh_imports(code) == []


def parse(*argv: str) -> dict:
    args, extra = build_parser("submit").parse_known_args(["submit", *argv])
    args.overrides += extra  # as main() does with key=value after options
    return build_request(args)


def test_submit_words_a_config_job_or_a_command_job() -> None:
    r = parse("cfg.yaml", "train.max_steps=5", "--priority", "3", "lora.r=8")
    assert (r["kind"], r["overrides"], r["cmd"], r["priority"]) == (
        "run",
        ["train.max_steps=5", "lora.r=8"],
        [],
        3,
    )
    assert r["config"].endswith("/cfg.yaml") and r["env"] and r["cwd"]
    r = parse("--need-gib", "30", "--gpus", "2", "--", "torchrun", "--nproc-per-node", "2", "train.py")
    assert (r["kind"], r["cmd"], r["need_gib"], r["gpus"]) == (
        "supervise", ["torchrun", "--nproc-per-node", "2", "train.py"], 30.0, 2,
    )  # fmt: skip
    r = parse("--config", "sup.yaml", "--", "llamafactory-cli", "train", "sft.yaml")
    assert r["kind"] == "supervise" and r["config"].endswith("/sup.yaml") and r["cmd"][-1] == "sft.yaml"
    assert "error" in parse() and "error" in parse("--config", "x.yaml", "cfg.yaml")


def test_queue_text_says_why_a_job_waits() -> None:
    snap = {
        "headroom_bytes": 1 << 30,
        "gpus": [
            {
                "index": 0,
                "name": "H100",
                "total_bytes": 80 << 30,
                "used_bytes": 30 << 30,
                "free_bytes": 50 << 30,
                "reserved_bytes": 10 << 30,
                "util_ratio": 0.9,
                "jobs": ["j1"],
                "foreign": [{"pid": 77, "used_bytes": 1}],
            }
        ],
        "jobs": [
            {
                "id": "j1",
                "state": "running",
                "priority": 0,
                "need_bytes": 40 << 30,
                "gpus_wanted": 1,
                "gpus": [0],
                "spec": {"label": "lora"},
                "reason": "running on GPU 0",
                "run": {"step": 5, "max_steps": 100},
            },
            {
                "id": "j2",
                "state": "queued",
                "priority": 0,
                "need_bytes": 45 << 30,
                "gpus_wanted": 1,
                "gpus": [],
                "spec": {"label": "full"},
                "reason": "waits for room: needs 45.0 GiB",
                "run": None,
            },
            {
                "id": "j0",
                "state": "done",
                "priority": 0,
                "need_bytes": 1,
                "gpus_wanted": 1,
                "gpus": [0],
                "spec": {"label": "old"},
                "reason": "completed",
            },
        ],
    }
    text = render(snap)
    assert (
        "total 80.0G used 30.0G reserved 10.0G free 50.0G left 40.0G util 90%  jobs j1  foreign pids 77"
        in text
    )
    assert "step 5/100" in text and "waits for room: needs 45.0 GiB" in text
    assert "j0" not in text and "j0" in render(snap, show_all=True)


def test_queue_text_shows_each_jobs_gpus_and_its_scale_history() -> None:
    job = {
        "id": "j1",
        "state": "running",
        "priority": 0,
        "need_bytes": 8 << 30,
        "gpus_wanted": 1,
        "gpus": [0, 1],
        "spec": {"label": "lora"},
        "reason": "running on GPU 0",
        "paused": None,
        "history": [
            {"ts": 0, "kind": "grow", "from": [0], "to": [0, 1], "reason": "GPU util 95% > 85%"},
            {"ts": 0, "kind": "pause", "gpu": 1, "reason": "GPU 1 has 0.5 GiB free"},
        ],
    }
    text = render({"headroom_bytes": 1 << 30, "gpus": [], "jobs": [job]})
    assert "gpu 0,1" in text
    assert "grow gpu 0 -> 0,1: GPU util 95% > 85%" in text and "pause (gpu 1): GPU 1 has 0.5 GiB free" in text
    text = render(
        {"headroom_bytes": 1 << 30, "gpus": [], "jobs": [{**job, "paused": "GPU 1 has 0.5 GiB free"}]}
    )
    assert "paused by the server: GPU 1 has 0.5 GiB free" in text and "running on GPU 0" not in text


def test_every_server_command_has_an_example_in_its_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("server", "submit", "queue", "cancel", "hold", "release"):
        assert "example:\n  steadytune " + name in sub.choices[name].format_help()


def test_server_names_every_bad_option_at_once_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from steadytune.cli.main import main

    code = main([
        "server", "--dir", str(tmp_path / "srv"), "--runs-dir", str(tmp_path / "runs"), "--gpus", "0,x",
        "--headroom-gib", "-1", "--pressure-gib", "-2", "--snapshot-file", str(tmp_path / "none.json"),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    for option in ("--gpus '0,x'", "--headroom-gib -1.0", "--pressure-gib -2.0", str(tmp_path / "none.json")):
        assert option in err
    assert not (tmp_path / "srv").exists() and not (tmp_path / "runs").exists()
