"""The numbers of a dict printed inside a text log's line, read without evaluating it.

A script that logs ``rl_loss: 0.1, reward_data: {'total_num': 256, 'total_reward': 144.0}``
prints a Python (or JSON) dict after its key. Its numbers belong to that key: they are read
as ``reward_data.total_num`` and ``reward_data.total_reward``, so a per-sample
``reward: {'reward': 1.0}`` printed on another line never poses as the batch's reward, and
the keys of two dicts never overwrite each other.

The text is a log's, so possibly a hostile file's: it is scanned here, never ``eval``'d nor
handed to a parser that builds objects. Only numbers are kept; strings, booleans, ``None``
and lists inside the dict are skipped. A wrapped number (``tensor(0.29, device='cuda:0')``,
``np.float64(0.5)``) is its first argument. Anything else that a literal cannot hold, a
dict nested deeper than :data:`MAX_DEPTH` or one left open, makes the whole dict unreadable
(None), and the line is read as if it held none.
"""

from __future__ import annotations

import re

__all__ = ["MAX_DEPTH", "Number", "parse_dict"]

MAX_DEPTH = 8

# (flattened key, value, where the number is in the text)
Number = tuple[str, float, tuple[int, int]]

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])|[-+]?(?:nan|inf)\b", re.I)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_NAME = re.compile(r"[A-Za-z_][\w.]*")
_SPACE = re.compile(r"\s*")
# A call whose first argument is the value: torch's tensor(...), numpy's np.float64(...).
_WRAPPER = re.compile(r"(?:torch\.)?tensor\(|(?:np|numpy)\.\w+\(|float\(")


class _Unreadable(Exception):
    """The text is not a dict this module reads."""


def parse_dict(text: str, start: int, prefix: str) -> tuple[list[Number], int] | None:
    """The numbers of the dict opening at ``text[start]`` (a ``{``), each under
    ``prefix.key`` (``prefix.key.inner`` when nested), and the index just past its ``}``.
    None when the text there is not such a dict."""
    try:
        out: list[Number] = []
        end = _dict(text, start, prefix, out, 1)
    except (_Unreadable, IndexError):
        return None
    return out, end


def _skip(text: str, i: int) -> int:
    return _SPACE.match(text, i).end()  # type: ignore[union-attr]  # \s* always matches


def _dict(text: str, i: int, prefix: str, out: list[Number], depth: int) -> int:
    if depth > MAX_DEPTH or text[i] != "{":
        raise _Unreadable
    i = _skip(text, i + 1)
    if text[i] == "}":
        return i + 1
    while True:
        key, i = _key(text, i)
        i = _skip(text, i)
        if text[i] != ":":
            raise _Unreadable
        i = _value(text, _skip(text, i + 1), f"{prefix}.{key}", out, depth)
        i = _skip(text, i)
        if text[i] == "}":
            return i + 1
        if text[i] != ",":
            raise _Unreadable
        i = _skip(text, i + 1)
        if text[i] == "}":  # a trailing comma
            return i + 1


def _key(text: str, i: int) -> tuple[str, int]:
    m = _STRING.match(text, i) or _NAME.match(text, i) or _NUMBER.match(text, i)
    if m is None:
        raise _Unreadable
    key = m.group()
    if key[0] in "'\"":
        key = key[1:-1]
    return key.strip(), m.end()


def _value(text: str, i: int, key: str, out: list[Number], depth: int) -> int:
    """Past the value at ``i``; a number is appended to ``out`` under ``key``."""
    c = text[i]
    if c == "{":
        return _dict(text, i, key, out, depth + 1)
    if c == "[" or c == "(":
        return _skip_group(text, i, depth)
    if c in "'\"":
        m = _STRING.match(text, i)
        if m is None:
            raise _Unreadable
        return m.end()
    w = _WRAPPER.match(text, i)
    if w is not None:
        j = _skip(text, w.end())
        n = _NUMBER.match(text, j)
        if n is not None:
            out.append((key, float(n.group()), n.span()))
        return _skip_group(text, w.end() - 1, depth)
    n = _NUMBER.match(text, i)
    if n is not None:
        out.append((key, float(n.group()), n.span()))
        return n.end()
    m = _NAME.match(text, i)
    if m is not None and m.group() in ("True", "False", "None", "true", "false", "null"):
        return m.end()
    raise _Unreadable


_CLOSE = {"[": "]", "(": ")", "{": "}"}


def _skip_group(text: str, i: int, depth: int) -> int:
    """Past the bracketed group opening at ``i`` (a list, a call's arguments), strings respected."""
    stack = [_CLOSE[text[i]]]
    i += 1
    while stack:
        c = text[i]
        if c in "'\"":
            m = _STRING.match(text, i)
            if m is None:
                raise _Unreadable
            i = m.end()
            continue
        if c in _CLOSE:
            if len(stack) + depth > MAX_DEPTH:
                raise _Unreadable
            stack.append(_CLOSE[c])
        elif c in ")]}" and c != stack.pop():
            raise _Unreadable
        i += 1
    return i
