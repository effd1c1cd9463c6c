"""The alert rules and the Grafana dashboard name only families /metrics exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from steadytune.web.metrics import SPEC

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
NAME = re.compile(r"\bsteadytune_[a-z_]+")
EXPOSED = {f"steadytune_{name}" for name, *_ in SPEC} | {"steadytune_dashboard_scrape_duration_seconds"}


def test_every_family_the_rules_and_the_dashboard_use_is_exposed() -> None:
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    dashboard = json.loads((DEPLOY / "grafana" / "steadytune.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    used = set(NAME.findall(rules)) | set(NAME.findall(exprs))
    assert used - EXPOSED == set()
    assert {"steadytune_goodput_ratio", "steadytune_lost_seconds_total"} <= used
