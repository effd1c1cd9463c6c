"""``alerts:`` config: sinks, routing, noise control. Secrets only by reference.

Example::

    alerts:
      min_severity: warning
      dedup_window_s: 600
      notify_on: {start: false, finish: true, restart: true}
      sinks:
        - type: webhook
          format: slack
          url_env: SLACK_WEBHOOK_URL
        - type: email
          host: smtp.example.com
          port: 587
          security: starttls
          username: bot@example.com
          password_file: ~/.config/steadytune/smtp-password
          sender: bot@example.com
          to: [oncall@example.com]

A secret written in clear (``url:``, ``password:``, ``token:``) is rejected with a
message naming the key and the ``*_env`` / ``*_file`` fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from steadytune.config.keyed import KeyedValueError

Severity = Literal["info", "warning", "critical"]

# Keys that would hold a secret in clear, and the reference keys to use instead.
_CLEAR_SECRETS = {
    "url": "url",
    "webhook_url": "url",
    "password": "password",
    "token": "token",
    "secret": "token",
    "api_key": "token",
}
CLEAR_SECRET_KEYS = frozenset(_CLEAR_SECRETS)  # a config error never shows what these hold


def _reject_clear_secrets(data: Any, allowed: tuple[str, ...]) -> Any:
    if isinstance(data, dict):
        for key, ref in _CLEAR_SECRETS.items():
            if key in data and (ref in allowed or key == ref):
                raise KeyedValueError(
                    key,
                    "holds a secret in clear in the YAML",
                    f"put the value in an environment variable and write `{ref}_env: NAME` "
                    f"(or `{ref}_file: /path/to/file`, mode 600) instead",
                )
    return data


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _SinkBase(_Model):
    name: str | None = Field(None, description="Label in logs and events; defaults to the sink type.")
    min_severity: Severity | None = Field(None, description="Overrides the router's minimum for this sink.")
    rate_limit_per_hour: int | None = Field(None, ge=1, description="Overrides the router's rate limit.")


class ConsoleSink(_SinkBase):
    type: Literal["console"]
    stream: Literal["stderr", "stdout"] = "stderr"


class JsonlSink(_SinkBase):
    type: Literal["jsonl"]
    path: Path = Field(Path("alerts.jsonl"), description="Relative paths are inside the run directory.")


class WebhookSink(_SinkBase):
    type: Literal["webhook"]
    format: Literal["generic", "slack", "discord"] = "generic"
    url_env: str | None = None
    url_file: Path | None = None
    timeout_s: float = Field(10.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _no_clear(cls, data: Any) -> Any:
        return _reject_clear_secrets(data, ("url",))

    @model_validator(mode="after")
    def _one_url(self) -> WebhookSink:
        if bool(self.url_env) == bool(self.url_file):
            raise ValueError("a webhook sink needs exactly one of `url_env: NAME` or `url_file: /path`")
        return self


def _loopback(host: str) -> bool:
    """Whether ``host`` names this machine: a password sent there does not cross a network."""
    name = host.strip().strip("[]").lower()
    return name in {"localhost", "::1"} or name.startswith("127.")


class EmailSink(_SinkBase):
    type: Literal["email"]
    host: str
    port: int | None = Field(None, ge=1, le=65535, description="Default: 587 starttls, 465 ssl, 25 none.")
    security: Literal["starttls", "ssl", "none"] = "starttls"
    username: str | None = None
    password_env: str | None = None
    password_file: Path | None = None
    sender: str
    to: list[str] = Field(min_length=1)
    subject_prefix: str = "[steadytune]"
    timeout_s: float = Field(15.0, gt=0)
    ca_file: Path | None = Field(None, description="Trust this CA bundle (self-signed relays).")

    @model_validator(mode="before")
    @classmethod
    def _no_clear(cls, data: Any) -> Any:
        return _reject_clear_secrets(data, ("password",))

    @model_validator(mode="after")
    def _auth(self) -> EmailSink:
        if self.password_env and self.password_file:
            raise ValueError("set only one of `password_env` or `password_file`")
        if (self.password_env or self.password_file) and not self.username:
            raise ValueError("a password needs a `username`")
        if (self.password_env or self.password_file) and self.security == "none" and not _loopback(self.host):
            # smtplib's login sends it base64-encoded, i.e. readable by anyone on the path.
            raise KeyedValueError(
                "security",
                f"none sends the password to {self.host} in clear",
                "use `security: starttls` (port 587) or `ssl` (465); a relay without TLS takes no "
                "password, or runs on this host (127.0.0.1)",
                shown="none",
            )
        return self

    @property
    def effective_port(self) -> int:
        return self.port or {"starttls": 587, "ssl": 465, "none": 25}[self.security]


class CommandSink(_SinkBase):
    type: Literal["command"]
    argv: list[str] = Field(min_length=1, description="Program and arguments; the alert JSON is on stdin.")
    timeout_s: float = Field(30.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _no_clear(cls, data: Any) -> Any:
        return _reject_clear_secrets(data, ())


SinkConfig = Annotated[
    ConsoleSink | JsonlSink | WebhookSink | EmailSink | CommandSink, Field(discriminator="type")
]


class NotifyOn(_Model):
    """Lifecycle alerts: the run started, finished (completed/failed/stopped), restarted."""

    start: bool = False
    finish: bool = True
    restart: bool = True


class RetryConfig(_Model):
    attempts: int = Field(
        5, ge=1, le=50, description="Tries per sink before the alert is marked undelivered."
    )
    backoff_s: float = Field(2.0, gt=0)
    max_backoff_s: float = Field(300.0, gt=0)


class AlertsConfig(_Model):
    """The ``alerts:`` section of the config."""

    # A sink type people write that is a webhook's format, with what to write instead (config/load.py).
    instead: ClassVar[dict[str, str]] = {
        fmt: f"type: webhook, format: {fmt}, url_env: NAME (the variable that holds the URL; or url_file: "
        "/path), and no url: in the file"
        for fmt in ("slack", "discord")
    }

    enabled: bool = True
    min_severity: Severity = "warning"
    dedup_window_s: float = Field(
        600.0, ge=0, description="Same run, kind and metric inside this window: once."
    )
    rate_limit_per_hour: int = Field(30, ge=1, description="Per sink; critical alerts may borrow 50% more.")
    send_resolved: bool = True
    include_actions: bool = Field(
        False, description="Also alert on recovery actions (rollback, restart plan)."
    )
    notify_on: NotifyOn = NotifyOn()
    retry: RetryConfig = RetryConfig()
    dashboard_url: str | None = Field(None, description="Linked from every alert when set.")
    sinks: list[SinkConfig] = Field(default_factory=lambda: [ConsoleSink(type="console")])  # type: ignore[arg-type]  # a list of one member of the union

    def redacted_dump(self) -> dict[str, Any]:
        """The config as a dict fit for printing: it holds only secret *references*."""
        return self.model_dump(mode="json", exclude_none=True)
