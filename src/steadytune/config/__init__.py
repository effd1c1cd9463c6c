"""Run configuration: schema, loading, overrides and error reporting.

The names below are imported on first use: a submodule such as ``config.detect`` (all
that ``analyze`` needs) must not pull the whole run schema, its alert channels and YAML
in with it, which cost a new ``analyze`` process about a tenth of a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steadytune.config.load import ConfigError, ConfigIssue, dump_config, load_config
    from steadytune.config.schema import SteadytuneConfig

__all__ = ["ConfigError", "ConfigIssue", "SteadytuneConfig", "dump_config", "load_config"]

_HOME = {name: "steadytune.config.load" for name in __all__}
_HOME["SteadytuneConfig"] = "steadytune.config.schema"


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
