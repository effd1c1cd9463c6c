"""Secrets for sinks: read from an env var or a file, never from the YAML; redacted everywhere.

A config names *where* a secret lives (``url_env: SLACK_WEBHOOK_URL`` or
``password_file: /run/secrets/smtp``); :func:`resolve_secret` reads it at the
last moment (a file the group or other users may read is refused: mode 600, see
:mod:`steadytune.secretfile`), and every resolved value is registered with a :class:`Redactor`
so that no log line, config dump, event or page can carry it (the redaction itself is
:mod:`steadytune.redact`'s).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from steadytune.secretfile import InsecureSecretFile, read_secret_file


class SecretError(ValueError):
    """A secret the config points at cannot be read; the message says which and how to fix it.

    ``problems``: one line per secret that cannot be read (the message joins them).
    """

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems) or [message]

    def render(self) -> str:
        """Every problem under its key, one a line, for a person."""
        lines = "".join(f"\n  - {p}" for p in self.problems)
        return f"the alerts' secrets cannot be read ({len(self.problems)}):{lines}"


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
