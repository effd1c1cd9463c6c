"""A detector's state as plain JSON: what a restart's replay starts from instead of the run's start.

A restart rebuilds the detectors by replaying the run's step records up to the resume step
(:func:`~steadytune.supervise.restarts.replay_detector`). Its cost grew with the run (~8 s of CPU
per 100k steps), so each replay leaves the state it built beside the run, and the next one starts
from the newest state it can trust and reads only what the streams gained since.

The state is the detector's object graph written as JSON, never pickled: reading it runs no code
of the file's. Only classes of the detection modules (:data:`MODULES`) are named, made without
calling them (their attributes set one by one), and a method is only a method its class defines.
A hostile file can at worst give a detector wrong numbers, and it must first get past the checks
of :func:`load`: the format, a fingerprint of the detection code (any edit to it, an upgrade
included, makes every saved state stale), the detection config, a checksum of the content, and the
state written again from what was read, which must give the same JSON back.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib
import inspect
import json
import math
import types
from array import array
from collections import deque
from pathlib import Path
from typing import Any

import pydantic

import steadytune

FORMAT = 1
# The modules whose classes a state may name: the detectors, their config and the records they keep.
MODULES = ("steadytune.detect.", "steadytune.config.detect", "steadytune.records", "steadytune.objectives")
_ARRAY_CODES = frozenset("bBhHiIlLqQfd")
MAX_BYTES = 16 << 20  # a detector's state is ~100 KB; a file far past that is no state of ours


class StateError(ValueError):
    """A state that cannot be written, or read back and trusted."""


@functools.cache
def code_fingerprint() -> str:
    """A digest of the source of every module a state may name, and of this one."""
    root = Path(steadytune.__file__).parent
    files = [
        *sorted((root / "detect").glob("*.py")),
        root / "config" / "detect.py",
        root / "records.py",
        root / "objectives.py",
        Path(__file__),
    ]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _allowed(module: str) -> bool:
    return any(module == m.rstrip(".") or module.startswith(m) for m in MODULES)


def _name(obj: Any) -> str:
    module, qual = obj.__module__, obj.__qualname__
    if not _allowed(module) or "<" in qual:
        raise StateError(f"{module}.{qual} is not part of a detector's state")
    return f"{module}:{qual}"


def _resolve(name: Any) -> Any:
    if not isinstance(name, str) or ":" not in name:
        raise StateError(f"bad name {name!r}")
    module, qual = name.split(":", 1)
    if not _allowed(module) or "<" in qual:
        raise StateError(f"{name} is not part of a detector's state")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = inspect.getattr_static(obj, part)
    return obj


class _Encoder:
    """Each object once: a second reference to it is ``{"r": id}`` (detectors share their trackers)."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.alive: list[Any] = []  # an id() is only unique while its object lives

    def _id(self, o: Any) -> int | None:
        """None the first time (and ``o`` gets its id), else the id it got."""
        key = id(o)
        if key in self.ids:
            return self.ids[key]
        self.ids[key] = len(self.ids)
        self.alive.append(o)
        return None

    def _members(self, o: set[Any] | frozenset[Any]) -> list[Any]:
        """A set's members in one order: a set of strings iterates in an order its hashes (random
        per process) and its history choose, and a state read back must encode as it was written."""
        if all(_plain(x) for x in o):
            return sorted((self.enc(x) for x in o), key=_order)
        return [self.enc(x) for x in o]

    def enc(self, o: Any) -> Any:
        if o is None or isinstance(o, (bool, str)):
            return o
        if isinstance(o, int) and type(o) is int:
            return o
        if type(o) is float:
            return o if math.isfinite(o) else {"f": repr(o)}
        if type(o) is tuple:
            return {"t": [self.enc(x) for x in o]}
        if type(o) is frozenset:
            return {"fs": self._members(o)}
        if isinstance(o, enum.Enum):
            return {"e": _name(type(o)), "v": self.enc(o.value)}
        if isinstance(o, type):
            return {"c": _name(o)}
        if isinstance(o, types.FunctionType):
            return {"fn": _name(o)}
        if isinstance(o, types.MethodType):
            return {"m": [self.enc(o.__self__), o.__func__.__name__]}
        if isinstance(o, tuple) and hasattr(o, "_fields"):  # a NamedTuple
            return {"n": _name(type(o)), "v": [self.enc(x) for x in o]}
        ref = self._id(o)
        if ref is not None:
            return {"r": ref}
        i = self.ids[id(o)]
        if type(o) is list:
            return {"l": [self.enc(x) for x in o], "i": i}
        if type(o) is dict:
            return {"d": [[self.enc(k), self.enc(v)] for k, v in o.items()], "i": i}
        if type(o) is set:
            return {"s": self._members(o), "i": i}
        if type(o) is deque:
            return {"q": [self.enc(x) for x in o], "m": o.maxlen, "i": i}
        if type(o) is array:
            return {"ar": o.typecode, "v": [self.enc(x) for x in o], "i": i}
        if isinstance(o, pydantic.BaseModel):
            return {"p": _name(type(o)), "v": self.enc(o.model_dump()), "i": i}
        name = _name(type(o))
        return {"o": name, "a": {k: self.enc(v) for k, v in _attributes(o).items()}, "i": i}


