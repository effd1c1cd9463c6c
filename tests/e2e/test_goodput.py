"""One run's goodput, four ways: `steadytune goodput`, the dashboard's panel in a real Chromium, /metrics
through promtool, and the goodput alert through `promtool test rules`, all with the same figures.

The runs are written as a supervisor and its worker write them (plan revisions, rank 0's stream,
events), over a timeline built span by span; the real runs' accounts are checked in
tests/integration (test_recovery.py, test_rollback_skip.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from chromium import open_chromium, screenshot, wait_js
from tests.unit.goodput.history import Run
from tests.waiting import ANSWER_S

from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.server import DashboardHandle

pytestmark = pytest.mark.slow
STEADYTUNE = str(Path(sys.executable).parent / "steadytune")
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
SAMPLE = re.compile(r"^(steadytune_[a-z_]+)\{([^}]*)\} (\S+)$")


def steady(run: Run) -> Run:
    run.plan(0, "start").event("run_started").launch(0, "startup", load_s=30.0)
    for n in range(1, 101):
        run.step(n, 0, 20.0)
        if n % 25 == 0:
            run.save(0, 4.0)
    run.exit(0, "completed").spend("shutdown", 3.0)
    return run.event("run_completed")


def bumpy(run: Run) -> Run:
    """A crash after step 60 (checkpoint 50), a hang at step 90 caught after ten minutes."""
    run.plan(0, "start").event("run_started").launch(0, "startup", load_s=60.0)
    for n in range(1, 61):
        run.step(n, 0, 20.0, "redone" if n > 50 else "productive")
        if n % 25 == 0:
            run.save(0, 4.0)
    run.spend("redone", 7.0).event("restart", "action", classification="killed")
    run.spend("restart", 2.0).plan(1, "killed", resume=50).launch(1, "restart", load_s=40.0, resume=50)
    for n in range(51, 91):
        run.step(n, 1, 20.0, "redone" if n > 75 else "productive")
        if n % 25 == 0:
            run.save(1, 4.0)
    run.spend("hang", 600.0).event("stall", "anomaly").spend("hang", 2.0)
    run.event("restart", "action", classification="stall")
    run.plan(2, "stall", resume=75).launch(2, "restart", load_s=40.0, resume=75)
    for n in range(76, 101):
        run.step(n, 2, 20.0)
    run.exit(2, "completed").spend("shutdown", 3.0)
    return run.event("run_completed")


def write(runs: Path, run_id: str, run: Run) -> None:
    rd = RunDir(runs / run_id).create()
    for path, records in ((rd.plan, run.plans), (rd.telemetry(0), run.stream), (rd.events, run.events)):
        with JsonlWriter(path) as w:
            for rec in records:
                w.write(rec)
    atomic_write_text(rd.status, json.dumps({"run_id": run_id, "state": "completed", "updated_ts": run.t}))


def cli(runs: Path) -> dict[str, dict]:
    done = subprocess.run([STEADYTUNE, "goodput", str(runs), "--format", "json"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {r["run"]: r for r in json.loads(done.stdout)["runs"]}


def panel(b, url: str) -> dict[str, dict]:
    """Each run's bar on the runs page: its goodput and the seconds of each segment."""
    b.get(url)
    wait_js(b, "return document.querySelectorAll('#goodput-runs [data-run]').length === 2", timeout=30)
    return b.execute_script("""
        const out = {};
        for (const row of document.querySelectorAll('#goodput-runs [data-run]')) {
          const segs = {};
          for (const s of row.querySelectorAll('.gpbar .seg')) segs[s.dataset.part] = s.dataset.seconds;
          out[row.dataset.run] = {goodput: row.dataset.goodput, seconds: segs,
                                  text: row.querySelector('.gp-value').textContent};
        }
        return out;""")


def metrics(dashboard: DashboardHandle, promtool: str) -> dict[tuple[str, str, str], str]:
    """The goodput families of /metrics, after promtool found nothing to say about the exposition."""
    with urllib.request.urlopen(dashboard.url + "metrics", timeout=ANSWER_S) as r:
        text = r.read()
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check
    out = {}
    for line in text.decode().splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels.get("run", ""), labels.get("cause", ""))] = m.group(3)
    return out


