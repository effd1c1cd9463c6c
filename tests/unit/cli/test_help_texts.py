"""Every option and argument of every subcommand says in ``--help`` what it is for."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from steadytune.cli.main import build_parser


def _parsers(
    parser: argparse.ArgumentParser, name: str = "steadytune"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _parsers(child, f"{name} {sub}")


def _silent(parser: argparse.ArgumentParser, name: str) -> list[str]:
    return [
        f"{name} {'/'.join(a.option_strings) or a.dest}"
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help
    ]


def test_every_option_of_every_subcommand_has_help() -> None:
    silent = [line for name, parser in _parsers(build_parser()) for line in _silent(parser, name)]
    assert silent == []


def test_the_walk_finds_an_option_without_help() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    child = sub.add_parser("x")
    child.add_argument("--quiet-one")
    child.add_argument("--said", help="says")
    assert [line for name, p in _parsers(parser, "t") for line in _silent(p, name)] == ["t x --quiet-one"]


def test_every_socket_option_states_its_default() -> None:
    for name, parser in _parsers(build_parser()):
        for action in parser._actions:
            if "--socket" in action.option_strings:
                assert "default" in (action.help or ""), name
