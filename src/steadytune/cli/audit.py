"""``steadytune audit verify RUN``: prove the event log is complete and untouched."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, fail, print_help_status


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
        description="Walk the hash chain of RUN/events.jsonl and check each entry's MAC with the audit key: "
        "reports OK, or the first line where it breaks (edited, deleted, reordered, forged, unsigned). "
        "Truncation is checked against the log's anchor (and the last entry run.db recorded). The key and "
        "the anchors live outside the run folder, in --audit-dir. Also checks that config.yaml holds no "
        "unredacted secret. Exit code 1 when anything fails.",
    )
    v.add_argument("run", help="the run directory (runs/<run-id>)")
    v.add_argument(
        "--audit-dir",
        type=Path,
        help="where the audit key and the anchors are (default: $STEADYTUNE_AUDIT_DIR, else "
        "~/.config/steadytune)",
    )
    v.add_argument(
        "--allow-unanchored",
        action="store_true",
        help="accept a log without an anchor (written on another machine, or before anchors existed): "
        "its tail is then not checked",
    )
    v.add_argument(
        "--allow-unkeyed",
        action="store_true",
        help="accept entries without a MAC, or no key to check them with: only the bare chain is then "
        "checked, which anyone who can write the run folder can recompute",
    )
    add_format(v)
    v.set_defaults(func=verify_main)
    p.set_defaults(func=lambda args: print_help_status(p))


def unredacted_secrets(config_text: str | bytes) -> list[str]:
    """Dotted keys of config values that look secret and are stored in clear."""
    import yaml

    from steadytune.config.yamlsafe import load_yaml
    from steadytune.redact import redact

    try:
        data = load_yaml(config_text)
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
        elif red != raw:
            found.append(path)

    walk(data, redact(data), "")
    return found


_WHERE = {"forged": "key", "unsigned": "key", "no key": "key", "truncated": "tail", "unanchored": "tail"}


def verify_main(args: argparse.Namespace) -> int:
    from steadytune.forensics.audit import verify_run
    from steadytune.forensics.runview import ForensicsError, resolve_run
    from steadytune.telemetry.attest import AuditKeyError, AuditTrust

    try:
        run = resolve_run(args.run)
    except ForensicsError as exc:
        return fail(str(exc), 2)
    try:
        trust = AuditTrust.open(args.audit_dir)
    except AuditKeyError as exc:
        return fail(str(exc), 2)
    res = verify_run(run, trust, allow_unkeyed=args.allow_unkeyed, allow_unanchored=args.allow_unanchored)
    secrets = unredacted_secrets(run.config.read_bytes()) if run.config.exists() else []
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
        if res.keyed:
            signed = res.entries - res.unsigned_entries
            print(
                f"key: OK — {signed} entr{'y' if signed == 1 else 'ies'} signed with key {res.key_id} "
                f"({res.key_path})"
                + (
                    f"; {res.unsigned_entries} unsigned, accepted (--allow-unkeyed)"
                    if res.unsigned_entries
                    else ""
                )
            )
        else:
            print(f"key: not checked — no audit key at {res.key_path} (accepted: --allow-unkeyed)")
    else:
        print(f"{_WHERE.get(res.problem, 'chain')}: FAILED — {res.problem}: {res.message}")
    if res.torn_lines:
        print(
            f"note: torn line(s) {', '.join(map(str, res.torn_lines))} skipped (a crash mid-write, not "
            f"tampering)"
        )
    if res.long_lines:
        print(
            f"note: line(s) {', '.join(map(str, res.long_lines))} skipped unread: longer than the "
            f"reader's bound"
        )
    if res.ok:
        print(f"tail: {'OK — ' if res.truncation_checked else 'not checked — '}{res.truncation_note}")
        if res.store_checked:
            print(f"run.db: OK — {res.store_note}")
    print(
        "secrets: OK — no secret stored in clear in config.yaml"
        if not secrets
        else f"secrets: FAILED — stored in clear in config.yaml: {', '.join(secrets)}"
    )
    print("verdict: OK" if ok else "verdict: FAILED")
    return 0 if ok else 1
