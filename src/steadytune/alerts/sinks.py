"""Where alerts go: console, a JSONL file, a webhook, e-mail, a command hook.

A sink has a ``name``, a ``min_severity`` and ``send(alert)``, which raises
:class:`DeliveryError` on failure (the router retries with backoff). Sinks hold
resolved secrets but never print them: every error text passes the redactor.
"""

from __future__ import annotations

import base64
import json
import re
import smtplib
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import formatdate, make_msgid, parseaddr
from pathlib import Path
from typing import IO, Protocol

from steadytune.alerts.message import PAYLOADS, Alert
from steadytune.alerts.secrets import SecretError, resolve_secret
from steadytune.config import alerts as cfg
from steadytune.redact import Redactor, redact_url
from steadytune.terminal import CONTROL_CHARS


class DeliveryError(RuntimeError):
    """A sink could not deliver; the message is already redacted.

    ``permanent``: trying again cannot help (the configuration is wrong, e.g. the
    webhook redirects), so the router records the alert undelivered at once.
    """

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Sink(Protocol):
    name: str
    min_severity: str | None
    rate_limit_per_hour: int | None

    def send(self, alert: Alert) -> None: ...


class _Base:
    def __init__(self, conf: cfg._SinkBase, redactor: Redactor) -> None:
        self.name = conf.name or conf.type  # type: ignore[attr-defined]
        self.min_severity: str | None = conf.min_severity
        self.rate_limit_per_hour: int | None = conf.rate_limit_per_hour
        self.redact = redactor

    def _fail(self, what: str, exc: BaseException | str, permanent: bool = False) -> DeliveryError:
        return DeliveryError(self.redact(f"{self.name}: {what}: {exc}"), permanent=permanent)


# Given an alert's (kind, severity): True when the program's own console already printed
# the event it comes from (the supervisor prints every warning, action and lifecycle step).
ConsoleSaid = Callable[[str, str], bool]


class ConsoleAlertSink(_Base):
    """Writes the alert to stderr (or stdout); one the host's console already showed counts
    as delivered without a second copy of the same line."""

    def __init__(
        self,
        conf: cfg.ConsoleSink,
        redactor: Redactor,
        stream: IO[str] | None = None,
        already_said: ConsoleSaid | None = None,
    ) -> None:
        super().__init__(conf, redactor)
        self._stream = stream
        self._which = conf.stream
        self._already_said = already_said

    def send(self, alert: Alert) -> None:
        if self._already_said is not None and self._already_said(alert.kind, alert.severity):
            return
        stream = self._stream or (sys.stderr if self._which == "stderr" else sys.stdout)
        stream.write(self.redact(f"[steadytune {alert.severity}] {alert.text()}") + "\n")
        stream.flush()


