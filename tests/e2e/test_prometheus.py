"""A real Prometheus scrapes /metrics; promtool checks the exposition and the rules."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from live_run import LiveRun
from tests.waiting import ANSWER_S, wait_for

from steadytune.records import Event, StepRecord
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.server import DashboardHandle, start_dashboard

pytestmark = pytest.mark.slow
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _finished_run(runs_dir: Path) -> None:
    """A run whose loss no longer moves, so the value Prometheus stores is known exactly."""
    run = RunDir(runs_dir / "done-run").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(20):
            w.write(StepRecord(step=s, ts=1000.0 + s, loss=0.5 + s / 100, tokens=10, step_time_s=1.0))
    atomic_write_text(run.status, json.dumps({"run_id": "done-run", "state": "completed", "step": 19,
                                              "max_steps": 19, "updated_ts": time.time()}))  # fmt: skip


def _prometheus(binary: str, tmp_path: Path, target: int, port: int, extra: str) -> subprocess.Popen[bytes]:
    """A real Prometheus on ``port`` scraping the dashboard on ``target`` every second."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: 1s, {extra}}}\n"
        "scrape_configs:\n"
        f"  - job_name: steadytune\n    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
    )
    return subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def _metrics(dashboard: DashboardHandle) -> bytes:
    with urllib.request.urlopen(dashboard.url + "metrics", timeout=ANSWER_S) as r:
        return r.read()


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=ANSWER_S) as r:
        return json.loads(r.read())["data"]["result"]


def test_prometheus_scrapes_the_runs_loss(
    prometheus_bins: tuple[str, str],
    runs_dir: Path,
    live_run: LiveRun,
    dashboard: DashboardHandle,
    tmp_path: Path,
) -> None:
    prometheus, _ = prometheus_bins
    _finished_run(runs_dir)
    # Both runs are on the exposition before Prometheus starts scraping it.
    wait_for(lambda: b'steadytune_loss{run="done-run"}' in _metrics(dashboard) and live_run.step > 0,
             timeout=60, what="both runs on /metrics")  # fmt: skip
    port = _free_port()
    proc = _prometheus(prometheus, tmp_path, dashboard.port, port, "evaluation_interval: 1s")
    try:

        def stored() -> list[dict]:
            try:
                return _query(port, 'steadytune_loss{run="done-run"}')
            except OSError:  # Prometheus is still starting
                return []

        result = wait_for(
            stored, timeout=60, interval=0.5, what="Prometheus to store steadytune_loss for done-run"
        )
        assert float(result[0]["value"][1]) == pytest.approx(0.69)
        live = _query(port, 'steadytune_step{run="live-run"}')
        assert live and float(live[0]["value"][1]) > 0
        up = _query(port, 'up{job="steadytune"}')
        assert up and up[0]["value"][1] == "1"
    finally:
        proc.terminate()
        proc.wait(10)


def test_promtool_check_metrics_on_the_exposition(
    prometheus_bins: tuple[str, str], live_run: LiveRun, dashboard: DashboardHandle
) -> None:
    _, promtool = prometheus_bins
    # A system sample (every 10 steps), an anomaly (step 20) and its resolution (step 30).
    wait_for(lambda: live_run.step > 30, timeout=60, what="the live run past step 30")

    def exposition() -> bytes | None:
        with urllib.request.urlopen(dashboard.url + "metrics", timeout=ANSWER_S) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read()
        return (
            text
            if b"steadytune_gpu_temperature_celsius" in text and b"steadytune_anomalies_total" in text
            else None
        )

    text = wait_for(exposition, timeout=60, what="the system sample and the anomaly on /metrics")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    assert check.stdout.strip() == b"" and check.stderr.strip() == b"", "promtool lint findings"


def test_promtool_rules_check_and_unit_tests(prometheus_bins: tuple[str, str]) -> None:
    _, promtool = prometheus_bins
    check = subprocess.run(
        [promtool, "check", "rules", "alerts.yml"], cwd=RULES, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 10 rules found" in check.stdout
    test = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yml"], cwd=RULES, capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr
    conf = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"], cwd=RULES, capture_output=True, text=True
    )
    assert conf.returncode == 0, conf.stdout + conf.stderr


def _grafana_exprs() -> dict[str, str]:
    """The Grafana dashboard's expressions by panel title, and its anomaly marks', ``$run`` as every run."""
    board = json.loads((RULES.parent / "grafana" / "steadytune.json").read_text())
    found = {p["title"]: t["expr"] for p in board["panels"] for t in p.get("targets", [])[:1]}
    found["annotation"] = board["annotations"]["list"][0]["expr"]
    return {k: v.replace("$run", ".*") for k, v in found.items()}


