"""A secret on a supervised command line reaches no file, console or page of steadytune.

``--hub_token hf_...``, ``--password=...``, ``HF_TOKEN=...`` and ``https://user:pass@host/``
were kept in clear in the hash-chained ``events.jsonl`` (where they could never be scrubbed),
in ``run.db``, on the console and in the dashboard's events API. The job itself still gets
them: only what steadytune records is redacted.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
from pathlib import Path

from steadytune.web.server import start_dashboard
from tests.conftest import STEADYTUNE
from tests.waiting import ANSWER_S

TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWx"
PASSWORD = "s3cr3t-Passw0rd"
URL_PASSWORD = "pa55w0rd-in-url"
SECRETS = (TOKEN, PASSWORD, URL_PASSWORD)
JOB = (
    "import hashlib, sys\n"
    "print('argv', hashlib.sha256(sys.argv[2].encode()).hexdigest())\n"
    "for i in range(3): print({'loss': 1.0 / (i + 1), 'step': i})\n"
)


def test_secrets_on_the_command_line_never_reach_the_log_store_console_or_api(
    tmp_path: Path, stdlib_python: str
) -> None:
    cmd = [
        stdlib_python, "-c", JOB, "--hub_token", TOKEN, f"--password={PASSWORD}",
        f"https://trainer:{URL_PASSWORD}@hub.example.com/org/model", "HF_TOKEN=" + TOKEN,
    ]  # fmt: skip
    proc = subprocess.run(
        [STEADYTUNE, "supervise", "--runs-dir", str(tmp_path / "runs"), "--run-id", "r1", "--", *cmd],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "runs" / "r1"
    job_got = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert f"argv {job_got}" in (run / "logs" / "worker-0.log").read_text()  # the job has its token
    console = proc.stdout + proc.stderr
    assert "--hub_token ***" in console and "***@hub.example.com" in console, console
    leaks = {
        p.relative_to(run).as_posix()
        for p in run.rglob("*")
        if p.is_file() and p.name != "worker-0.log" and any(s.encode() in p.read_bytes() for s in SECRETS)
    }
    assert leaks == set()
    assert not any(s in console for s in SECRETS), console
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["name"] == "worker_started")
    assert started["data"]["cmd"][:2] == [stdlib_python, "-c"] and "***" in started["data"]["cmd"]

    handle = start_dashboard(tmp_path / "runs", host="127.0.0.1", port=0)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=ANSWER_S)
        conn.request("GET", "/api/runs/r1/events")
        body = conn.getresponse().read().decode()
    finally:
        handle.stop()
    assert "worker_started" in body and not any(s in body for s in SECRETS)
