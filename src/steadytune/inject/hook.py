"""Run a function right after a module is first imported, without importing it first.

A finder at the head of ``sys.meta_path`` lets the other finders locate the module,
then wraps the loader they return so that ``after(module)`` runs once the module's
code has executed. It removes itself after firing. Stdlib only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _AfterLoader(importlib.abc.Loader):
    """The real loader, with ``after`` run when ``exec_module`` returns."""

    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_resource_reader, is_package ...: whatever the module's users ask of it.
        return getattr(self._loader, name)


class PostImportHook(importlib.abc.MetaPathFinder):
    """Calls ``after(module)`` once module ``name`` has been imported (by anyone, at any time)."""

    def __init__(self, name: str, after: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.after = after

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self.remove()
        spec.loader = _AfterLoader(spec.loader, self.after)
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def when_imported(name: str, after: Callable[[ModuleType], None]) -> PostImportHook | None:
    """Arrange ``after(module)`` for module ``name``: now if it is already imported, else on import.

    Returns the installed hook (None when it ran at once).
    """
    module = sys.modules.get(name)
    if module is not None:
        after(module)
        return None
    hook = PostImportHook(name, after)
    sys.meta_path.insert(0, hook)
    return hook
