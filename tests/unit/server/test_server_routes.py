"""The dashboard's server page and API, with a real daemon on fake GPU readings; the socket API too."""

from __future__ import annotations

import http.client
import json
import os
import re
from pathlib import Path

import pytest

from steadytune.server.api import SocketApi, request
from steadytune.server.daemon import Daemon, ServerPaths
from steadytune.server.ledger import GIB, GpuProcess, GpuReading
from steadytune.server.queue import JobQueue
from steadytune.web.server import start_dashboard
from tests.waiting import ANSWER_S

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def daemon(tmp_path: Path) -> Daemon:
    paths = ServerPaths(tmp_path / "srv", tmp_path / "runs")
    paths.runs_dir.mkdir(parents=True)
    readings = (GpuReading(0, 24 * GIB, 6 * GIB, "fake", 0.4, (GpuProcess(4242, 6 * GIB),)),)
    d = Daemon(JobQueue(paths.queue), paths, lambda: readings, command=lambda job, runs: ["false"])
    d.queue.submit({"kind": "supervise", "cmd": ["x"], "label": "big"}, 30 * GIB, "user")
    d.queue.submit({"kind": "supervise", "cmd": ["x"], "label": "small"}, 4 * GIB, "user", held=True)
    d.tick()
    return d


def call(port: int, method: str, path: str, body: dict | None = None, token: str | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_S)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["X-Steadytune-Token"] = token
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_server_page_snapshot_and_actions_behind_the_token(daemon: Daemon, tmp_path: Path):
    handle = start_dashboard(tmp_path / "runs", port=0, token=TOKEN, server=daemon)
    try:
        status, page = call(handle.port, "GET", "/server")
        assert status == 200 and b"/static/server.js" in page
        status, raw = call(handle.port, "GET", "/api/server")
        snap = json.loads(raw)
        assert status == 200
        g = snap["gpus"][0]
        assert (g["used_bytes"], g["free_bytes"], g["reserved_bytes"]) == (6 * GIB, 18 * GIB, 0)
        assert g["foreign"] == [{"pid": 4242, "used_bytes": 6 * GIB}]
        big, small = snap["jobs"]
        assert big["state"] == "queued" and big["reason"].startswith("never fits here")
        assert small["state"] == "held"
        # Acting needs the token, and a confirmation.
        path = f"/api/server/jobs/{small['id']}/release"
        assert call(handle.port, "POST", path, {"confirm": True})[0] == 401
        assert call(handle.port, "POST", path, {}, token=TOKEN)[0] == 400
        status, raw = call(handle.port, "POST", path, {"confirm": True}, token=TOKEN)
        assert status == 200 and json.loads(raw)["job"]["state"] == "queued"
        status, raw = call(handle.port, "POST", path, {"confirm": True}, token=TOKEN)
        assert status == 400 and "only a held job can be released" in json.loads(raw)["error"]
    finally:
        handle.stop()


def test_without_a_server_the_routes_do_not_exist(tmp_path: Path):
    (tmp_path / "runs").mkdir()
    handle = start_dashboard(tmp_path / "runs", port=0, token=TOKEN)
    try:
        assert call(handle.port, "GET", "/server")[0] == 404
        assert call(handle.port, "GET", "/api/server")[0] == 404
        assert call(handle.port, "POST", "/api/server/jobs/j1/cancel", {"confirm": True}, TOKEN)[0] == 404
    finally:
        handle.stop()


def test_socket_api_submit_queue_and_errors(daemon: Daemon, tmp_path: Path):
    sock = tmp_path / "s.sock"
    api = SocketApi(daemon, sock)
    try:
        assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
        answer = request(
            sock, {"op": "submit", "kind": "supervise", "cmd": ["python", "t.py"], "need_gib": 2}
        )
        assert answer["ok"] and answer["job"]["id"] == "j3" and answer["job"]["need_bytes"] == 2 * GIB
        assert answer["job"]["need_source"] == "user" and answer["never_fits"] is None
        bad = request(sock, {"op": "submit", "kind": "supervise", "cmd": ["python"], "gpus": 0, "probe_s": 1})
        assert not bad["ok"]
        assert "gpus=0" in bad["error"] and "probe_s=1: give the probe's bound in seconds" in bad["error"]
        many = request(sock, {"op": "submit", "kind": "supervise", "cmd": ["torchrun", "t.py"], "gpus": 2})
        assert "gpus=2: a command without --need-gib is measured by a probe on one GPU" in many["error"]
        probed = request(
            sock, {"op": "submit", "kind": "supervise", "cmd": ["python", "t.py"], "probe_s": 30}
        )
        assert (probed["job"]["need_source"], probed["job"]["spec"]["probe_s"]) == ("probe", 30.0)
        snap = request(sock, {"op": "queue"})
        assert [j["id"] for j in snap["jobs"]] == ["j1", "j2", "j3", "j4"]
        assert request(sock, {"op": "cancel", "job": "j3"})["job"]["state"] == "cancelled"
        assert "unknown op" in request(sock, {"op": "nope"})["error"]
        assert request(sock, {"op": "job", "job": "j1"})["job"]["shrink_to"] is None
        assert "no job 'j9'" in request(sock, {"op": "job", "job": "j9"})["error"]
        # Told at once, not only in `queue`: one GPU more than the host has, or more memory than a GPU.
        wide = request(
            sock, {"op": "submit", "kind": "supervise", "cmd": ["torchrun", "t.py"], "need_gib": 2, "gpus": 2}
        )
        assert wide["ok"] and wide["never_fits"].startswith("needs 2 GPUs; this server manages 1: ")
        big = request(sock, {"op": "submit", "kind": "supervise", "cmd": ["python", "t.py"], "need_gib": 200})
        assert big["ok"] and "the largest GPU holds" in big["never_fits"]
        for extra in (wide, big):
            assert request(sock, {"op": "cancel", "job": extra["job"]["id"]})["ok"]
        refused = request(sock, {"op": "resize", "job": "j3", "gpus": 2})
        assert not refused["ok"] and "j3' is cancelled; only a running job can resize" in refused["error"]
        with pytest.raises(OSError, match="already answers"):
            SocketApi(daemon, sock)
    finally:
        api.stop()
    with pytest.raises(ConnectionError, match="start one with `steadytune server`"):
        request(sock, {"op": "ping"})


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "check-llama-3.1-8b.yaml"