def test_the_grafana_panels_count_a_runs_first_restart_and_anomaly(
    prometheus_bins: tuple[str, str], tmp_path: Path
) -> None:
    # A counter's first event makes its series, at 1: increase() and changes() see no rise in a series
    # that starts inside their window, so a panel built on them alone shows 0 for the first restart.
    _, promtool = prometheus_bins
    exprs = _grafana_exprs()
    restarts, anomalies, marks = (
        exprs["Restarts (1h)"],
        exprs["Anomalies (rate by kind)"],
        exprs["annotation"],
    )
    spike = 'steadytune_anomalies_total{run="r1",kind="loss_spike",severity="warning"}'
    tests = {
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'steadytune_restarts_total{run="r1",reason="oom"}', "values": "_ _ 1 2 2 2"},
                    {"series": 'steadytune_restarts_total{run="r1",reason="hang"}', "values": "_ _ _ _ 1 1"},
                    # an old run's: one restart more than an hour after its series began
                    {"series": 'steadytune_restarts_total{run="r2",reason="oom"}', "values": "0x70 1 1"},
                    {"series": spike, "values": "_ _ _ 1 1 1"},
                ],
                "promql_expr_test": [
                    {
                        "expr": restarts,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": '{run="r1"}', "value": 3},
                            {"labels": '{run="r2"}', "value": 0},
                        ],
                    },
                    {
                        "expr": f"round({restarts})",
                        "eval_time": "72m",
                        "exp_samples": [{"labels": '{run="r2"}', "value": 1}],
                    },
                    {
                        "expr": anomalies,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": '{run="r1",kind="loss_spike",severity="warning"}', "value": 1}
                        ],
                    },
                    {"expr": marks, "eval_time": "3m", "exp_samples": [{"labels": spike, "value": 1}]},
                    {"expr": marks, "eval_time": "5m", "exp_samples": []},
                ],
            }
        ]
    }
    path = tmp_path / "grafana_test.yml"
    path.write_text(json.dumps(tests))  # JSON is YAML
    test = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert test.returncode == 0, test.stdout + test.stderr


def _finished_runs(runs_dir: Path, n: int, steps: int) -> list[str]:
    """``n`` finished runs of ``steps`` steps (one anomaly each), ended a minute apart, never read."""
    ids = []
    for i in range(n):
        run = RunDir(runs_dir / f"old-{i:03d}").create()
        ended = time.time() - 60.0 * (i + 1)
        with JsonlWriter(run.telemetry(0)) as w:
            for s in range(steps):
                w.write(StepRecord(step=s, ts=ended - steps + s, loss=1.0, tokens=10, step_time_s=1.0))
        with JsonlWriter(run.events) as w:
            w.write(Event(ts=ended - 5, kind="anomaly", name="loss_spike", severity="warn", step=3, seq=0))
        atomic_write_text(run.status, json.dumps({"run_id": run.run_id, "state": "completed",
                                                  "step": steps - 1, "updated_ts": ended}))  # fmt: skip
        ids.append(run.run_id)
    return ids


def test_a_new_dashboard_reads_old_runs_in_the_background_and_prometheus_sees_each_whole(
    prometheus_bins: tuple[str, str], runs_dir: Path, tmp_path: Path
) -> None:
    """Prometheus scrapes a dashboard from its first second over 60 runs it never read: every scrape
    answers; a run's counters appear at their final value, then never move, reset or vanish.

    The background reader is held by a gate, so Prometheus scrapes with none of the runs read, then
    with the 30 newest read and 30 to come, then with all read, however fast this machine reads
    (unheld, a fast reader can be done before Prometheus' first scrape, and a slow Prometheus after).
    """
    prometheus, promtool = prometheus_bins
    ids = _finished_runs(runs_dir, 60, 400)
    gate = threading.Semaphore(0)
    dashboard = start_dashboard(runs_dir, host="127.0.0.1", port=0, read_gate=gate)
    first = urllib.request.urlopen(dashboard.url + "metrics", timeout=ANSWER_S).read()  # it asks for all 60
    prom_port = _free_port()
    proc = _prometheus(prometheus, tmp_path, dashboard.port, prom_port, "scrape_timeout: 900ms")
    try:
        check = subprocess.run([promtool, "check", "metrics"], input=first, capture_output=True, timeout=30)
        assert check.returncode == 0 and check.stdout.strip() == b"", check.stdout + check.stderr

        def scraped(pending: int, kept: int) -> Callable[[], bool]:
            """Whether Prometheus' latest scrape had ``pending`` runs to come and ``kept`` runs' series."""

            def seen() -> bool:
                try:
                    left = _query(prom_port, "steadytune_runs_pending_index")
                    have = _query(prom_port, "count(steadytune_tokens_total)")
                except OSError:  # Prometheus is still starting
                    return False
                return (
                    bool(left)
                    and left[0]["value"][1] == str(pending)
                    and (have[0]["value"][1] == str(kept) if have else kept == 0)
                )

            return seen

        wait_for(scraped(60, 0), timeout=120, interval=0.5, what="a scrape before any run was read")
        gate.release(30)
        wait_for(scraped(30, 30), timeout=240, interval=0.5, what="a scrape with half the runs read")
        gate.release(30)
        wait_for(scraped(0, 60), timeout=240, interval=1.0, what="Prometheus to see every run read")
        waited = _query(prom_port, "max_over_time(steadytune_runs_pending_index[10m])")
        assert waited[0]["value"][1] == "60"
        up = _query(prom_port, 'min_over_time(up{job="steadytune"}[10m])')
        assert up[0]["value"][1] == "1"  # no scrape failed or timed out (900 ms) meanwhile
        scrapes = sorted(float(t) for t, _ in _query(prom_port, 'up{job="steadytune"}[10m]')[0]["values"])
        counters = ("tokens_total", "anomalies_total", "productive_seconds_total")
        for family in (f"steadytune_{name}" for name in counters):
            series = _query(prom_port, f"{family}[10m]")
            assert sorted(s["metric"]["run"] for s in series) == ids, family
            for s in series:
                times = [float(t) for t, _ in s["values"]]
                assert len({v for _, v in s["values"]}) == 1, (family, s["metric"], "moved")
                # In every scrape from its first to the last: never left out once it was there.
                assert times == [t for t in scrapes if t >= times[0]], (family, s["metric"], "vanished")
    finally:
        gate.release(60)  # a failed wait leaves no reader held
        dashboard.stop()
        proc.terminate()
        proc.wait(10)
