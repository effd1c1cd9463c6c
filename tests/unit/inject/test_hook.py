"""The post-import hook on a real module written for the test."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from steadytune.inject.hook import PostImportHook, when_imported


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "st_hook_pkg").mkdir()
    (tmp_path / "st_hook_pkg" / "__init__.py").write_text("")
    (tmp_path / "st_hook_pkg" / "mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("st_hook_pkg", "st_hook_pkg.mod"):
        sys.modules.pop(name, None)


def test_runs_after_the_module_executed_and_removes_itself(module_dir: Path) -> None:
    seen: list[int] = []

    def after(module: ModuleType) -> None:
        seen.append(module.VALUE)
        module.VALUE += 1

    hook = when_imported("st_hook_pkg.mod", after)
    assert isinstance(hook, PostImportHook) and hook in sys.meta_path
    import st_hook_pkg  # the parent alone does not fire it

    assert seen == []
    from st_hook_pkg import mod

    assert seen == [41] and mod.VALUE == 42 and hook not in sys.meta_path
    assert mod.__loader__.get_source("st_hook_pkg.mod") == "VALUE = 41\n"  # the real loader answers
    assert st_hook_pkg.mod is mod


def test_an_imported_module_is_handled_at_once(module_dir: Path) -> None:
    import st_hook_pkg.mod  # noqa: F401  (imported before the hook is asked for)

    seen: list[str] = []
    assert when_imported("st_hook_pkg.mod", lambda m: seen.append(m.__name__)) is None
    assert seen == ["st_hook_pkg.mod"]
