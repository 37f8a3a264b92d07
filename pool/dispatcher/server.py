"""The dispatcher process: ``python -m pool.dispatcher --namespace NS``.

A grpc.aio server on uvloop (a unix socket in the namespace's private
directory, or ``HOST:0``) serving the Dispatcher service to clients. It
follows the namespace's discovery events into a
:class:`~pool.dispatcher.placement.Router` and answers each client stream
(a :class:`~pool.dispatcher.service.ClientStream`) with batches of
results, and of the ids of tasks a worker has started, as they come. It
writes one ``READY {json}`` line (to ``--ready-fd``) once it serves, and
one line for each worker it has linked (to ``--report-fd``), and with
``--telemetry`` what its tasks did (:mod:`pool.dispatcher.telemetry`).
Started and owned by the supervisor, which tells it, one JSON line at a
time on ``--control-fd`` (a pipe only the supervisor can write to), when
the pool drains (``{"drain": true}``), how each worker ended
(``{"exit": {"pid": P, "status": "..."}}``), and that its initializer failed
too often (``{"broken": FAILURE}``: every task fails with it from then on).

It stops on SIGTERM, SIGINT, the end of the control pipe or the death of
the process ``--parent-fd`` names: it waits a bounded time for the last
results of the workers' tasks, fails what is left with
:class:`~pool.errors.PoolStopping`, delivers all of it, and only then ends
the client streams. Its background work (the router, discovery, the
control pipe, each client stream's reader) runs in task groups, so an
error in any ends the process, logged, with exit status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, assert_never
from uuid import UUID

import grpc
import uvloop
from grpc import aio

from discovery import WorkerInfo, backends, paths
from pool import dispatcher_pb2_grpc
from pool.dispatcher import messages
from pool.dispatcher.links import WorkerLink
from pool.dispatcher.placement import Router
from pool.dispatcher.service import MAX_STREAM_TASKS, DispatcherService
from pool.dispatcher.settings import DispatcherSettings
from pool.dispatcher.telemetry import REPORT_S, Telemetry
from pool.dispatcher.transfers import RelayService
from workers.common import channels, pipes, serving
from workers.common.spec import parse
from workers.protocol import auth, worker_pb2_grpc

log = logging.getLogger("pool.dispatcher.server")

SOCKET_NAME: Final = "dispatcher.sock"


LINGER_S: Final = 5.0  # at stop, how long to wait for the workers' last results
STREAMS_END_S: Final = 5.0  # then, for the client streams to take them
# a control order may carry a Failure, traceback and all: one line, whole
MAX_ORDER_BYTES: Final = 1 << 20


async def serve(settings: DispatcherSettings, tls_ca: bytes | None = None) -> None:
    """Serve the namespace's clients until told to stop; see the module doc.
    Workers are found in the namespace's shared memory, or in the registry
    at ``settings.discovery_url``; ``tls_ca`` is the CA (PEM) of the
    workers that serve TLS."""
    stopper = serving.Stopper(settings.parent_fd)
    try:
        token = auth.read_token(settings.namespace)
        reports = _Reports()
        router = Router(
            settings.namespace,
            WorkerLink.connector(
                token, grpc.ssl_channel_credentials(tls_ca) if tls_ca else None
            ),
            is_alive=backends.liveness_for(settings.discovery_url),
            no_worker_timeout_s=settings.no_worker_timeout_s,
            max_queued=settings.max_queued,
            on_linked=reports.linked,
        )
        server = aio.server(
            interceptors=[auth.CallInterceptor(token)],
            options=channels.GRPC_OPTIONS,
        )
        service = DispatcherService(router, min(MAX_STREAM_TASKS, settings.max_queued))
        dispatcher_pb2_grpc.add_DispatcherServicer_to_server(service, server)  # type: ignore[no-untyped-call]
        relay = RelayService(router.links.get)
        worker_pb2_grpc.add_TransfersServicer_to_server(relay, server)  # type: ignore[no-untyped-call]
        ready, socket_path = _bind(server, settings)
        await server.start()
        reports.open(settings.report_fd)
        try:
            async with router, asyncio.TaskGroup() as group:
                following = group.create_task(
                    _follow(
                        settings.namespace,
                        router,
                        settings.discovery_url,
                        tls_ca is not None,
                    )
                )
                reporting = None
                if settings.telemetry:
                    router.telemetry = Telemetry()
                    reporting = group.create_task(_report(router, reports))
                obeying = None
                if settings.control_fd is not None:
                    fd = settings.control_fd
                    obeying = group.create_task(_obey(fd, router, stopper))
                serving.announce_ready(settings.ready_fd, **ready)
                await stopper.wait()
                following.cancel()
                await _finish(router, service)
                for task in (obeying, reporting):
                    if task is not None:
                        task.cancel()
        finally:
            reports.close()
            await server.stop(1.0)
            if socket_path is not None:
                socket_path.unlink(missing_ok=True)
    finally:
        stopper.close()


class _Reports:
    """One JSON line to the supervisor (``--report-fd``) for each worker
    whose stream is up, so that the pool says ``ready`` only once every
    worker can be sent tasks; with ``--telemetry``, what tasks did, twice a
    second. Written without ever blocking the loop (the supervisor reads
    every line): :class:`workers.common.pipes.LineWriter`."""

    def __init__(self) -> None:
        self._writer: pipes.LineWriter | None = None

    def open(self, fd: int | None) -> None:
        if fd is not None:
            self._writer = pipes.LineWriter(fd)

    def linked(self, info: WorkerInfo) -> None:
        self._write(messages.Linked(str(info.uid)))

    def stats(self, telemetry: Telemetry, router: Router) -> None:
        self._write(messages.Stats(telemetry.report(router.links, router.queued)))

    def _write(self, report: messages.Report) -> None:
        if self._writer is not None:
            self._writer.write(messages.encode(report))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def _report(router: Router, to: _Reports) -> None:
    """Write what tasks did to the supervisor every :data:`REPORT_S` (a line
    of :data:`~pool.dispatcher.telemetry.MAX_BARS` bars at most) until
    cancelled, and once more then. The supervisor reads every line."""
    assert router.telemetry is not None
    try:
        while True:
            await asyncio.sleep(REPORT_S)  # a ticker, not a wait for an event
            to.stats(router.telemetry, router)
    finally:
        to.stats(router.telemetry, router)


def _bind(
    server: aio.Server, settings: DispatcherSettings
) -> tuple[dict[str, object], Path | None]:
    """Where the server listens: the READY line's fields, and its socket."""

    def socket() -> Path:
        return paths.namespace_dir(settings.namespace) / SOCKET_NAME

    tls = settings.tls
    address, socket_path = serving.bind(
        server,
        settings.host,
        socket,
        port=settings.port,
        advertise=settings.advertise,
        credentials=serving.server_credentials(*tls) if tls else None,
    )
    if not tls:
        return {"address": address}, socket_path
    # This machine's clients keep the private socket, in plain text.
    local, socket_path = serving.bind(server, None, socket)
    return {"address": local, "remote": address, "tls": True}, socket_path