def alert_test(path: Path, values: dict[str, tuple[str, str]]) -> None:
    """A `promtool test rules` file feeding each run's scraped goodput and wall time to the alert rule."""
    series, expected = [], []
    for run, (ratio, wall) in values.items():
        series += [
            {"series": f'steadytune_goodput_ratio{{run="{run}"}}', "values": f"{ratio}x20"},
            {"series": f'steadytune_wall_seconds{{run="{run}"}}', "values": f"{wall}+60x20"},
            {"series": f'steadytune_run_state{{run="{run}",state="running"}}', "values": "1x20"},
        ]
        if float(ratio) < 0.8:
            summary = f"Run {run} turns only {'%.4g' % (100 * float(ratio))}% of its time into training"
            notes = {"summary": summary, "description": DESCRIPTION}
            expected.append({"exp_labels": {"severity": "warning", "run": run}, "exp_annotations": notes})
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "11m", "alertname": "SteadytuneGoodputLow", "exp_alerts": expected}
                ],
                "promql_expr_test": [
                    {
                        "expr": "steadytune_goodput_ratio",
                        "eval_time": "0m",
                        "exp_samples": [
                            {"labels": f'steadytune_goodput_ratio{{run="{run}"}}', "value": float(ratio)}
                            for run, (ratio, _) in values.items()
                        ],
                    }
                ],
            }
        ],
    }
    path.write_text(json.dumps(test))  # JSON is YAML


DESCRIPTION = (
    "Goodput under 80 %: `steadytune goodput` on the run (or the dashboard's goodput panel) names what took "
    "the rest: restarts, redone work, hangs, saves, pauses or the queue."
)


def test_the_cli_the_panel_metrics_and_the_alert_agree(
    chromium: tuple[str, str],
    prometheus_bins: tuple[str, str],
    runs_dir: Path,
    dashboard: DashboardHandle,
    tmp_path: Path,
    artifacts: Path,
) -> None:
    # Runs that ended within the last hours: /metrics carries a finished run's series for
    # --metrics-keep-finished-hours (24) after its end, then only counts it.
    t0 = float(int(time.time()) - 30_000)
    write(runs_dir, "steady", steady(Run(t0)))
    built = bumpy(Run(t0 + 10_000.0))
    write(runs_dir, "bumpy", built)
    shown = cli(runs_dir)
    # The CLI says what the construction meant: each part's seconds.
    assert {p: round(v, 6) for p, v in shown["bumpy"]["seconds"].items() if v} == {
        p: round(v, 6) for p, v in built.want.items()
    }
    with open_chromium(*chromium) as b:
        bars = panel(b, dashboard.url)
        screenshot(b, artifacts / "goodput-panel.png")
    scraped = metrics(dashboard, prometheus_bins[1])
    for run, acct in shown.items():
        assert float(bars[run]["goodput"]) == acct["goodput"]
        assert bars[run]["text"] == f"{100 * acct['goodput']:.1f} %"
        assert {p: float(v) for p, v in bars[run]["seconds"].items()} == {
            p: v for p, v in acct["seconds"].items() if v > 0
        }
        assert float(scraped[("steadytune_goodput_ratio", run, "")]) == acct["goodput"]
        assert float(scraped[("steadytune_wall_seconds", run, "")]) == acct["wall_s"]
        assert float(scraped[("steadytune_productive_seconds_total", run, "")]) == acct["productive_s"]
        for cause in acct["seconds"]:
            if cause not in ("productive", "eval"):
                assert float(scraped[("steadytune_lost_seconds_total", run, cause)]) == acct["seconds"][cause]
    assert shown["bumpy"]["goodput"] < 0.8 < shown["steady"]["goodput"]  # one run for the alert, one not
    rules = tmp_path / "goodput_test.yml"
    alert_test(rules, {run: (scraped[("steadytune_goodput_ratio", run, "")],
                             scraped[("steadytune_wall_seconds", run, "")]) for run in shown})  # fmt: skip
    done = subprocess.run([prometheus_bins[1], "test", "rules", str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
