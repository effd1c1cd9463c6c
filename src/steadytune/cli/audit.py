"""``steadytune audit verify RUN``: prove the event log is complete and untouched."""

from __future__ import annotations

import argparse
import json
from typing import Any

from steadytune.cli._common import add_command, fail


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "audit",
        "check a run's audit trail (hash-chained events.jsonl)",
        "steadytune audit verify runs/my-run",
    )
    inner = p.add_subparsers(dest="audit_command", metavar="<check>")
    v = add_command(
        inner,
        "verify",
        "verify the hash chain of events.jsonl and that its tail was not cut off",
        "steadytune audit verify runs/my-run --format json",
        description="Walk the hash chain of RUN/events.jsonl: reports OK, or the first line where the chain "
        "breaks (edited, deleted or reordered). Truncation is checked against the last entry run.db recorded. "
        "Also checks that config.yaml holds no unredacted secret. Exit code 1 when anything fails.",
    )
    v.add_argument("run", help="the run directory (runs/<run-id>)")
    v.add_argument("--format", choices=("text", "json"), default="text")
    v.set_defaults(func=verify_main)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def unredacted_secrets(config_text: str) -> list[str]:
    """Dotted keys of config values that look secret and are stored in clear."""
    import yaml

    from steadytune.config.load import redact

    try:
        data = yaml.safe_load(config_text)
    except yaml.YAMLError:
        return []
    found: list[str] = []

    def walk(raw: Any, red: Any, path: str) -> None:
        if isinstance(raw, dict) and isinstance(red, dict):
            for k in raw:
                walk(raw[k], red.get(k), f"{path}.{k}" if path else str(k))
        elif isinstance(raw, list) and isinstance(red, list):
            for i, (a, b) in enumerate(zip(raw, red, strict=True)):
                walk(a, b, f"{path}[{i}]")
        elif red == "***" and raw != "***":
            found.append(path)

    walk(data, redact(data), "")
    return found


def verify_main(args: argparse.Namespace) -> int:
    from steadytune.forensics.audit import verify_run
    from steadytune.forensics.runview import ForensicsError, resolve_run

    try:
        run = resolve_run(args.run)
    except ForensicsError as exc:
        return fail(str(exc), 2)
    res = verify_run(run)
    secrets = unredacted_secrets(run.config.read_text(encoding="utf-8")) if run.config.exists() else []
    ok = res.ok and not secrets
    if args.format == "json":
        print(
            json.dumps(
                {**res.to_dict(), "ok": ok, "chain_ok": res.ok, "unredacted_secrets": secrets}, indent=1
            )
        )
        return 0 if ok else 1
    if res.ok:
        print(
            f"chain: OK — {res.entries} entries, seq 0-{res.last_seq}, last hash {str(res.last_hash)[:16]}…"
        )
    else:
        print(f"chain: FAILED — {res.problem}: {res.message}")
    if res.torn_lines:
        print(
            f"note: torn line(s) {', '.join(map(str, res.torn_lines))} skipped (a crash mid-write, not tampering)"
        )
    if res.long_lines:
        print(
            f"note: line(s) {', '.join(map(str, res.long_lines))} skipped unread: longer than the reader's bound"
        )
    if res.ok:
        print(f"tail: {'OK — ' if res.truncation_checked else 'not checked — '}{res.truncation_note}")
    print(
        "secrets: OK — no secret stored in clear in config.yaml"
        if not secrets
        else f"secrets: FAILED — stored in clear in config.yaml: {', '.join(secrets)}"
    )
    print("verdict: OK" if ok else "verdict: FAILED")
    return 0 if ok else 1
