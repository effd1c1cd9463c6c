"""Who may bind where, who may act: the dashboard's security checks, pure and testable."""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

from steadytune.secretfile import InsecureSecretFile, read_secret_file
from steadytune.web.config import DEFAULT_TOKEN_ENV

TOKEN_HEADER = "X-Steadytune-Token"
MIN_TOKEN_LEN = 16


class BindRefused(RuntimeError):
    """The dashboard will not start on this address as configured; the message says why."""


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(
    cli_token: str | None = None,
    token_env: str | None = DEFAULT_TOKEN_ENV,
    token_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The operator token: ``--token``, else the env var, else the file; ``None`` if none.

    A ``token_file`` the group or other users may read is refused (``chmod 600`` it).
    """
    environ = os.environ if environ is None else environ
    if cli_token:
        return cli_token.strip()
    if token_env and environ.get(token_env):
        return environ[token_env].strip()
    if token_file is not None:
        try:
            return read_secret_file(token_file) or None
        except InsecureSecretFile as exc:
            raise BindRefused(f"token_file: {exc}") from None
        except OSError as exc:
            raise BindRefused(f"cannot read token_file {token_file}: {exc.strerror}") from exc
        except UnicodeDecodeError:
            raise BindRefused(f"token_file {token_file} is not UTF-8 text") from None
    return None


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a (long enough) token, saying why and how to fix it."""
    if token is not None and len(token) < MIN_TOKEN_LEN:
        raise BindRefused(
            f"the dashboard token is {len(token)} characters; use at least {MIN_TOKEN_LEN} "
            "(e.g. `export STEADYTUNE_DASHBOARD_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(24))')`)"
        )
    if is_loopback(host):
        return
    if not token:
        raise BindRefused(
            f"refusing to serve the dashboard on {host}: that address is reachable from other machines, "
            f"and no token is set. Set {DEFAULT_TOKEN_ENV} (or pass --token) to serve on {host}, "
            "or keep the default --host 127.0.0.1 and use an SSH tunnel."
        )


def token_ok(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison; no token configured means nobody may act."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8"))


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token from ``X-Steadytune-Token`` or ``Authorization: Bearer``; cookies are never read."""
    value = headers.get(TOKEN_HEADER)
    if value:
        return value.strip()
    auth = headers.get("Authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return None


def host_allowed(host_header: str | None, bound_host: str, port: int) -> bool:
    """On loopback, only loopback Host headers: a page on another site that rebinds its
    DNS name to 127.0.0.1 (DNS rebinding) then cannot read the API."""
    if not is_loopback(bound_host):
        return True
    if not host_header:
        return False
    name = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    if host_header.startswith("["):
        name = host_header.split("]")[0] + "]"
    return is_loopback(name.strip("[]"))