class JsonlAlertSink(_Base):
    def __init__(self, conf: cfg.JsonlSink, redactor: Redactor, base_dir: Path | None = None) -> None:
        super().__init__(conf, redactor)
        path = Path(conf.path).expanduser()
        self.path = path if path.is_absolute() or base_dir is None else base_dir / path
        self._lock = threading.Lock()

    def send(self, alert: Alert) -> None:
        line = json.dumps(self.redact.redact_obj(alert.to_dict()), separators=(",", ":"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock, open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:
            raise self._fail(f"cannot append to {self.path}", exc) from None


WEBHOOK_SCHEMES = ("http", "https")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would turn the POST into a GET (the alert lost but
    counted delivered) or go to another scheme (``ftp:``), or another host the URL never named."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the 3xx then surfaces as an HTTPError


def check_webhook_url(url: str) -> None:
    """Refuse a webhook URL that is not http(s); the message never carries the URL (a secret)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in WEBHOOK_SCHEMES or "://" not in url:
        raise SecretError(
            f"url: a webhook URL must start with http:// or https:// (this one's scheme is "
            f"{scheme or 'missing'!r})"
        )


def split_credentials(url: str) -> tuple[str, str | None]:
    """``http://user:pass@host/p`` -> (``http://host/p``, the ``Authorization: Basic`` value).

    urllib sends no credentials from a URL: it took ``user:pass@host`` for the host's name, so
    such a webhook failed every delivery with ``Name or service not known``. HTTP clients (curl,
    requests) send them as basic auth, and so does this sink.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), f"Basic {token}"


class WebhookAlertSink(_Base):
    """POSTs the alert as JSON to one http(s) URL; a redirect is a (permanent) failure, never followed."""

    def __init__(self, conf: cfg.WebhookSink, redactor: Redactor, url: str) -> None:
        super().__init__(conf, redactor)
        redactor.add(url)
        check_webhook_url(url)
        self.url, self._auth = split_credentials(url)
        redactor.add(self._auth)
        self.format = conf.format
        self.timeout_s = conf.timeout_s
        self._opener = urllib.request.build_opener(_NoRedirect)

    def describe(self) -> str:
        return f"{self.format} webhook {redact_url(self.url)}"

    def send(self, alert: Alert) -> None:
        body = json.dumps(PAYLOADS[self.format](alert)).encode("utf-8")
        req = urllib.request.Request(
            self.url, data=body, method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "steadytune-alerts"},
        )  # fmt: skip
        if self._auth:
            req.add_header("Authorization", self._auth)
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                resp.read(4096)
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = exc.headers.get("Location") if exc.headers else None
                raise self._fail(
                    f"POST {redact_url(self.url)} answered",
                    f"HTTP {exc.code}, a redirect to {redact_url(where) if where else 'nowhere'}; "
                    "redirects are not followed: set the webhook URL to where it should go",
                    permanent=True,
                ) from None
            raise self._fail(f"POST {redact_url(self.url)} answered", f"HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise self._fail(f"POST {redact_url(self.url)} failed", reason) from None


_CONTROL = re.compile(f"[{CONTROL_CHARS}]+")


def one_line(value: str) -> str:
    """A header value without CR, LF, other control characters or Unicode line separators (each run
    becomes one space): the email package refuses a header holding any character str.splitlines()
    breaks at (U+2028, U+0085, ...), which failed every retry and lost the alert."""
    return _CONTROL.sub(" ", value).strip()


def _domain(sender: str) -> str:
    """The domain of an address (``"Bot <bot@example.com>"`` -> ``example.com``), else localhost."""
    domain = parseaddr(sender)[1].rpartition("@")[2]
    return one_line(domain).replace(" ", "") or "localhost"


class EmailAlertSink(_Base):
    def __init__(self, conf: cfg.EmailSink, redactor: Redactor, password: str | None) -> None:
        super().__init__(conf, redactor)
        self.conf = conf
        self.password = password
        redactor.add(password)

    def describe(self) -> str:
        return (
            f"e-mail via {self.conf.host}:{self.conf.effective_port} ({self.conf.security}) to "
            f"{', '.join(self.conf.to)}"
        )

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.conf.ca_file) if self.conf.ca_file else None)
        return ctx

    def send(self, alert: Alert) -> None:
        c = self.conf
        msg = EmailMessage()
        # A CR or LF in a header would start a new header (a Bcc: of the alert's choosing);
        # the email package refuses it, which failed every retry and lost the alert.
        msg["Subject"] = one_line(f"{c.subject_prefix} {alert.title}")
        msg["From"] = one_line(c.sender)
        msg["To"] = one_line(", ".join(c.to))
        # RFC 5322 requires Date; a Message-ID lets a mail client thread and de-duplicate. The
        # sender's domain names it, since make_msgid's default asks DNS for this host's name.
        msg["Date"] = formatdate(alert.ts, usegmt=True)
        msg["Message-ID"] = make_msgid(idstring=alert.id, domain=_domain(c.sender))
        msg.set_content(alert.text())
        try:
            if c.security == "ssl":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(
                    c.host, c.effective_port, timeout=c.timeout_s, context=self._context()
                )
            else:
                smtp = smtplib.SMTP(c.host, c.effective_port, timeout=c.timeout_s)
            with smtp:
                if c.security == "starttls":
                    smtp.starttls(context=self._context())
                if c.username and self.password:
                    smtp.login(c.username, self.password)
                smtp.send_message(msg)
        except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
            raise self._fail(f"SMTP {c.host}:{c.effective_port}", f"{type(exc).__name__}: {exc}") from None


