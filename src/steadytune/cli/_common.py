"""Helpers shared by the subcommand modules."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_command(
    sub: Any, name: str, help: str, example: str, description: str | None = None
) -> argparse.ArgumentParser:
    """Add a subcommand parser whose ``--help`` ends with a runnable example."""
    return sub.add_parser(
        name,
        help=help,
        description=description or help,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def print_help_status(parser: argparse.ArgumentParser) -> int:
    """A command group called without its subcommand: its help, and exit status 2."""
    parser.print_help()
    return 2


def fail(message: str, code: int = 1) -> int:
    """Print an error for the user and return the exit code to use."""
    print(f"error: {message}", file=sys.stderr)
    return code
