"""Reading YAML that someone else may have written: the safe loader, bounded.

Every YAML steadytune reads (a config, a run folder's or a bundle's ``config.yaml``, an override
value) goes through :func:`load_yaml`. PyYAML's safe loader builds no Python object a tag names,
but it shares an aliased node instead of copying it, so a 6 KB "billion laughs" (nine levels of
nine aliases) loads in a millisecond as a value that is 387 million strings long to whatever walks
it next: validation and the error's ``repr`` took ``validate`` past 3 GB. And a document nested
100,000 deep ends the constructor in ``RecursionError``. So, while the document is composed:

- at most :attr:`YamlLimits.max_depth` levels of nesting;
- at most :attr:`YamlLimits.max_aliases` aliases;
- at most :attr:`YamlLimits.max_nodes` nodes *with every alias expanded*, counted as the alias
  would be copied (that is what catches the laughs, whatever the number of aliases);
- at most :attr:`YamlLimits.max_bytes` of text.

A document over a limit raises :class:`YamlTooLarge`, a ``yaml.YAMLError``, so every caller's
existing ``except yaml.YAMLError`` reports it as the bad YAML it is. So does every other failure
to read one, as :class:`YamlUnreadable`: text that is not UTF-8, and a value its constructor
refuses with a ``ValueError`` (an integer past Python's 4,300 digits, a date such as
``2024-13-45``), which reached callers as the traceback they did not expect.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from steadytune import regularfile


@dataclass(frozen=True)
class YamlLimits:
    """What one document may hold; a run config needs a small fraction of each."""

    max_depth: int = 64
    max_aliases: int = 1_000
    max_nodes: int = 200_000
    max_bytes: int = 8 << 20


class YamlTooLarge(yaml.YAMLError):
    """A document over a :class:`YamlLimits` limit; the message names the limit and where it broke.

    Attributes:
        problem: what callers show of a YAMLError.
        fix: what to do, where it is not the aliases' and nesting's (a file too large), else None.
    """

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.problem = message
        self.fix = fix


class YamlUnreadable(yaml.YAMLError):
    """A document that cannot be read, said in the terms callers show of a ``yaml.YAMLError``.

    Attributes:
        problem: what is wrong, one line.
        problem_mark: where (``.line`` and ``.column`` from 0), or None.
        key: the dotted key whose value it is (``train.max_steps``), where known.
        value: the offending text, where there is one.
        fix: what to write instead.
    """

    def __init__(
        self, problem: str, mark: Any = None, key: str | None = None, value: str | None = None, fix: str = ""
    ) -> None:
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        named = f"{key}: " if key else ""
        super().__init__(f"{where}{named}{problem}" + (f"; {fix}" if fix else ""))
        self.problem = problem
        self.problem_mark = mark
        self.key = key
        self.value = value
        self.fix = fix


class _Mark(NamedTuple):
    """Where, as a ``yaml.Mark`` says it (from 0), for a failure found before the parser ran."""

    line: int
    column: int


def _not_utf8(data: bytes, e: UnicodeDecodeError) -> YamlUnreadable:
    line = data.count(b"\n", 0, e.start)
    mark = _Mark(line, e.start - (data.rfind(b"\n", 0, e.start) + 1))
    return YamlUnreadable(f"not UTF-8 text (byte 0x{data[e.start]:02x})", mark, fix="save the file as UTF-8")


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str, limits: YamlLimits) -> None:
        super().__init__(stream)
        self._limits = limits
        self._depth = 0
        self._aliases = 0
        self._weights: dict[int, int] = {}  # id(node) -> its node count with every alias expanded
        self._keys: dict[int, str] = {}  # id(value node) -> its dotted key, to name it in an error
        self._path: list[str] = []  # the keys of the mappings being composed

    def _refuse(self, what: str) -> YamlTooLarge:
        mark = self.peek_event().start_mark if self.check_event() else None
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        return YamlTooLarge(f"{what}{where}; a config needs none of that, so it is refused unread")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self._limits.max_aliases:
                raise self._refuse(f"more than {self._limits.max_aliases:,} aliases (*name)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > self._limits.max_depth:
            raise self._refuse(f"nested more than {self._limits.max_depth} levels deep")
        keyed = isinstance(index, yaml.ScalarNode)  # a mapping's value: ``index`` is its key
        if keyed:
            self._path.append(str(index.value))
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if keyed:
                self._path.pop()
        weight = 1
        if isinstance(node, yaml.SequenceNode):
            weight += sum(self._weights.get(id(child), 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            weight += sum(self._weights.get(id(k), 1) + self._weights.get(id(v), 1) for k, v in node.value)
        if weight > self._limits.max_nodes:
            raise self._refuse(
                f"more than {self._limits.max_nodes:,} values once its aliases are expanded "
                "(nested aliases, a 'billion laughs')"
            )
        self._weights[id(node)] = weight
        if keyed:
            self._keys[id(node)] = ".".join((*self._path, str(index.value)))
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError as e:
            raise self._refused_value(node, e) from None

    def _refused_value(self, node: Any, e: ValueError) -> YamlUnreadable:
        key = self._keys.get(id(node))
        text = str(node.value)
        if node.tag == "tag:yaml.org,2002:int":
            digits = sum(c.isdigit() for c in text)
            return YamlUnreadable(
                f"an integer of {digits:,} digits, more than the {sys.get_int_max_str_digits():,} "
                "Python reads",
                node.start_mark,
                key,
                text,
                "write a smaller number, or quote it to keep it as text",
            )
        return YamlUnreadable(
            f"cannot be read as a {node.tag.rpartition(':')[2]} ({str(e).splitlines()[0]})",
            node.start_mark,
            key,
            text,
            "correct the value, or quote it to keep it as text",
        )


def load_yaml(text: str | bytes, limits: YamlLimits | None = None) -> Any:
    """The one YAML document in ``text``, as plain Python values (safe tags only), bounded.

    Raises:
        yaml.YAMLError: not valid YAML, over a limit (:class:`YamlTooLarge`), or not readable
            (:class:`YamlUnreadable`: not UTF-8, a value its type refuses).
    """
    limits = limits or YamlLimits()
    if len(text) > limits.max_bytes:
        raise YamlTooLarge(f"{len(text):,} bytes, more than the {limits.max_bytes:,} a document may have")
    if isinstance(text, bytes):
        data = text
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _not_utf8(data, e) from None
    loader = _BoundedLoader(text, limits)
    try:
        return loader.get_single_data()
    except RecursionError:  # the limits keep the loader shallow; this is only a last guard
        raise YamlTooLarge("nested too deep to read") from None
    finally:
        loader.dispose()


def read_yaml(path: Path | str, limits: YamlLimits | None = None) -> Any:
    """:func:`load_yaml` of a regular file, read no further than the size limit.

    Through the one opener of files someone else may have put there: a FIFO would wait for a
    writer for good, and a link to ``/dev/zero`` reports a size of 0 and never ends (read whole,
    it took ``validate`` to 10 GB and an OOM kill).

    Raises:
        NotRegularFile: the path is a FIFO, a device, a socket or a folder (an ``OSError``).
        OSError: the file cannot be read.
        yaml.YAMLError: as :func:`load_yaml` (the caller names the file).
    """
    limits = limits or YamlLimits()
    path = Path(path)
    try:
        data = regularfile.read_bytes(path, limits.max_bytes)
    except regularfile.FileTooLarge:
        raise YamlTooLarge(
            f"{path} is more than the {limits.max_bytes:,} bytes a file may have",
            fix="a config is a few kilobytes: pass the config, not a data or model file",
        ) from None
    return load_yaml(data, limits)