def test_a_config_job_needs_the_estimators_peak_and_its_process_count(daemon: Daemon):
    from steadytune.estimate import estimate_peak, load_architecture, load_run_config, setup_from_config_dict
    from steadytune.server.submit import SubmitError, submit

    job = submit(
        daemon.queue, {"kind": "run", "config": str(EXAMPLE), "overrides": ["data.max_seq_length=1024"]}
    )
    data = load_run_config(EXAMPLE)
    data["data"]["max_seq_length"] = 1024
    _, setup = setup_from_config_dict(data, device="cuda")
    expected = estimate_peak(
        load_architecture(str(EXAMPLE.parent / "models" / "llama-3.1-8b")), setup
    ).peak_bytes
    assert (job.need_bytes, job.need_source, job.gpus_wanted) == (expected, "estimate", 1)
    assert job.spec["need"].startswith("estimated peak") and "seq 1024" in job.spec["need"]
    assert (
        submit(daemon.queue, {"kind": "run", "config": str(EXAMPLE), "need_gib": 12}).need_bytes == 12 * GIB
    )
    with pytest.raises(SubmitError, match=r"--gpus 2, but the run starts run.nproc_per_node=1"):
        submit(daemon.queue, {"kind": "run", "config": str(EXAMPLE), "gpus": 2})
    two = submit(daemon.queue, {"kind": "run", "config": str(EXAMPLE), "overrides": ["run.nproc_per_node=2"]})
    assert two.gpus_wanted == 2
    with pytest.raises(SubmitError, match=r"train\.max_steps"):
        submit(daemon.queue, {"kind": "run", "config": str(EXAMPLE), "overrides": ["train.max_steps=-3"]})


@pytest.mark.parametrize(
    ("req", "says"),
    [
        ({"kind": "run", "config": "x" * 5000}, r"cannot be read \(File name too long\)"),  # was an OSError
        ({"kind": "run", "config": "/nonexistent/x.yaml"}, "x.yaml' does not exist"),
        # A FIFO, a folder, a device in the config's place read "does not exist".
        ({"kind": "run", "config": "/dev/zero"}, "/dev/zero' is a character device, not a regular file"),
        ({"kind": "run", "config": "/"}, "is a folder, not a regular file"),
        ({"kind": "run", "config": ["a.yaml"]}, "config=.*give a string"),
        ({"kind": "supervise", "cmd": ["x"], "env": ["HF_TOKEN=x"]}, "env: give an object of strings"),
        ({"kind": "supervise", "cmd": ["x"], "overrides": 5}, "overrides=5: give a list of strings"),
        ({"kind": "supervise", "cmd": ["x"], "priority": 2**64}, "priority=.*within"),  # SQLite overflow
        ({"kind": "supervise", "cmd": ["x"], "need_gib": 1e308}, "need_gib="),
        ({"kind": "supervise", "cmd": ["x"], "gpus": 10**9}, "gpus=.*1 to 1024"),
    ],
)
def test_a_submit_of_any_shape_is_refused_with_what_is_wrong(daemon: Daemon, req: dict, says: str):
    """Found by the fuzzing harness (tests/fuzz/test_fuzz_socket.py): each raised in the daemon."""
    from steadytune.server.api import answer_line

    answer = answer_line(daemon, json.dumps({"op": "submit", **req}).encode())
    assert answer["ok"] is False and re.search(says, answer["error"]), answer
    assert answer_line(daemon, b"[" * 100_000)["error"] == "the request is nested too deep"


def test_submit_of_a_job_that_never_fits_warns_at_once(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from steadytune.cli.main import build_parser
    from steadytune.cli.submit import main as submit_main

    sock = tmp_path / "s.sock"
    api = SocketApi(daemon, sock)
    try:
        args, _ = build_parser("submit").parse_known_args(
            ["submit", "--socket", str(sock), "--need-gib", "200", "--", "python", "t.py"]
        )
        assert submit_main(args) == 0
        out, err = capsys.readouterr()
        assert out.startswith("j3 queued")
        assert "warning: j3 never fits here: needs 200.0 GiB per GPU" in err
        assert "`steadytune cancel j3`" in err
        args, _ = build_parser("submit").parse_known_args(
            ["submit", "--socket", str(sock), "--need-gib", "2", "--", "python", "t.py"]
        )
        assert submit_main(args) == 0
        assert "never fits" not in capsys.readouterr().err
    finally:
        api.stop()
