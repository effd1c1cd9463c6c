"""Run configuration: schema, loading, overrides and error reporting."""

from steadytune.config.load import ConfigError, ConfigIssue, dump_config, load_config, redact
from steadytune.config.schema import SteadytuneConfig

__all__ = ["ConfigError", "ConfigIssue", "SteadytuneConfig", "dump_config", "load_config", "redact"]
