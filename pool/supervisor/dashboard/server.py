"""The dashboard's HTTP server: aiohttp, on the supervisor's own loop.

Routes: ``/`` (the page), ``/static/...`` (its script and style, ours),
``/events`` (Server-Sent Events: a ``snapshot`` with the first push after
it connects, then a ``changes`` event every :data:`PUSH_S` while anything
changes, and at least once a second), ``/api/state`` (the snapshot as JSON) and
``/metrics`` (Prometheus' text format, :mod:`.metrics`).

Access: on a loopback address, this machine's users are trusted, as with
the pool's unix sockets (a request whose Host is not a loopback name is
refused: a foreign page that rebinds its name to 127.0.0.1 reads nothing).
On any other, every request needs the pool's token: ``Authorization:
Bearer TOKEN``, or once ``?token=TOKEN``, which sets an HttpOnly cookie and
redirects to the same page without it.

Bounds: each page gets a queue of :data:`PAGE_QUEUE` messages; a page that
falls that far behind is disconnected (its browser reconnects and gets a
fresh snapshot), so a slow page never makes the supervisor hold more.
:meth:`Dashboard.aclose` ends every stream, then the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import Callable
from importlib import resources
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler

from pool.client.rendezvous import Locator
from pool.supervisor.dashboard import dispatchers, is_loopback
from pool.supervisor.dashboard.board import Board
from pool.supervisor.dashboard.metrics import Metrics

PUSH_S: Final = 0.5
PAGE_QUEUE: Final = 16
COOKIE: Final = "shmpool_token"
STATIC: Final = frozenset({"dashboard.js", "dashboard.css"})
_TYPES: Final = {".js": "text/javascript", ".css": "text/css"}
SHUTDOWN_S: Final = 2.0


class DashboardUnavailable(OSError):
    """The dashboard cannot listen where it was asked to."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        self.host, self.port = host, port
        super().__init__(
            f"the dashboard cannot listen on {host}:{port}: {error.strerror or error}"
            "; give another with --dashboard [HOST:]PORT (port 0: any free one)"
        )


class Dashboard:
    """Serves ``board`` on ``host:port`` from :meth:`start` to :meth:`aclose`.

    :param needs_token: whether every request must give the pool's token
        (not on loopback).
    :param remote: how to find the dispatchers of a pool on Redis: each is
        shown (:mod:`.dispatchers`).
    """

    def __init__(
        self,
        board: Board,
        metrics: Metrics,
        host: str,
        port: int,
        needs_token: bool,
        *,
        remote: Locator | None = None,
    ) -> None:
        self.board, self.metrics, self._remote = board, metrics, remote
        self._host, self._port, self._needs_token = host, port, needs_token
        self._token: str | None = None
        self._pages: set[asyncio.Queue[bytes | None]] = set()
        self._joining: list[asyncio.Queue[bytes | None]] = []  # want a snapshot
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []  # (in the stack's group)
        self.url = ""

    async def start(self, token: str, here: Callable[[], str] = str) -> str:
        """Listen, and push changes to pages from now on; the page's URL.

        :param token: the pool's (asked of every request if ``needs_token``).
        :param here: this host's dispatcher's announced address (on Redis).
        :raises DashboardUnavailable: if it cannot listen there.
        """
        self._token = token if self._needs_token else None
        app = web.Application(middlewares=[self._access])
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/events", self._events)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._stack.aclose()
            raise DashboardUnavailable(self._host, self._port, exc) from None
        port = runner.addresses[0][1]  # (the port bound, for port 0)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.url = f"http://{host}:{port}/"
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
    async def _access(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        token = self._token
        if token is None:
            # Trusted on loopback, but not a page elsewhere that renamed
            # itself to this address (DNS rebinding): its Host names it.
            if not is_loopback((request.url.host or "").strip("[]")):
                raise web.HTTPForbidden(
                    text="this dashboard answers only to loopback names\n"
                )
            return await handler(request)
        if _same(request.query.get("token"), token):
            kept = {k: v for k, v in request.query.items() if k != "token"}
            response = web.HTTPSeeOther(location=str(request.rel_url.with_query(kept)))
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
            raise response
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else None
        if _same(given, token) or _same(request.cookies.get(COOKIE), token):
            return await handler(request)
        raise web.HTTPUnauthorized(
            text="this dashboard needs the pool's token: open it once as "
            "/?token=TOKEN (the contents of the pool's --token-file), or send "
            "the header 'Authorization: Bearer TOKEN'\n"
        )


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _event(kind: str, data: dict[str, Any]) -> bytes:
    data_line = json.dumps(data, separators=(",", ":"))
    return f"event: {kind}\ndata: {data_line}\n\n".encode()


def _disconnect(page: asyncio.Queue[bytes | None]) -> None:
    while not page.empty():
        page.get_nowait()
    page.put_nowait(None)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text()