def _plain(o: Any) -> bool:
    """Holds no object a state names by id: its encoding does not depend on what came before."""
    if o is None or type(o) in (bool, int, float, str) or isinstance(o, enum.Enum):
        return True
    return type(o) in (tuple, frozenset) and all(_plain(x) for x in o)


def _order(encoded: Any) -> str:
    return json.dumps(encoded, sort_keys=True)


def _attributes(o: Any) -> dict[str, Any]:
    out = dict(getattr(o, "__dict__", {}))
    for cls in type(o).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(o, slot):
                out[slot] = getattr(o, slot)
    return out


class _Decoder:
    def __init__(self) -> None:
        self.objs: dict[int, Any] = {}

    def _keep(self, d: dict[str, Any], o: Any) -> Any:
        i = d.get("i")
        if not isinstance(i, int) or i in self.objs:
            raise StateError(f"bad object id {i!r}")
        self.objs[i] = o
        return o

    def dec(self, d: Any) -> Any:
        if d is None or isinstance(d, (bool, int, float, str)):
            return d
        if not isinstance(d, dict):
            raise StateError(f"unexpected {type(d).__name__} in a state")
        if "r" in d:
            if d["r"] not in self.objs:
                raise StateError(f"reference to an unknown object {d['r']!r}")
            return self.objs[d["r"]]
        if "f" in d:
            if d["f"] not in ("nan", "inf", "-inf"):
                raise StateError(f"bad float {d['f']!r}")
            return float(d["f"])
        if "t" in d:
            return tuple(self.dec(x) for x in d["t"])
        if "fs" in d:
            return frozenset(self.dec(x) for x in d["fs"])
        if "l" in d:
            out_l: list[Any] = self._keep(d, [])
            out_l.extend(self.dec(x) for x in d["l"])
            return out_l
        if "d" in d:
            out_d: dict[Any, Any] = self._keep(d, {})
            for k, v in d["d"]:
                out_d[self.dec(k)] = self.dec(v)
            return out_d
        if "s" in d:
            out_s: set[Any] = self._keep(d, set())
            out_s.update(self.dec(x) for x in d["s"])
            return out_s
        if "q" in d:
            out_q: deque[Any] = self._keep(d, deque(maxlen=d.get("m")))
            out_q.extend(self.dec(x) for x in d["q"])
            return out_q
        if "ar" in d:
            if d["ar"] not in _ARRAY_CODES or not isinstance(d.get("v"), list):
                raise StateError(f"bad array {d['ar']!r}")
            out_a: array[Any] = self._keep(d, array(d["ar"]))
            try:
                out_a.extend(self.dec(x) for x in d["v"])
            except (TypeError, OverflowError) as e:
                raise StateError(f"bad array values: {e}") from None
            return out_a
        return self._named(d)

    def _named(self, d: dict[str, Any]) -> Any:
        if "c" in d:
            cls = _resolve(d["c"])
            if not isinstance(cls, type):
                raise StateError(f"{d['c']} is no class")
            return cls
        if "fn" in d:
            fn = _resolve(d["fn"])
            if not isinstance(fn, types.FunctionType):
                raise StateError(f"{d['fn']} is no function")
            return fn
        if "m" in d:
            owner, name = self.dec(d["m"][0]), d["m"][1]
            func = inspect.getattr_static(type(owner), str(name), None)
            if not isinstance(func, types.FunctionType) or not _allowed(type(owner).__module__):
                raise StateError(f"{name!r} is no method of {type(owner).__name__}")
            return types.MethodType(func, owner)
        cls = _resolve(d.get("e") or d.get("n") or d.get("p") or d.get("o"))
        if not isinstance(cls, type):
            raise StateError(f"{cls!r} is no class")
        if "e" in d:
            if not issubclass(cls, enum.Enum):
                raise StateError(f"{d['e']} is no enum")
            return cls(self.dec(d["v"]))
        if "n" in d:
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise StateError(f"{d['n']} is no named tuple")
            return cls(*(self.dec(x) for x in d["v"]))
        if "p" in d:
            if not issubclass(cls, pydantic.BaseModel):
                raise StateError(f"{d['p']} is no config model")
            return self._keep(d, cls.model_validate(self.dec(d["v"])))
        if cls.__new__ is not object.__new__:  # type: ignore[comparison-overlap]
            raise StateError(f"{d['o']} cannot be made without calling it")
        obj = self._keep(d, object.__new__(cls))
        attrs = d.get("a")
        if not isinstance(attrs, dict):
            raise StateError(f"{d['o']} has no attributes")
        for k, v in attrs.items():
            object.__setattr__(obj, k, self.dec(v))
        return obj


