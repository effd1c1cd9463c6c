"""``steadytune cache ls|clean``: the tokenized-data cache, shared by every run on this machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, fail
from steadytune.cli._common import console as _console

DESCRIPTION = """\
Tokenized datasets are cached under $STEADYTUNE_DATA_CACHE (default
$STEADYTUNE_CACHE/data, i.e. ~/.cache/steadytune/data), keyed by the data file's
content, the tokenizer, the prompt template and the sequence length, so runs and
restarts on the same data skip tokenizing. `ls` shows each entry; `clean` removes
entries unused for longer than --older-than, then the least recently used until the
rest fits in --max-size (partial builds older than an hour always go).

more examples:
  steadytune cache ls --format json
  steadytune cache clean --older-than 14d
  steadytune cache clean --max-size 5GiB --dry-run

exit codes: 0 ok, 2 usage error
"""


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "cache",
        "list or clean the tokenized-data cache",
        "steadytune cache clean --max-size 10GiB --older-than 30d",
        DESCRIPTION,
    )
    verbs = p.add_subparsers(dest="verb", metavar="{ls,clean}")
    ls = verbs.add_parser("ls", help="list cache entries: key, size, age, last use, source file")
    add_format(ls)
    clean = verbs.add_parser("clean", help="remove entries by age and/or total size")
    clean.add_argument("--max-size", dest="max_size", help="keep the cache at or under this size, e.g. 10GiB")
    clean.add_argument(
        "--older-than", dest="older_than", help="remove entries unused for longer, e.g. 30d, 12h"
    )
    clean.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    add_format(clean)
    p.set_defaults(func=main, parser=p)


def cache_dir() -> Path:
    from steadytune.train.data import data_cache_dir

    return data_cache_dir()


def _row(e: Any, now: float) -> dict[str, Any]:
    return {
        "key": e.key,
        "path": str(e.path),
        "size_bytes": e.size_bytes,
        "age_s": round(now - e.created, 1),
        "last_used_s": round(now - e.last_used, 1),
        "source": e.source,
        "samples": e.samples,
        "max_seq_length": e.max_seq_length,
        "tokenizer": e.tokenizer,
        "partial": e.partial,
    }


def _print_table(entries: list[Any], now: float, title: str) -> None:
    from rich.table import Table

    from steadytune.estimate import format_bytes
    from steadytune.preflight.cache import format_age

    table = Table(title=title, title_justify="left")
    for col in ("key", "size", "age", "last used", "samples", "seq", "source"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(
            e.key + (" (partial)" if e.partial else ""),
            format_bytes(e.size_bytes),
            format_age(now - e.created),
            format_age(now - e.last_used),
            str(e.samples or "?"),
            str(e.max_seq_length or "?"),
            e.source or "? (built before meta.json)",
        )
    console = _console(highlight=False)
    console.print(table)


def main(args: argparse.Namespace) -> int:
    from steadytune.estimate import format_bytes, parse_bytes
    from steadytune.preflight import cache

    where = cache_dir()
    now = cache.now()
    if args.verb is None:
        args.parser.print_help()
        return 2
    entries = cache.list_entries(where)
    if args.verb == "ls":
        total = sum(e.size_bytes for e in entries)
        if args.format == "json":
            print(
                json.dumps(
                    {"dir": str(where), "total_bytes": total, "entries": [_row(e, now) for e in entries]}
                )
            )
        else:
            _print_table(entries, now, f"{where}: {len(entries)} entries, {format_bytes(total)}")
        return 0
    if args.max_size is None and args.older_than is None:
        return fail("cache clean needs --max-size and/or --older-than (e.g. --older-than 30d)", 2)
    try:
        max_size = parse_bytes(args.max_size) if args.max_size is not None else None
        older = cache.parse_duration(args.older_than) if args.older_than is not None else None
    except ValueError as exc:
        return fail(str(exc), 2)
    doomed = cache.select_for_removal(entries, now, max_size, older)
    freed = 0 if args.dry_run else cache.remove(doomed)
    left = sum(e.size_bytes for e in entries) - sum(e.size_bytes for e in doomed)
    if args.format == "json":
        print(
            json.dumps(
                {
                    "dir": str(where),
                    "dry_run": args.dry_run,
                    "removed": [_row(e, now) for e in doomed],
                    "freed_bytes": freed,
                    "remaining_bytes": left,
                }
            )
        )
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for e in doomed:
        print(
            f"{verb} {e.key} ({format_bytes(e.size_bytes)}, last used "
            f"{cache.format_age(now - e.last_used)} ago, "
            f"{e.source or 'source unknown'})"
        )
    size = sum(e.size_bytes for e in doomed)
    print(
        f"{verb} {len(doomed)} of {len(entries)} entries, {format_bytes(size)}; {format_bytes(left)} "
        f"left in {where}"
    )
    return 0
