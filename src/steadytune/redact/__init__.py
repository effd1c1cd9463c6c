"""Redaction: the one place that decides what of a text, a command line, a URL or a config is secret.

Whatever steadytune logs, stores, chains into ``events.jsonl``, shows on the console or the
dashboard, or writes into ``env.json`` and repro bundles passes through :func:`redact` first.
The rules, applied to every string:

- credentials in a URL (``https://user:pass@host/`` → ``https://***@host/``);
- tokens of the well-known shapes wherever they appear (Hugging Face, OpenAI, GitHub, Slack,
  AWS access keys, ``Bearer ...`` headers, Slack webhook paths);
- a value given to a key that names a secret: ``--hub_token VALUE``, ``--password=VALUE``,
  ``HF_TOKEN=VALUE``, ``"api_key": "VALUE"``, ``password: VALUE``, ``?token=VALUE``.

A mapping's value whose key names a secret is masked whole (a config's ``password: x``);
``*_env`` and ``*_file`` keys name *where* a secret lives and are kept. A list of strings is
read as a command line, so a secret flag's value that follows it as the next word is masked.
:class:`Redactor` adds values known to be secret (the resolved secrets of the alert sinks).
:mod:`steadytune.redact.paths` takes the machine (paths, user, host) out of a repro bundle.

Ground floor, standard library only: every part of steadytune may use it.
"""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"

# Words that make a key secret when they are a part of it (``hub_token``, ``HF_TOKEN``, ``db-password``)
# or end it (``hubToken``); a part, not a substring, so ``max_tokens`` and ``tokenizer`` stay readable.
SECRET_WORDS = frozenset(
    {"password", "passwd", "token", "secret", "credential", "credentials", "auth", "apikey"}
)
SECRET_PHRASES = ("api_key", "private_key", "access_key", "secret_key", "webhook_url")
# A config names *where* a secret lives with these: the name of a variable or a file is not the secret.
_KEPT_SUFFIXES = ("_env", "_file")
_ENDINGS = tuple(sorted(SECRET_WORDS | {p.replace("_", "") for p in SECRET_PHRASES}))

# Each pattern that opens with a run of word characters starts only where such a run starts (the
# look-behind): tried at every position of a long word, the run was scanned to its end each time,
# and a 100 kB line without spaces (base64, a minified JSON) took minutes, quadratic in its length.
_URL_CREDENTIALS = re.compile(
    r"(?<![a-z0-9+.-])(?P<scheme>[a-z][a-z0-9+.-]*://)[^/\s:@]+(?::[^/\s@]*)?@", re.IGNORECASE
)
_TOKENS = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})\b"
    r"|hooks\.slack\.com/services/[A-Za-z0-9/]+|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{16,}"
)
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|[^\s"',&;?]+)"""
# ``key = value``, ``key: value``, ``"key": "value"``, ``KEY=value``, ``--key=value``, ``?key=value``
_ASSIGNED = re.compile(
    rf"""(?<![\w.-])(?P<key>["']?[\w.-]+["']?)(?P<sep>[ \t]*(?:=|:(?!//))[ \t]*)(?P<value>{_VALUE})"""
)
# ``--key value``: a flag, then its value as the next word
_FLAG_VALUE = re.compile(rf"(?<![\w-])(?P<key>--?[A-Za-z][\w.-]*)(?P<sep>[ \t]+)(?P<value>(?!-){_VALUE})")
_FLAG = re.compile(r"^(?P<flag>--?[A-Za-z][\w.-]*)(?:=(?P<value>.*))?$", re.DOTALL)


def is_secret_key(key: str) -> bool:
    """Whether ``key`` (a config key, a ``--flag``, an environment variable, a JSON key) names a secret."""
    norm = re.sub(r"[^a-z0-9]+", "_", key.strip("\"'").lower()).strip("_")
    if not norm or norm.endswith(_KEPT_SUFFIXES):
        return False
    if SECRET_WORDS.intersection(norm.split("_")):
        return True
    wrapped = f"_{norm}_"
    return any(f"_{p}_" in wrapped for p in SECRET_PHRASES) or norm.replace("_", "").endswith(_ENDINGS)


def _mask_if_secret(m: re.Match[str]) -> str:
    if not is_secret_key(m.group("key")) or m.group("value") == MASK:
        return m.group(0)
    return m.group("key") + m.group("sep") + MASK


def redact_text(text: str) -> str:
    """``text`` with URL credentials, known token shapes and values given to secret keys masked."""
    if not text:
        return text
    text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + MASK + "@", text)
    text = _TOKENS.sub(MASK, text)
    text = _FLAG_VALUE.sub(_mask_if_secret, text)
    return _ASSIGNED.sub(_mask_if_secret, text)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line fit to record: each word redacted, and the word after a secret flag masked."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        word = str(word)
        if hide_next and not word.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        m = _FLAG.match(word)
        if m and is_secret_key(m.group("flag")):
            if m.group("value") is None:
                out.append(word)
                hide_next = True
            else:
                out.append(f"{m.group('flag')}={MASK}")
            continue
        out.append(redact_text(word))
    return out


def redact(value: Any) -> Any:
    """A copy of ``value`` (text, a command line, a config or any JSON-like value) with its secrets
    masked: the one function every record, log line and page goes through."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: MASK if is_secret_key(str(k)) and v not in (None, "") else redact(v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return redact_argv(value)
        return [redact(v) for v in value]
    return value


def redact_url(url: str) -> str:
    """A URL fit for a log when all of it may be secret (a webhook): scheme and host only."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme:
        return MASK
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/{MASK}"


class Redactor:
    """:func:`redact`, plus the values known to be secret (and their URL-encoded forms)."""

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
        return redact_text(text)

    def redact_obj(self, obj: Any) -> Any:
        """A copy of a JSON-like value with every string redacted."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, Mapping):
            return {k: MASK if is_secret_key(str(k)) and v not in (None, "") else self.redact_obj(v)
                    for k, v in obj.items()}  # fmt: skip
        if isinstance(obj, (list, tuple)):
            return redact([self.redact_obj(v) for v in obj])
        return obj


__all__ = ["MASK", "Redactor", "is_secret_key", "redact", "redact_argv", "redact_text", "redact_url"]
