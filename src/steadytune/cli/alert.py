"""``steadytune alert test CONFIG``: send a test alert through every configured sink."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail, print_help_status


def register(sub: Any) -> None:
    p = add_command(
        sub, "alert", "alert tools: test the configured sinks", "steadytune alert test config.yaml"
    )
    verbs = p.add_subparsers(dest="alert_command", metavar="<verb>")
    t = verbs.add_parser("test", help="send a test alert through every sink of CONFIG's `alerts:` section")
    t.add_argument(
        "config", type=Path, help="a steadytune config (its `alerts:` section) or an alerts-only YAML"
    )
    t.add_argument("--run-id", default="alert-test", help="run id shown in the test alert")
    t.add_argument(
        "--show-config", action="store_true", help="print the alerts config (secrets as references)"
    )
    t.set_defaults(func=run_test)
    p.set_defaults(func=lambda args: print_help_status(p))


def load_alerts_section(path: Path) -> dict[str, Any]:
    """The ``alerts:`` section of a run config, or an alerts-only YAML as a whole.

    A run config without ``alerts:`` gets the defaults (the console sink), as its run would:
    its other sections are not alert keys.

    Raises:
        ValueError: not YAML, or not a mapping, named with the file.
    """
    import yaml

    from steadytune.config.alerts import AlertsConfig
    from steadytune.config.yamlsafe import read_yaml

    try:
        data = read_yaml(path) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a YAML mapping")
    if "alerts" in data:
        section = data["alerts"]
    elif set(data) <= set(AlertsConfig.model_fields):
        section = data
    else:
        section = {}
    return section if isinstance(section, dict) else {}


def run_test(args: argparse.Namespace) -> int:
    from steadytune.alerts.router import AlertRouter
    from steadytune.alerts.secrets import SecretError
    from steadytune.config import ConfigError
    from steadytune.config.alerts import AlertsConfig
    from steadytune.config.load import validate_section

    try:
        config = validate_section(AlertsConfig, "alerts", load_alerts_section(args.config), str(args.config))
    except OSError as exc:
        return fail(f"cannot read {args.config}: {exc.strerror}", 2)
    except ConfigError as exc:
        return fail(exc.render(), 2)
    except ValueError as exc:
        return fail(str(exc), 2)
    if args.show_config:
        print(json.dumps(config.redacted_dump(), indent=2))
    try:
        router = AlertRouter(config, None, run_id=args.run_id, start=False)
    except SecretError as exc:
        return fail(exc.render(), 2)
    results = router.send_test()
    for sink in router.sinks:
        where = sink.describe() if hasattr(sink, "describe") else sink.name
        err = results.get(sink.name)
        print(f"  {'ok  ' if err is None else 'FAIL'} {sink.name}: {where}" + (f" — {err}" if err else ""))
    failed = sum(1 for e in results.values() if e is not None)
    print(f"{len(results) - failed} of {len(results)} sink(s) delivered the test alert")
    return 1 if failed else 0
