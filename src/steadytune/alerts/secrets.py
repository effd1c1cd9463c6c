"""Secrets for sinks: read from an env var or a file, never from the YAML; redacted everywhere.

A config names *where* a secret lives (``url_env: SLACK_WEBHOOK_URL`` or
``password_file: /run/secrets/smtp``); :func:`resolve_secret` reads it at the
last moment (a file the group or other users may read is refused: mode 600, see
:mod:`steadytune.secretfile`), and every resolved value is registered with a :class:`Redactor`
so that no log line, config dump, event or page can carry it.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from steadytune.secretfile import InsecureSecretFile, read_secret_file

MASK = "***"


class SecretError(ValueError):
    """A secret the config points at cannot be read; the message says which and how to fix it."""


def resolve_secret(
    key: str, env: str | None, file: str | Path | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The secret named by ``<key>_env`` or ``<key>_file``; ``None`` when neither is set."""
    environ = os.environ if environ is None else environ
    if env:
        value = environ.get(env)
        if not value:
            raise SecretError(
                f"{key}_env: environment variable {env} is not set; export {env}=... before starting"
            )
        return value.strip()
    if file:
        path = Path(file).expanduser()
        try:
            value = read_secret_file(path)
        except InsecureSecretFile as exc:
            raise SecretError(f"{key}_file: {exc}") from None
        except OSError as exc:
            raise SecretError(
                f"{key}_file: cannot read {path}: {exc.strerror}; create it (mode 600)"
            ) from exc
        except UnicodeDecodeError:
            raise SecretError(f"{key}_file: {path} is not UTF-8 text") from None
        if not value:
            raise SecretError(f"{key}_file: {path} is empty")
        return value
    return None


class Redactor:
    """Replaces every registered secret (and its URL-encoded form) with ``***``."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, secret: str | None) -> None:
        # Very short values would mask innocent text ("a", "1"); real secrets are longer.
        if not secret or len(secret) < 4:
            return
        with self._lock:
            self._secrets.add(secret)
            self._secrets.add(urllib.parse.quote(secret, safe=""))
            self._secrets.add(urllib.parse.quote_plus(secret))
            # A webhook URL's path is the secret part; error texts often carry it alone.
            parsed = urllib.parse.urlsplit(secret)
            if parsed.scheme and parsed.path and len(parsed.path) > 8:
                self._secrets.add(parsed.path)

    def __call__(self, text: str) -> str:
        return self.redact(text)

    def redact(self, text: str) -> str:
        if not text:
            return text
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
        for s in secrets:
            if s in text:
                text = text.replace(s, MASK)
        return text

    def redact_obj(self, obj: object) -> object:
        """A copy of a JSON-like value with every string redacted."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, dict):
            return {k: self.redact_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.redact_obj(v) for v in obj]
        return obj


def redact_url(url: str) -> str:
    """A URL fit for a log: scheme and host only (``https://hooks.slack.com/***``)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme:
        return MASK
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/{MASK}"
