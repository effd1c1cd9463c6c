"""``steadytune <verb>``: discovers the subcommands and dispatches to them."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import steadytune
import steadytune.cli as cli_pkg

EPILOG = """\
examples:
  steadytune demo                         # tiny model, offline, supervised, < 2 min
  steadytune validate examples/lora.yaml  # every config error at once
  steadytune run examples/lora.yaml max_steps=50
  steadytune analyze trainer_state.json   # detect anomalies in any run's logs

exit codes: 0 ok, 1 failure, 2 usage error
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="steadytune",
        description="Keeps LLM fine-tuning runs, and the servers they run on, steady.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"steadytune {steadytune.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name in {"main"} or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"steadytune.cli.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # `key=value` overrides may come after options (`run cfg.yaml --quiet a.b=1`).
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
