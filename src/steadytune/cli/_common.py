"""Helpers shared by the subcommand modules."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


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


def console(**kwargs: Any) -> Console:
    """A rich Console whose reader leaving early (``steadytune ... | head``) ends the command as
    every other write does: ``entrypoint`` turns it into exit status 141, no traceback.

    rich's own handler exits with status 1, which says the command failed.
    """
    from rich.console import Console

    class _PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _PipeConsole(**kwargs)
