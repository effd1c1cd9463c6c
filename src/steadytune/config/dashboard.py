"""``dashboard:`` config. The token is a secret: only by env var or file, never in the YAML."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from steadytune.config.keyed import KeyedValueError

DEFAULT_TOKEN_ENV = "STEADYTUNE_DASHBOARD_TOKEN"


class DashboardConfig(BaseModel):
    """The ``dashboard:`` section of the config.

    Example::

        dashboard:
          enabled: true
          host: 127.0.0.1
          port: 7860
          token_env: STEADYTUNE_DASHBOARD_TOKEN
          public_url: https://steadytune.gpu-box.example/   # behind a reverse proxy, at the root of its host
          request_timeout_s: 10
          max_connections: 64
          max_streams: 16
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    host: str = Field("127.0.0.1", description="Any address but loopback requires a token.")
    port: int = Field(7860, ge=0, le=65535, description="0 picks a free port.")
    token_env: str | None = Field(DEFAULT_TOKEN_ENV, description="Env var holding the operator token.")
    token_file: Path | None = Field(None, description="File holding the operator token (mode 600).")
    public_url: str | None = Field(
        None,
        description="The URL the dashboard is reached at behind a reverse proxy: its host is accepted in "
        "Host headers, and reads then need the token.",
    )
    request_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Seconds a client has to send a whole request; also the socket timeout.",
    )
    max_connections: int = Field(64, ge=2, le=4096, description="Connections served at once; more get 503.")
    max_streams: int = Field(
        16, ge=1, le=4096, description="Live streams (SSE) at once, within max_connections; more get 503."
    )

    @field_validator("public_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"public_url {value!r} must be an http:// or https:// URL with a host name")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(
                f"public_url {value!r} has a path: the dashboard is served at the root of its host "
                "(its pages use absolute paths), e.g. https://steadytune.gpu-box.example/"
            )
        return value

    @model_validator(mode="after")
    def _streams_leave_room(self) -> DashboardConfig:
        if self.max_streams >= self.max_connections:
            raise ValueError(
                f"max_streams ({self.max_streams}) must be below max_connections ({self.max_connections}): "
                "the pages need connections of their own to load"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_clear_token(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token" in data:
            raise KeyedValueError(
                "token",
                "holds a secret in clear in the YAML",
                f"export it as an environment variable and write `token_env: {DEFAULT_TOKEN_ENV}` "
                "(or `token_file: /path/to/file`, mode 600) instead",
            )
        return data
