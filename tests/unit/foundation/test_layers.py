"""The floors of docs/design.md: every import in ``src/steadytune`` goes sideways or down.

Read with ``ast``, lazy imports inside functions and ``importlib.import_module("...")``
included, since a lazy import that goes up is still a dependency that goes up.
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
    """The top-level package or module of ``steadytune.x.y``; None for the package root itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


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
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
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
