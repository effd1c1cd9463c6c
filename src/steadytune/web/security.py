"""Who may bind where, who may act: the dashboard's security checks, pure and testable."""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import socket
import urllib.parse
from collections.abc import Iterable, Mapping
from email.message import Message
from pathlib import Path

from steadytune.config.dashboard import DEFAULT_TOKEN_ENV
from steadytune.secretfile import InsecureSecretFile, read_secret_file

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


def reads_need_token(host: str, public_url: str | None = None) -> bool:
    """Whether other machines can reach the dashboard: bound off loopback, or behind a proxy.

    Then every read (the API, the streams, ``/metrics``) needs the token too, not only
    the operator controls: events, paths and checkpoints are not for the whole network.
    """
    return not is_loopback(host) or bool(public_url)


def check_bind(
    host: str, token: str | None, public_url: str | None = None, exposed: bool | None = None
) -> None:
    """Refuse to serve other machines without a (long enough) token, saying why and how to fix it.

    ``exposed`` overrides the judgement from ``host`` and ``public_url`` (see :func:`reads_need_token`).
    """
    if token is not None and len(token) < MIN_TOKEN_LEN:
        raise BindRefused(
            f"the dashboard token is {len(token)} characters; use at least {MIN_TOKEN_LEN} "
            "(e.g. `export STEADYTUNE_DASHBOARD_TOKEN=$(python -c 'import secrets; "
            "print(secrets.token_urlsafe(24))')`)"
        )
    if exposed is None:
        exposed = reads_need_token(host, public_url)
    if not exposed or token:
        return
    if is_loopback(host) and public_url:
        raise BindRefused(
            f"refusing to serve the dashboard at public_url {public_url}: behind a proxy it is reachable "
            f"from "
            f"other machines, and no token is set. Set {DEFAULT_TOKEN_ENV} (or dashboard.token_file), "
            "or remove public_url and use an SSH tunnel."
        )
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


def bearer(headers: Mapping[str, str] | Message) -> str | None:
    """The token from ``X-Steadytune-Token`` or ``Authorization: Bearer``; cookies are never read."""
    value = headers.get(TOKEN_HEADER)
    if value:
        return value.strip()
    auth = headers.get("Authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return None


_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,62}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*\.?$")


def split_host(host_header: str | None) -> str | None:
    """The name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower case; None if
    malformed."""
    if not host_header or len(host_header) > 300:
        return None
    value = host_header.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
        if not _HOST_NAME.match(name):
            return None
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and 0 < int(rest[1:]) < 65536):
        return None
    return name.lower().rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def machine_names() -> frozenset[str]:
    """This machine's own names (short, as configured, fully qualified), lower case."""
    names = {socket.gethostname(), socket.getfqdn()}
    names |= {n.split(".")[0] for n in names}
    return frozenset(n.lower().rstrip(".") for n in names if n)


def public_host(public_url: str | None) -> str | None:
    if not public_url:
        return None
    host = urllib.parse.urlsplit(public_url).hostname
    return host.lower().rstrip(".") if host else None


def host_allowed(
    host_header: str | None,
    bound_host: str,
    port: int | None = None,
    public_url: str | None = None,
    machine_names: Iterable[str] = (),
) -> bool:
    """Whether a request's ``Host`` names this dashboard: the defence against DNS rebinding.

    A page on another site that points its DNS name at this machine sends that name,
    so only our own names are accepted: loopback names (any port, so an SSH tunnel on
    another local port works), the host of ``public_url`` (behind a proxy) and, bound
    off loopback, the bound name, this machine's names and IP addresses (an address
    is not a name anyone can rebind). Ports are not compared: a rebinding page reaches
    the same port anyway, and tunnels and proxies change it.
    """
    del port  # see above: the name is what tells our pages from another site's
    name = split_host(host_header)
    if name is None:
        return False
    if is_loopback(name) or name == public_host(public_url):
        return True
    if is_loopback(bound_host):
        return False
    bound = bound_host.strip("[]").lower().rstrip(".")
    return _is_ip(name) or name == bound or name in {n.lower().rstrip(".") for n in machine_names}
