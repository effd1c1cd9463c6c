"""``steadytune <verb>``: discovers the subcommands and dispatches to them."""

from __future__ import annotations

import time

# When this process began, as near as it can tell (before the imports below): a run's goodput starts here.
# The kernel's own start time (psutil) is rounded to the boot second and may read up to a second early.
STARTED_TS = time.time()

import argparse  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import pkgutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import steadytune  # noqa: E402
import steadytune.cli as cli_pkg  # noqa: E402
from steadytune.regularfile import NotRegularFile  # noqa: E402

EPILOG = """\
examples:
  steadytune demo                         # tiny model, offline, supervised, < 2 min
  steadytune validate examples/lora.yaml  # every config error at once
  steadytune run examples/lora.yaml max_steps=50
  steadytune analyze trainer_state.json   # detect anomalies in any run's logs

exit codes: 0 ok, 1 failure, 2 usage error
"""


def _modules() -> list[str]:
    names = sorted(info.name for info in pkgutil.iter_modules(cli_pkg.__path__))
    return [n for n in names if n != "main" and not n.startswith("_")]


def command_word(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), if any.

    None when the top-level help is asked for first (``steadytune -h analyze``): it lists every command.
    """
    for arg in argv:
        if arg in ("-h", "--help"):
            return None
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or, given the subcommand about to run, one that imports only its module.

    Importing every subcommand module costs more than some commands take to run
    (``run`` pulls in the config schema, others the web side), so ``main`` asks
    for the one it needs; an unknown word, ``--help`` or a module that does not
    register that name fall back to all of them.
    """
    parser = argparse.ArgumentParser(
        prog="steadytune",
        description="Keeps LLM fine-tuning runs, and the servers they run on, steady.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"steadytune {steadytune.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    modules = _modules()
    wanted = command.replace("-", "_") if command else None
    if wanted in modules:
        _register(sub, wanted)
        if command in sub.choices:
            return parser
        return build_parser()  # the module is named otherwise than its command
    for name in modules:
        _register(sub, name)
    return parser


def _register(sub: argparse._SubParsersAction, name: str) -> None:
    module = importlib.import_module(f"steadytune.cli.{name}")
    register = getattr(module, "register", None)
    if register is not None:
        register(sub)


def parse(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser for ``argv``'s command and what it made of ``argv``; a usage error exits with 2.

    The README's commands are checked through this too (tests/unit/docs), so what it shows parses.
    """
    parser = build_parser(command_word(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:
        # `key=value` overrides may come after options (`run cfg.yaml --quiet a.b=1`).
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return parser, args


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that what it made (a dashboard's cache folder,
    ``analyze``'s unpacked copy of a ``.gz`` log) is cleaned up as after a Ctrl-C. A command that
    handles SIGTERM itself (``run``, ``supervise``, ``server``) sets its own handler over this one."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser, args = parse(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except Terminated:
        print("terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except NotRegularFile as exc:  # a FIFO or a device where a run's file or a log belongs
        print(f"error: {exc.filename}: {exc.strerror}; steadytune reads only regular files", file=sys.stderr)
        return 1


def entrypoint() -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        try:
            code: int | str | None = main()
        except SystemExit as done:  # argparse's --help and errors end this way
            code = done.code
        finally:
            sys.stdout.flush()  # a pipe's reader that left shows up here, while we can still catch it
    except BrokenPipeError:
        # `steadytune queue | head -1`: the reader left, which is not an error of ours. Point
        # stdout at /dev/null so the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141  # 128 + SIGPIPE, as a shell reports a command the pipe cut short
    sys.exit(code)


if __name__ == "__main__":
    entrypoint()
