"""How the venvs are installed (tests/pip_install.py) and which ones a session builds from its start
(tests/tools.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.pip_install import find_uv, install_command, pip_sources
from tests.tools import needed_tools

# `pip config list` on a machine with a local folder of wheels (the CPU torch) and two local indexes.
CONFIG = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
:env:.index-url='https://mirror.example/simple'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://pypi.org/simple'
"""


def test_uv_gets_every_source_and_constraint_pip_is_configured_with_once() -> None:
    assert pip_sources(CONFIG) == [
        "--find-links", "/opt/wheels",
        "--index-url", "https://mirror.example/simple",  # the environment's: pip reads it first
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--extra-index-url", "https://mirror.example/simple",  # uv's first: the main index before the extra
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
    ]  # fmt: skip
    assert pip_sources("global.extra-index-url='file:///opt/pypi/simple'\n") == [
        "--extra-index-url", "https://pypi.org/simple",  # pip's main index where none is set
        "--extra-index-url", "file:///opt/pypi/simple",
    ]  # fmt: skip
    assert pip_sources("") == []
    assert pip_sources("global.timeout='60'\nnot a setting\n") == []


def test_without_uv_pip_installs_and_with_uv_it_is_given_pips_configuration() -> None:
    python = sys.executable
    assert install_command(python, ["-c", "c.txt", "trl"], None) == [
        python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", "c.txt", "trl",
    ]  # fmt: skip
    config = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    cmd = install_command(python, ["--no-deps", "trl"], "/opt/uv")
    assert cmd[:5] == ["/opt/uv", "pip", "install", "--quiet", "--python"] and cmd[5] == python
    assert cmd[6:9] == ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]  # as pip does
    assert cmd[9:] == [*pip_sources(config), "--no-deps", "trl"]


@dataclass
class _Mark:
    args: tuple[str, ...]
    kwargs: dict[str, str] = field(default_factory=dict)


@dataclass
class _Spec:
    params: dict[str, object]


@dataclass
class _Item:
    """What needed_tools reads of a collected test: its markers and its parameters."""

    marks: dict[str, list[_Mark]]
    callspec: _Spec | None = None

    def iter_markers(self, name: str) -> Iterator[_Mark]:
        return iter(self.marks.get(name, []))


def test_a_session_builds_the_tools_its_tests_name_grouped_ones_first_each_once() -> None:
    items = [
        _Item({}),  # a unit test
        _Item({"tools": [_Mark(("trl",))]}),
        _Item({}, _Spec({"tool": "llamafactory", "buffered": True})),
        _Item({"xdist_group": [_Mark(("tool-axolotl",))]}, _Spec({"tool": "axolotl"})),
        _Item({"xdist_group": [_Mark((), {"name": "tool-accelerate"})]}),  # no venv of its own
        _Item({"tools": [_Mark(("trl", "llamafactory"))]}),
        _Item({"xdist_group": [_Mark(("serial",))]}),
        _Item({}, _Spec({"tool": "swift"})),
        _Item({}, _Spec({"tool": 3})),
    ]
    assert needed_tools(items) == ["axolotl", "trl", "llamafactory", "swift"]  # type: ignore[arg-type]
    assert needed_tools([_Item({})]) == []  # type: ignore[list-item]


def _runs_a_tool(text: str) -> bool:
    return any(f"{name}(" in text for name in ("tool_venv", "tool_job", "trl_job", "lf_job", "swift_job"))


@pytest.mark.parametrize(
    "path",
    sorted(p for p in (REPO / "tests").rglob("test_*.py") if _runs_a_tool(p.read_text())),
    ids=lambda p: p.name,
)
def test_each_test_module_that_runs_a_tool_names_it(path: Path) -> None:
    """A test that runs a tool without naming it still passes, but its venv is built in its worker
    when it asks, not in the background from the session's start."""
    text = path.read_text()
    assert "mark.tools(" in text or 'parametrize("tool"' in text or "tool-{" in text, path


def test_uv_installs_where_there_is_one_unless_pip_is_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    on_path, venv_bin = tmp_path / "path", tmp_path / "venv" / "bin"
    on_path.mkdir()
    venv_bin.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.delenv("STEADYTUNE_INSTALLER", raising=False)
    assert find_uv() is None  # none anywhere: pip
    for folder in (on_path, venv_bin):
        (folder / "uv").write_text("#!/bin/sh\n")
        (folder / "uv").chmod(0o755)
    assert find_uv() == str(venv_bin / "uv")  # the venv's own first
    (venv_bin / "uv").unlink()
    assert find_uv() == str(on_path / "uv")
    monkeypatch.setenv("STEADYTUNE_INSTALLER", "pip")
    assert find_uv() is None
