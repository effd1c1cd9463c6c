"""The floors of docs/design.md: every import in ``src/steadytune`` goes sideways or down, in no circle.

Read with ``ast``, lazy imports inside functions, imports for type checking and
``importlib.import_module("...")`` included, since a lazy import that goes up is still a
dependency that goes up, and two modules that import each other, however late, are one
module in two files. Circles are looked for twice: between modules, and between the rooms
(the top-level packages) on one floor.
"""

from __future__ import annotations

import ast
from pathlib import Path

import steadytune

SRC = Path(steadytune.__file__).parent

FLOORS: dict[str, int] = {
    **dict.fromkeys(
        (
            "records",
            "protocol",
            "rundir",
            "objectives",
            "units",
            "layers",
            "layerwise",
            "secretfile",
            "regularfile",
            "lifeline",
            "scratch",
            "terminal",
            "jobenv",
            "redact",
            "config",
        ),
        0,
    ),
    **dict.fromkeys(
        ("data", "detect", "policy", "checkpoint", "telemetry", "estimate", "alerts", "importers", "goodput"),
        1,
    ),
    **dict.fromkeys(("guard", "train", "inject", "engines"), 2),
    **dict.fromkeys(("supervise", "server", "web", "preflight", "quant", "forensics", "drill", "cli"), 3),
}


def _room(module: str) -> str | None:
    """The top-level package or module of ``steadytune.x.y``; None for the package root itself and
    for a name the root hands out (``from steadytune import __version__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


def _imported_by_name(node: ast.AST) -> str | None:
    """The module an ``importlib.import_module("...")`` call names; None for any other node."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def _imports(path: Path, src: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``steadytune`` import in ``path``."""
    own = ".".join(path.relative_to(src.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        own = own.rsplit(".", 1)[0] + ".__init__"
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*own.split(".")[: -node.level], *([base] if base else [])])
            names = [f"{base}.{a.name}" if base == "steadytune" else base for a in node.names]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.Call) and (name := _imported_by_name(node)) is not None:
            out.append((node.lineno, name))
    return [(line, m) for line, m in out if m == "steadytune" or m.startswith("steadytune.")]


def upward_imports(src: Path = SRC) -> list[str]:
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if rel == Path("__init__.py"):
            continue  # the front door: hands out Guard lazily, sits on no floor
        here = rel.parts[0].removesuffix(".py")
        for line, module in _imports(path, src):
            there = _room(module)
            if there is not None and there != here and FLOORS[there] > FLOORS[here]:
                found.append(f"{rel}:{line} imports {module} (floor {FLOORS[here]} -> {FLOORS[there]})")
    return found


def test_every_package_has_a_floor() -> None:
    rooms = {
        p.name.removesuffix(".py") for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert rooms - {"__init__"} == set(FLOORS), "give the new package a floor here and in docs/design.md"


def test_no_import_goes_up_a_floor() -> None:
    assert upward_imports() == []


def test_an_upward_import_is_seen(tmp_path: Path) -> None:
    pkg = tmp_path / "steadytune"
    (pkg / "detect").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "detect" / "__init__.py").write_text("")
    (pkg / "detect" / "x.py").write_text(
        "def f():\n    from steadytune.forensics.timeline import replay_run\n"
        "    import importlib\n    importlib.import_module('steadytune.guard.core')\n"
    )
    assert upward_imports(pkg) == [
        "detect/x.py:2 imports steadytune.forensics.timeline (floor 1 -> 3)",
        "detect/x.py:4 imports steadytune.guard.core (floor 1 -> 2)",
    ]


# -- circles ---------------------------------------------------------------------------------------

# Circles allowed to stand: none. One that must stand for a while goes here, named, and leaves
# once it is opened (the test below says so).
OPEN_CIRCLES: set[tuple[str, ...]] = set()


def _modules(src: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own, for its ``__init__``)."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Which modules each module imports: ``from pkg import sub`` is ``pkg.sub`` where that is a module."""
    modules = _modules(src)
    root = src.name

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name if name and name != root else None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name == root:
            continue  # the front door: hands out Guard lazily, sits on no floor
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif _imported_by_name(node) is not None:
                found.add(str(_imported_by_name(node)))
        graph[name] = {m for m in map(known, found) if m is not None and m != name}
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The groups of two or more nodes that reach each other (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(tuple(sorted(group)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def circles(src: Path = SRC) -> list[tuple[str, ...]]:
    """Modules that import each other in a loop, and rooms (top-level packages) that do."""
    graph = import_graph(src)
    rooms: dict[str, set[str]] = {}
    for name, deps in graph.items():
        room = name.split(".")[1]
        rooms.setdefault(room, set()).update(d.split(".")[1] for d in deps if d.split(".")[1] != room)
    return _strongly_connected(graph) + [tuple(f"room {r}" for r in c) for c in _strongly_connected(rooms)]


def test_no_module_or_room_imports_itself_round_a_circle() -> None:
    found = set(circles())
    assert found - OPEN_CIRCLES == set(), "break the circle: move what both sides need below them"
    assert OPEN_CIRCLES - found == set(), "this circle is gone: take it off OPEN_CIRCLES"


def test_a_circle_is_seen_however_late_the_import(tmp_path: Path) -> None:
    pkg = tmp_path / "steadytune"
    for room in ("train", "supervise"):
        (pkg / room).mkdir(parents=True)
        (pkg / room / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    # two modules, one of them importing the other only inside a function
    (pkg / "train" / "worker.py").write_text("def f():\n    from steadytune.train import rollback\n")
    (pkg / "train" / "rollback.py").write_text("from steadytune.train.worker import f\n")
    # two rooms on one floor that reach each other through different modules
    (pkg / "train" / "standby.py").write_text("from steadytune.supervise.link import x\n")
    (pkg / "supervise" / "link.py").write_text("x = 1\n")
    (pkg / "supervise" / "command.py").write_text(
        "import importlib\nimportlib.import_module('steadytune.train.standby')\n"
    )
    assert circles(pkg) == [
        ("steadytune.train.rollback", "steadytune.train.worker"),
        ("room supervise", "room train"),
    ]