def encode(obj: Any) -> Any:
    """``obj`` as JSON-able data; :class:`StateError` where it holds something a state may not name."""
    return _Encoder().enc(obj)


def decode(data: Any) -> Any:
    """The object :func:`encode` gave ``data`` for; :class:`StateError` where ``data`` is not one."""
    try:
        return _Decoder().dec(data)
    except StateError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ImportError, RecursionError) as e:
        raise StateError(f"not a detector state: {e}") from e


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def config_digest(config: Any) -> str:
    """The detection config's digest: a state built under other thresholds is not this run's."""
    return _digest({"config": encode(config.model_dump())})


def dump(obj: Any, config: Any, meta: dict[str, Any]) -> str:
    """The file's text: ``obj``'s state, with what :func:`load` checks it against, and ``meta``."""
    body = {
        "format": FORMAT,
        "code": code_fingerprint(),
        "config": config_digest(config),
        "meta": meta,
        "state": encode(obj),
    }
    text = json.dumps({**body, "checksum": _digest(body)}, allow_nan=False, separators=(",", ":"))
    if len(text) > MAX_BYTES:  # load would refuse it: not written at all
        raise StateError(f"{len(text):,} bytes: larger than a state is read back at ({MAX_BYTES:,})")
    return text


def load(text: str | bytes, config: Any, kind: type) -> tuple[Any, dict[str, Any]]:
    """The object a :func:`dump` text holds, an instance of ``kind``, and its ``meta``.

    Raises :class:`StateError` naming what failed: a state another version of the detection code,
    another config, a damaged or edited file wrote is never used.
    """
    if len(text) > MAX_BYTES:
        raise StateError(f"{len(text):,} bytes: larger than any detector state")
    try:
        body = json.loads(text)
    except ValueError as e:
        raise StateError(f"not JSON: {e}") from e
    if not isinstance(body, dict):
        raise StateError("not a detector state")
    checksum = body.pop("checksum", None)
    if body.get("format") != FORMAT:
        raise StateError(f"format {body.get('format')!r}, this version reads {FORMAT}")
    if body.get("code") != code_fingerprint():
        raise StateError("written by another version of the detectors")
    if body.get("config") != config_digest(config):
        raise StateError("written under another detection config")
    try:
        if checksum != _digest(body):
            raise StateError("checksum mismatch: the file was damaged or edited")
    except (TypeError, ValueError) as e:
        raise StateError(f"not a detector state: {e}") from e
    obj = decode(body.get("state"))
    if not isinstance(obj, kind):
        raise StateError(f"holds a {type(obj).__name__}, not a {kind.__name__}")
    try:
        again = encode(obj)
    except (StateError, RecursionError) as e:
        raise StateError(f"read back, it cannot be written again: {e}") from e
    if again != body["state"]:
        raise StateError("read back, it is not the state that was written")
    meta = body.get("meta")
    return obj, meta if isinstance(meta, dict) else {}
