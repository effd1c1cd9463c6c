"""Helpers shared by the subcommand modules."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
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


def add_overrides(p: argparse.ArgumentParser, example: str = "train.max_steps=50") -> None:
    """The optional ``key=value`` overrides of a config. The default makes them optional in the
    usage error too: without it argparse lists ``key=value`` among the required arguments."""
    p.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help=f"override config keys, e.g. {example}"
    )


def add_format(p: argparse.ArgumentParser) -> None:
    """The ``--format`` every command that prints a report takes."""
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text to read, json for scripts (default text)",
    )


def add_socket(p: argparse.ArgumentParser) -> None:
    """The ``--socket`` of the GPU server the client commands talk to."""
    p.add_argument(
        "--socket",
        type=Path,
        default=None,
        help="the server's socket (default: server.sock in $STEADYTUNE_SERVER_DIR, "
        "else ~/.local/state/steadytune/server)",
    )


def print_help_status(parser: argparse.ArgumentParser) -> int:
    """A command group called without its subcommand: its help, and exit status 2."""
    parser.print_help()
    return 2


def fail(message: str, code: int = 1) -> int:
    """Print an error for the user and return the exit code to use."""
    print(f"error: {message}", file=sys.stderr)
    return code


# The width of what is written to a pipe or a log: no terminal's to follow, and rich's 80 columns
# squeezed a table to a word a line and cut numbers in two (``threshold_ratio=1.1`` / ``4``).
PIPE_WIDTH = 160


def console(**kwargs: Any) -> Console:
    """A rich Console for a command's output.

    Its reader leaving early (``steadytune ... | head``) ends the command as every other write
    does: ``entrypoint`` turns it into exit status 141, no traceback (rich's own handler exits
    with status 1, which says the command failed). Writing to a pipe or a file, it is
    :data:`PIPE_WIDTH` wide unless ``COLUMNS`` or ``width`` says otherwise.
    """
    from rich.console import Console

    class _PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    out = _PipeConsole(**kwargs)
    if "width" not in kwargs and not out.is_terminal and not os.environ.get("COLUMNS"):
        out.width = PIPE_WIDTH
    return out
