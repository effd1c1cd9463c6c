"""Every config field is read somewhere: a knob nobody reads would silently do nothing.

The source of ``src/steadytune`` is read with ``ast``. A field ``a.b.name`` counts as
read when ``.name`` is loaded (or ``["name"]``/``.get("name")``/``getattr(x, "name")``)
inside a class or function that also names its section (``b``), its model class or
the model that holds it, or when its whole dotted path appears as a string (the CLI
maps flags onto keys that way). The section check is what catches a knob whose name
another section uses too (``policy.hang_floor_s`` beside ``detect.pace.hang_floor_s``).
A ``detect.*`` threshold also counts as read when the detector registry
(``detect/build.py``) fills it by name into a detector's limits, from the section its
entry names, and that limits field is itself read in ``detect/``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

import steadytune
from steadytune.config.detect import PaceConfig
from steadytune.config.schema import SteadytuneConfig

SRC = Path(steadytune.__file__).parent
# The modules that declare the schema: a field named there is defined, not read.
SCHEMA_MODULES = {"schema.py", "detect.py", "policy.py", "scale.py", "alerts.py", "dashboard.py"}

# Read in a way the scan cannot see, each with where.
DYNAMIC = {
    "alerts.notify_on.finish": "alerts/router.py: getattr(self.config.notify_on, phase)",
    "alerts.notify_on.restart": "alerts/router.py: getattr(self.config.notify_on, phase)",
    "alerts.sinks.port": "config/alerts.py: EmailSink.effective_port, which the email sink reads",
    "alerts.sinks.type": "alerts/sinks.py: _Base names a sink by it (conf.name or conf.type)",
}


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _fields(
    model: type[BaseModel], parent: type[BaseModel] | None = None, path: str = ""
) -> Iterator[tuple[str, type[BaseModel], type[BaseModel] | None, str]]:
    for name, field in model.model_fields.items():
        yield path + name, model, parent, name
        for sub in _models(field.annotation):
            if sub is not model:
                yield from _fields(sub, model, f"{path}{name}.")


def _words(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and " " not in n.value:
            out.update(n.value.split("."))
    return out


def _key(node: ast.AST) -> str | None:
    """The name a subscript, ``.get(...)`` or ``getattr(x, ...)`` reads, when it is a literal."""
    key: ast.AST | None = None
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        key = node.slice
    elif isinstance(node, ast.Call) and node.args:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key = node.args[0]
        elif isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) > 1:
            key = node.args[1]
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


@functools.cache
def scan(src: Path) -> tuple[dict[str, list[set[str]]], set[str]]:
    """Each name read -> the words of the scopes that read it; and every string literal."""
    reads: dict[str, list[set[str]]] = {}
    strings: set[str] = set()

    def visit(node: ast.AST, scope: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            # A method is judged with its class (whose __init__ names the config it keeps).
            if isinstance(child, ast.ClassDef) or (
                isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                and not isinstance(node, ast.ClassDef)
            ):
                inner = _words(child)
            if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
                reads.setdefault(child.attr, []).append(inner)
            elif isinstance(child, ast.Constant) and isinstance(child.value, str):
                strings.add(child.value)
            if (key := _key(child)) is not None:
                reads.setdefault(key, []).append(inner)
            visit(child, inner)

    for path in sorted(src.rglob("*.py")):
        if path.parent.name == "config" and path.name in SCHEMA_MODULES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        visit(tree, _words(tree))
    return reads, strings


@functools.cache
def registry_filled() -> frozenset[tuple[type[BaseModel], str]]:
    """(config section class, field) of every threshold the detector registry fills and a detector
    reads, and (DetectConfig, section) of the sections it fills them from."""
    from steadytune.config.detect import DetectConfig
    from steadytune.detect.build import REGISTRY

    detect_reads, _ = scan(SRC / "detect")
    out: set[tuple[type[BaseModel], str]] = set()
    for entry in REGISTRY:
        out.update((DetectConfig, section) for section in entry.sections)
        for limits in entry.limits:
            for f in dataclasses.fields(limits):
                sections = [DetectConfig.model_fields[s].annotation for s in entry.sections]
                owner = next(m for m in sections if isinstance(m, type) and f.name in m.model_fields)
                if f.name in detect_reads:
                    out.add((owner, f.name))
    return frozenset(out)


def unread(model: type[BaseModel], reads: dict[str, list[set[str]]], strings: set[str]) -> list[str]:
    out = []
    for path, owner, parent, name in _fields(model):
        if path in strings or (owner, name) in registry_filled():
            continue
        section = path.rsplit(".", 2)[-2] if "." in path else None
        marks = {section, owner.__name__} | ({parent.__name__} if parent not in (None, model) else set())
        if not any(section is None or marks & scope for scope in reads.get(name, ())):
            out.append(path)
    return out


def test_every_config_field_is_read_somewhere() -> None:
    reads, strings = scan(SRC)
    missing = [p for p in unread(SteadytuneConfig, reads, strings) if p not in DYNAMIC]
    assert missing == [], f"config fields nothing reads (wire them up or delete them): {missing}"


def test_the_dynamic_exceptions_are_still_config_fields() -> None:
    paths = {p for p, *_ in _fields(SteadytuneConfig)}
    assert set(DYNAMIC) <= paths, f"stale entries: {sorted(set(DYNAMIC) - paths)}"


def test_a_knob_read_only_under_another_sections_name_is_caught() -> None:
    class Elsewhere(BaseModel):
        hang_floor_s: float = 60.0  # read as detect.pace.hang_floor_s, never as this
        a_knob_nobody_reads: int = 0

    class Root(BaseModel):
        pace: PaceConfig = PaceConfig()
        elsewhere: Elsewhere = Elsewhere()

    reads, strings = scan(SRC)
    # The section itself is a field nobody reads, then its two knobs; none of pace's.
    assert unread(Root, reads, strings) == [
        "elsewhere",
        "elsewhere.hang_floor_s",
        "elsewhere.a_knob_nobody_reads",
    ]
