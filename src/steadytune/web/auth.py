"""Who may do what, per request: the Host check, then the token a route's access asks for.

Three kinds of route (see :mod:`steadytune.web.routes`): ``OPEN`` (the pages, ``/static``,
``/healthz``, ``/api/auth``: they hold no data), ``READ`` (the API, the streams,
``/metrics``: open on loopback, the token once the dashboard is reachable from other
machines) and ``CONTROL`` (operator actions: a token must be configured, and sent). The
checks themselves are the pure ones of :mod:`steadytune.web.security`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.message import Message
from enum import Enum

from steadytune.web.app import DashboardApp
from steadytune.web.security import TOKEN_HEADER, bearer, host_allowed, token_ok


class Access(Enum):
    OPEN = "open"
    READ = "read"
    CONTROL = "control"


@dataclass(frozen=True)
class Denied:
    """Why a request is refused: the status, the message, any headers to send with it."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


def host_denied(app: DashboardApp, headers: Message) -> Denied | None:
    """Every request's ``Host`` must name this dashboard (the defence against DNS rebinding)."""
    if host_allowed(headers.get("Host"), app.host, app.port, app.public_url, app.machine_names):
        return None
    return Denied(
        403,
        "this dashboard does not answer to that Host name (DNS rebinding); use its address or a "
        "loopback name, or set dashboard.public_url to the URL you reach it by",
    )


def may_read(app: DashboardApp, headers: Message) -> bool:
    return not app.exposed or token_ok(app.token, bearer(headers))


def access_denied(app: DashboardApp, headers: Message, access: Access) -> Denied | None:
    """``None`` when the request may go on to its route, else why not."""
    if access is Access.READ and not may_read(app, headers):
        return Denied(
            401,
            f"this dashboard is reachable from other machines: send the token in the {TOKEN_HEADER} header "
            "or as Authorization: Bearer",
            {"WWW-Authenticate": 'Bearer realm="steadytune"'},
        )
    if access is Access.CONTROL:
        if not app.token:
            return Denied(403, "operator controls are off: start the dashboard with a token to enable them")
        if not token_ok(app.token, bearer(headers)):
            return Denied(401, f"a valid token is required in the {TOKEN_HEADER} header")
    return None