class CommandAlertSink(_Base):
    def __init__(self, conf: cfg.CommandSink, redactor: Redactor) -> None:
        super().__init__(conf, redactor)
        self.argv = list(conf.argv)
        self.timeout_s = conf.timeout_s

    def send(self, alert: Alert) -> None:
        payload = json.dumps(alert.to_dict())
        try:
            proc = subprocess.run(
                self.argv, input=payload, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise self._fail(f"command {self.argv[0]}", exc) from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout or "").strip()[-300:]
            raise self._fail(f"command {self.argv[0]} exited {proc.returncode}", tail or "no output")


def sink_names(confs: list[cfg.SinkConfig]) -> list[str]:
    """Each sink's label: its ``name``, else its type; one shared by several sinks gets its place.

    The router reports per label (``delivered``, ``undelivered``, ``alert test``'s lines): two
    webhooks both called ``webhook`` would read as one, the second's result over the first's.
    So a label that several sinks share becomes ``webhook#2``, its index in ``alerts.sinks``,
    the same number a config error about it names (``alerts.sinks.2``).
    """
    labels = [conf.name or conf.type for conf in confs]
    return [f"{label}#{i}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]


def build_sinks(
    config: cfg.AlertsConfig,
    redactor: Redactor,
    base_dir: Path | None = None,
    environ: dict[str, str] | None = None,
    console_said: ConsoleSaid | None = None,
) -> list[Sink]:
    """Turn sink configs into sinks, reading their secrets now.

    Every sink whose secret cannot be read is told at once, each under its key
    (``alerts.sinks.4.url_env: ...``), in one :class:`SecretError`: fixing them one run at a
    time would take as many starts as there are problems.

    ``console_said``: the host prints some events on a console of its own; a console sink
    leaves those to it (see :class:`ConsoleAlertSink`).
    """
    sinks: list[Sink] = []
    problems: list[str] = []
    for i, (conf, name) in enumerate(zip(config.sinks, sink_names(config.sinks), strict=True)):
        try:
            sink = _build_sink(conf, redactor, base_dir, environ, console_said)
        except SecretError as exc:
            problems.append(f"alerts.sinks.{i}.{exc}")
            continue
        sink.name = name
        sinks.append(sink)
    if problems:
        raise SecretError("\n".join(problems), problems)
    return sinks


def secret_problem(config: cfg.AlertsConfig, environ: dict[str, str] | None = None) -> SecretError | None:
    """What keeps the config's sinks from being built (``None``: nothing).

    A run checks this before it creates its folder: a missing ``url_env`` found by the
    supervisor's router would end the start in a traceback and leave a run folder with no status.
    """
    if not (config.enabled and config.sinks):
        return None
    try:
        build_sinks(config, Redactor(), environ=environ)
    except SecretError as exc:
        return exc
    return None


def _build_sink(
    conf: cfg.SinkConfig,
    redactor: Redactor,
    base_dir: Path | None,
    environ: dict[str, str] | None,
    console_said: ConsoleSaid | None,
) -> Sink:
    if isinstance(conf, cfg.ConsoleSink):
        return ConsoleAlertSink(conf, redactor, already_said=console_said)
    if isinstance(conf, cfg.JsonlSink):
        return JsonlAlertSink(conf, redactor, base_dir)
    if isinstance(conf, cfg.WebhookSink):
        url = resolve_secret("url", conf.url_env, conf.url_file, environ)
        assert url is not None  # the config validator demands one of the two
        return WebhookAlertSink(conf, redactor, url)
    if isinstance(conf, cfg.EmailSink):
        password = resolve_secret("password", conf.password_env, conf.password_file, environ)
        return EmailAlertSink(conf, redactor, password)
    return CommandAlertSink(conf, redactor)
