"""The dashboard's HTTP server: aiohttp, on the supervisor's own loop.

Routes: ``/`` (the page), ``/static/...`` (its script and style, ours),
``/events`` (Server-Sent Events: a ``snapshot`` with the first push after
it connects, then a ``changes`` event every :data:`PUSH_S` while anything
changes, and at least once a second), ``/api/state`` (the snapshot as JSON) and
``/metrics`` (Prometheus' text format, :mod:`.metrics`).

Access: :mod:`.access` (trusted on loopback; elsewhere the dashboard's own
key, never the pool's token). Off loopback, a pool with a certificate
(``--tls-cert``, ``--tls-key``) serves the page over TLS with it.

Bounds: each page gets a queue of :data:`PAGE_QUEUE` messages; a page that
falls that far behind is disconnected (its browser reconnects and gets a
fresh snapshot), so a slow page never makes the supervisor hold more.
:meth:`Dashboard.aclose` ends every stream, then the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Callable
from importlib import resources
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler

from discovery.errors import Facts
from pool.client.rendezvous import Locator
from pool.errors import PoolError
from pool.supervisor.dashboard import dispatchers
from pool.supervisor.dashboard.access import Access
from pool.supervisor.dashboard.board import Board
from pool.supervisor.dashboard.metrics import Metrics

PUSH_S: Final = 0.5
PAGE_QUEUE: Final = 16
STATIC: Final = frozenset({"dashboard.js", "dashboard.css"})
_TYPES: Final = {".js": "text/javascript", ".css": "text/css"}
SHUTDOWN_S: Final = 2.0


class DashboardUnavailable(Facts, PoolError, OSError):
    """The dashboard cannot listen where it was asked to."""

    host: str
    port: int
    reason: str

    MESSAGE = (
        "the dashboard cannot listen on {host}:{port}: {reason}; give another "
        "with --dashboard [HOST:]PORT (port 0: any free one)"
    )


class Dashboard:
    """Serves ``board`` on ``host:port`` from :meth:`start` to :meth:`aclose`.

    :param tls: the certificate and key to serve the page with (off
        loopback), or None for plain HTTP.
    :param remote: how to find the dispatchers of a pool on Redis: each is
        shown (:mod:`.dispatchers`).
    """

    def __init__(
        self,
        board: Board,
        metrics: Metrics,
        host: str,
        port: int,
        *,
        tls: tuple[str, str] | None = None,
        remote: Locator | None = None,
    ) -> None:
        self.board, self.metrics, self._remote = board, metrics, remote
        self._host, self._port, self._tls = host, port, tls
        self._access = Access(None, secure=tls is not None)
        self._pages: set[asyncio.Queue[bytes | None]] = set()
        self._joining: list[asyncio.Queue[bytes | None]] = []  # want a snapshot
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []  # (in the stack's group)
        self.url = ""

    async def start(
        self, token: str, key: str | None = None, here: Callable[[], str] = str
    ) -> str:
        """Listen, and push changes to pages from now on; the page's URL.

        :param token: the pool's (to ask the dispatchers of a pool on Redis;
            never asked of a page, nor given to one).
        :param key: the dashboard's key, which every request must give;
            None on loopback, where none is asked.
        :param here: this host's dispatcher's announced address (on Redis).
        :raises DashboardUnavailable: if it cannot listen there.
        """
        self._access = Access(key, secure=self._tls is not None)
        app = web.Application(middlewares=[self._check])
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/events", self._events)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        try:
            context = _tls_context(*self._tls) if self._tls else None
            site = web.TCPSite(runner, self._host, self._port, ssl_context=context)
            await site.start()
        except OSError as exc:
            await self._stack.aclose()
            reason = exc.strerror or str(exc)
            raise DashboardUnavailable(self._host, self._port, reason) from None
        port = self._access.port = runner.addresses[0][1]  # (bound, for port 0)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.url = f"{'https' if self._tls else 'http'}://{host}:{port}/"
        group = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._tasks.append(group.create_task(self._push()))
        if self._remote is not None:
            watching = dispatchers.watch(self.board, self._remote, token, here)
            self._tasks.append(group.create_task(watching))
        return self.url

    async def aclose(self) -> None:
        """End every page's stream, then the server."""
        for task in self._tasks:
            task.cancel()
        for page in [*self._pages, *self._joining]:
            _disconnect(page)
        await self._stack.aclose()

    # -- pushing ---------------------------------------------------------------

    async def _push(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(PUSH_S)  # a ticker: pages are sent what changed
            ticks += 1
            if ticks % round(1 / PUSH_S) == 0:
                self.board.sample()
            changes = self.board.take_changes()
            if changes is not None and self._pages:
                message = _event("changes", changes)
                for page in list(self._pages):
                    if page.full():  # too far behind: it reconnects afresh
                        _disconnect(page)
                        self._pages.discard(page)
                    else:
                        page.put_nowait(message)
            if self._joining:  # after the changes: a snapshot holds them all
                snapshot = _event("snapshot", self.board.snapshot())
                for page in self._joining:
                    page.put_nowait(snapshot)
                self._pages.update(self._joining)
                self._joining.clear()

    # -- routes ----------------------------------------------------------------

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        page: asyncio.Queue[bytes | None] = asyncio.Queue(PAGE_QUEUE + 1)
        self._joining.append(page)  # its snapshot comes with the next push
        try:
            while (message := await page.get()) is not None:
                await response.write(message)
        except ConnectionResetError:
            pass  # the page went away
        finally:
            self._pages.discard(page)
            if page in self._joining:
                self._joining.remove(page)
        return response

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=_read("index.html"), content_type="text/html")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        kind = _TYPES[name[name.rindex(".") :]]
        return web.Response(text=_read(name), content_type=kind)

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.board.snapshot())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.text(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    # -- access ----------------------------------------------------------------

    @web.middleware
    async def _check(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        self._access.check(request)  # (raises the refusal, or the redirect)
        return await handler(request)


def _tls_context(cert: str, key: str) -> ssl.SSLContext:
    """The page's TLS: the pool's certificate and key, TLS 1.2 or newer."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def _event(kind: str, data: dict[str, Any]) -> bytes:
    data_line = json.dumps(data, separators=(",", ":"))
    return f"event: {kind}\ndata: {data_line}\n\n".encode()


def _disconnect(page: asyncio.Queue[bytes | None]) -> None:
    while not page.empty():
        page.get_nowait()
    page.put_nowait(None)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text()