async def _finish(router: Router, service: DispatcherService) -> None:
    """Stop: every result in (or failed), then to the clients, bounded."""
    await router.finish(LINGER_S)
    service.end_streams()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(STREAMS_END_S):
            await service.streams_ended()


async def _follow(
    namespace: str, router: Router, url: str | None, require_tls: bool
) -> None:
    """Pass the registry's events to the router, but none of a worker that
    is not to be sent tasks (and the token): see :func:`refusal`."""
    refused: set[UUID] = set()
    async for event in backends.subscriber_for(namespace, url):
        info = event.worker_info
        if info.uid in refused:
            if event.type == "worker-dropped":
                refused.discard(info.uid)
            continue
        if event.type == "worker-added" and (
            why := refusal(info, namespace, require_tls)
        ):
            log.warning("not linking worker %s at %s: %s", info.uid, info.address, why)
            refused.add(info.uid)
            continue
        router.on_event(event)


def refusal(info: WorkerInfo, namespace: str, require_tls: bool) -> str | None:
    """Why the dispatcher must not send ``info`` tasks and the token, if it
    must not. Whoever can write to the registry (Redis, say) could publish
    any address: a unix socket must be in the pool's own private directory,
    and once given a CA (``require_tls``), a worker on TCP must serve TLS,
    so that its certificate is checked against the CA."""
    if info.address.startswith("unix:"):
        home = paths.namespace_dir(namespace, create=False)
        if Path(info.address[5:]).parent != home:
            return f"its unix socket is outside the pool's directory {home}"
        return None
    if require_tls and info.extra.get(channels.TLS_EXTRA) != "1":
        return "it does not serve TLS, and the pool requires it (--tls-ca)"
    return None


async def _obey(fd: int, router: Router, stopper: serving.Stopper) -> None:
    """Follow the supervisor's control lines (``fd``, which this closes);
    their end means it is gone."""
    try:
        async with contextlib.aclosing(pipes.lines(fd, MAX_ORDER_BYTES)) as orders:
            async for line in orders:
                try:
                    _carry_out(messages.order(line), router)
                except messages.BadLine as exc:
                    log.warning("ignoring a control line: %s", exc)
        stopper.stop()
    finally:
        os.close(fd)


def _carry_out(order: messages.Order, router: Router) -> None:
    """:raises messages.BadLine: for a :class:`~pool.dispatcher.messages.Broken`
    whose failure is not one."""
    match order:
        case messages.Drain():
            router.stop_taking()
        case messages.Started():
            router.started()
        case messages.Exited(pid, status):
            router.record_exit(pid, status)
        case messages.Broken():
            router.broken(order.parsed())
        case _:
            assert_never(order)


def _read(path: str) -> bytes:
    with open(path, "rb") as source:
        return source.read()


DESCRIPTION: Final = "Run a pool's dispatcher (started by `python -m pool up`)."


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pool.dispatcher``: run it as its command line says."""
    settings = parse(
        DispatcherSettings,
        argv,
        prog="python -m pool.dispatcher",
        description=DESCRIPTION,
    )
    return run(settings)


def run(settings: DispatcherSettings) -> int:
    """Run the dispatcher with these settings (the zygote's entry); its exit
    status."""
    serving.redirect_output(settings.output_fd)
    logging.basicConfig(level=logging.WARNING, format="dispatcher: %(message)s")
    # watchdog warns when a watched directory's last events race the
    # observer's stop, as they do when the pool's files are removed at exit.
    logging.getLogger("watchdog").setLevel(logging.ERROR)
    try:
        tls_ca = _read(settings.tls_ca) if settings.tls_ca else None
        uvloop.run(serve(settings, tls_ca))
    except KeyboardInterrupt:
        pass
    except (serving.CannotListen, OSError) as exc:
        print(f"dispatcher: error: {exc}", file=sys.stderr)
        return 1
    except Exception:  # a background task died: say why, and be restarted
        log.exception("stopped by an unexpected error")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
