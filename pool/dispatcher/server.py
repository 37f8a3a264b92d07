"""The dispatcher process: ``python -m pool.dispatcher --namespace NS``.

A grpc.aio server on uvloop (a unix socket in the namespace's private
directory, or ``HOST:0``) serving the Dispatcher service to clients. It
follows the namespace's discovery events (:mod:`pool.dispatcher.admission`
says which workers it links) into a
:class:`~pool.routing.placement.Router` and answers each client stream
(a :class:`~pool.dispatcher.service.ClientStream`) with batches of
results, and of the ids of tasks a worker has started, as they come. It
writes one ``READY {json}`` line (to ``--ready-fd``) once it serves.
Started and owned by the supervisor, which it tells which workers it has
linked (and with ``--telemetry`` what its tasks did), and which tells it
how the pool goes, on two pipes (:mod:`pool.dispatcher.supervised`).

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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import grpc
import uvloop
from grpc import aio

from discovery import backends, paths
from pool import dispatcher_pb2_grpc
from pool.dispatcher import admission, supervised
from pool.dispatcher.service import MAX_STREAM_TASKS, DispatcherService
from pool.dispatcher.settings import DispatcherSettings
from pool.dispatcher.telemetry import Telemetry
from pool.dispatcher.transfers import RelayService
from pool.routing.links import WorkerLink
from pool.routing.placement import Router
from workers.common import serving
from workers.common.spec import parse
from workers.protocol import auth, worker_pb2_grpc

log = logging.getLogger("pool.dispatcher.server")

SOCKET_NAME: Final = "dispatcher.sock"


LINGER_S: Final = 5.0  # at stop, how long to wait for the workers' last results
STREAMS_END_S: Final = 5.0  # then, for the client streams to take them


async def serve(settings: DispatcherSettings, tls_ca: bytes | None = None) -> None:
    """Serve the namespace's clients until told to stop; see the module doc.
    Workers are found in the namespace's shared memory, or in the registry
    at ``settings.discovery_url``; ``tls_ca`` is the CA (PEM) of the
    workers that serve TLS."""
    stopper = serving.Stopper(settings.parent_fd)
    try:
        token = auth.read_token(settings.namespace)
        reports = supervised.Reports()
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
        server, service = _server(token, router, settings.max_queued)
        ready, socket_path = _bind(server, settings)
        await server.start()
        reports.open(settings.report_fd)
        try:
            async with router:
                await _run(settings, router, service, ready, stopper, reports)
        finally:
            reports.close()
            await server.stop(1.0)
            if socket_path is not None:
                socket_path.unlink(missing_ok=True)
    finally:
        stopper.close()


def _server(
    token: str, router: Router, max_queued: int
) -> tuple[aio.Server, DispatcherService]:
    """The gRPC server, with its services: the clients' and the transfers'."""
    server = serving.server(token)
    service = DispatcherService(router, min(MAX_STREAM_TASKS, max_queued))
    dispatcher_pb2_grpc.add_DispatcherServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    relay = RelayService(router.links.get)
    worker_pb2_grpc.add_TransfersServicer_to_server(relay, server)  # type: ignore[no-untyped-call]
    return server, service


async def _run(
    settings: DispatcherSettings,
    router: Router,
    service: DispatcherService,
    ready: dict[str, object],
    stopper: serving.Stopper,
    reports: supervised.Reports,
) -> None:
    """Follow the registry and the supervisor, say READY, and serve until
    told to stop; then finish (:func:`_finish`)."""
    async with asyncio.TaskGroup() as group:
        following = group.create_task(
            admission.follow(
                settings.namespace,
                router,
                settings.discovery_url,
                settings.tls_ca is not None,
            )
        )
        others = []
        if settings.telemetry:
            router.telemetry = telemetry = Telemetry()
            reporting = supervised.report_stats(router, telemetry, reports)
            others.append(group.create_task(reporting))
        if (fd := settings.control_fd) is not None:
            others.append(group.create_task(supervised.obey(fd, router, stopper)))
        serving.announce_ready(settings.ready_fd, **ready)
        await stopper.wait()
        following.cancel()
        await _finish(router, service)
        for task in others:
            task.cancel()


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
