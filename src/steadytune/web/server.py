"""The dashboard server: stdlib ``ThreadingHTTPServer`` in a background thread.

Routes (all GET unless said; the table is :data:`steadytune.web.routes.ROUTES`). Served to
other machines (bound off loopback, or behind a proxy at ``public_url``), every route but
the pages, ``/static``, ``/healthz`` and ``/api/auth`` needs the token:

    /                          runs page            /run/<id>            run page
    /static/<file>             assets               /metrics             Prometheus exposition
    /api/runs                  runs (JSON)          /api/stream          runs, live (SSE)
    /api/runs?q=&state=&sort=&order=&offset=&limit=  one page of them, counts of all (and /api/stream?...)
    /api/runs/<id>             one run              /api/runs/<id>/series?points=&lo=&hi=
    /api/runs/<id>/events?after=<seq>               /api/runs/<id>/stream?since=<version>&after=<seq> (SSE)
    /api/runs/<id>/gradflow?points=&lo=&hi=         gradient-flow heat map (layers × recorded steps)
    /api/runs/<id>/gradhist?step=                   |grad| histogram per layer at one gradient-flow recording
    /api/goodput               every run's goodput account (and, on a server, each GPU's hours)
    /api/auth                  may this client act? /healthz
    POST /api/runs/<id>/control   {"command", "issuer", "confirm": true} with the token in a header
    /server                    GPU server page      /api/server          its GPUs, reservations and queue
    POST /api/server/jobs/<id>/<cancel|hold|release>   {"confirm": true} with the token in a header
                               (the server routes exist when `steadytune server --dashboard` serves it)

The supervisor stays light: no framework, one thread per connection (at most
``max_connections``, of which ``max_streams`` live streams; beyond, 503 with
``Retry-After``), every request read within ``request_timeout_s`` and its line and headers
within 64 KiB, one indexer thread that tails the runs that have no live supervisor, one reader
thread that has the runs this dashboard never read read by a child process, newest first
(:mod:`~steadytune.web.warm`). The
parts: :mod:`~steadytune.web.handler` (one connection's requests), :mod:`~steadytune.web.routes`
(the table and its endpoints), :mod:`~steadytune.web.auth`, :mod:`~steadytune.web.body`,
:mod:`~steadytune.web.sse`, :mod:`~steadytune.web.httpserver` (the connection caps).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.web.app import DashboardApp
from steadytune.web.handler import Handler
from steadytune.web.httpserver import BoundedServer
from steadytune.web.runs import RunsIndex
from steadytune.web.security import check_bind, is_loopback, machine_names, reads_need_token
from steadytune.web.warm import BackgroundReader


def make_handler(app: DashboardApp, request_timeout_s: float = 10.0) -> type[Handler]:
    # ``timeout`` is the socket timeout of each connection (StreamRequestHandler.setup).
    return type("DashboardHandler", (Handler,), {"app": app, "timeout": request_timeout_s})


@dataclass
class DashboardHandle:
    """A running dashboard: ``url`` to open, ``stop()`` to end it."""

    url: str
    host: str
    port: int
    app: DashboardApp
    _server: BoundedServer
    _threads: list[threading.Thread]
    _reader: BackgroundReader

    def stop(self, timeout: float = 5.0) -> None:
        self.app.stopping.set()
        self._reader.stop()
        self._server.shutdown()
        self._server.server_close()
        for t in self._threads:
            t.join(timeout)
        self.app.index.close()


def start_dashboard(
    runs_dir: Path,
    host: str = "127.0.0.1",
    port: int = 7860,
    token: str | None = None,
    clock: Callable[[], float] = time.time,
    poll_s: float = 0.25,
    *,
    public_url: str | None = None,
    request_timeout_s: float = 10.0,
    max_connections: int = 64,
    max_streams: int = 16,
    exposed: bool | None = None,
    server: Any = None,
    metrics_keep_finished_s: float = 24 * 3600.0,
    read_gate: threading.Semaphore | None = None,
) -> DashboardHandle:
    """Serve the dashboard of every run under ``runs_dir`` from a background thread.

    ``public_url``: the URL it is reached at behind a reverse proxy (its host is
    accepted in Host headers). Bound off loopback or given a ``public_url``, the
    dashboard is *exposed*: every read needs the token; ``exposed`` overrides that
    judgement (tests, or a loopback port forwarded to the network).
    ``request_timeout_s``, ``max_connections``, ``max_streams``: see DashboardConfig.
    ``server``: the GPU server's daemon, for the server page and its API.
    ``metrics_keep_finished_s``: how long after its end a run keeps its series in ``/metrics``
    (``inf``: always; docs/prometheus.md).
    ``read_gate``: the background reader takes a permit of it before each run it reads
    (:class:`~steadytune.web.warm.BackgroundReader`); ``None`` reads freely.

    Raises :class:`steadytune.web.security.BindRefused` when exposed without a
    token, and ``OSError`` when the port is taken.
    """
    if exposed is None:
        exposed = reads_need_token(host, public_url)
    check_bind(host, token, public_url=public_url, exposed=exposed)
    max_streams = max(1, min(max_streams, max_connections - 1))
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    index = RunsIndex(Path(runs_dir), clock=clock, background=True)
    # Its cache folder is made first: a stop (SIGTERM is raised as an exception) or a failure
    # before the handle is returned, which would close it, must not leave that folder behind.
    try:
        app = DashboardApp(
            index=index, host=host, port=port, token=token, clock=clock, poll_s=poll_s, exposed=exposed,
            public_url=public_url, machine_names=machine_names() if not is_loopback(host) else frozenset(),
            max_streams=max_streams, server=server, metrics_keep_finished_s=metrics_keep_finished_s,
        )  # fmt: skip
        server = BoundedServer(
            (host.strip("[]"), port),
            make_handler(app, request_timeout_s),
            family,
            max_connections,
            request_timeout_s,
        )
        app.port = server.server_address[1]
        serve = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.25},
            name="steadytune-dashboard",
            daemon=True,
        )
        indexer = threading.Thread(target=app.indexer, name="steadytune-indexer", daemon=True)
        background = BackgroundReader(index, app.stopping, gate=read_gate)
        reader = threading.Thread(target=background.run, name="steadytune-reader", daemon=True)
        reaper = threading.Thread(
            target=server.reap, args=(app.stopping,), name="steadytune-reaper", daemon=True
        )
        serve.start()
        indexer.start()
        reader.start()
        reaper.start()
    except BaseException:
        index.close()
        raise
    shown = host if is_loopback(host) or host not in ("0.0.0.0", "::") else socket.getfqdn()
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    url = f"http://{shown}:{app.port}/"
    return DashboardHandle(
        url=url,
        host=host,
        port=app.port,
        app=app,
        _server=server,
        _threads=[serve, indexer, reader, reaper],
        _reader=background,
    )


__all__ = ["DashboardHandle", "start_dashboard"]
