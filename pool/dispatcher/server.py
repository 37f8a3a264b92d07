"""The dispatcher process: ``python -m pool.dispatcher --namespace NS``.

A grpc.aio server on uvloop (a unix socket in the namespace's private
directory, or ``HOST:0``) serving the Dispatcher service to clients. It
follows the namespace's discovery events into a
:class:`~pool.dispatcher.placement.Router` and answers each client stream
(a :class:`~pool.dispatcher.service.ClientStream`) with batches of
results, and of the ids of tasks a worker has taken, as they come. It
writes one ``READY {json}`` line (to ``--ready-fd``) once it serves.
Started and owned by the supervisor, which tells it, one JSON line at a
time on ``--control-fd`` (a pipe only the supervisor can write to), when
the pool drains (``{"drain": true}``) and how each worker ended
(``{"exit": {"pid": P, "status": "..."}}``).

It stops on SIGTERM, SIGINT, the end of the control pipe or the death of
the process ``--parent-fd`` names: it waits a bounded time for the last
results of the workers' tasks, fails what is left with
:class:`~pool.errors.PoolStopping`, delivers all of it, and only then ends
the client streams. Its background work (the router, discovery, the
control pipe, each client stream's reader) runs in task groups, so an
error in any ends the process, logged, with exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final
from uuid import UUID

import grpc
import uvloop
from grpc import aio

from discovery import WorkerInfo, backends, paths
from pool import dispatcher_pb2_grpc
from pool.dispatcher.links import WorkerLink
from pool.dispatcher.placement import NO_WORKER_TIMEOUT_S, Router
from pool.dispatcher.queue import MAX_QUEUED
from pool.dispatcher.service import MAX_STREAM_TASKS, DispatcherService
from workers import serving
from workers.protocol import auth
from workers.serving import TLS_KEY

log = logging.getLogger("pool.dispatcher.server")

SOCKET_NAME: Final = "dispatcher.sock"


LINGER_S: Final = 5.0  # at stop, how long to wait for the workers' last results
STREAMS_END_S: Final = 5.0  # then, for the client streams to take them


async def serve(
    namespace: str,
    *,
    host: str | None = None,
    port: int = 0,
    advertise: str | None = None,
    tls: tuple[str, str] | None = None,
    parent_fd: int | None = None,
    control_fd: int | None = None,
    ready_fd: int | None = None,
    no_worker_timeout_s: float = NO_WORKER_TIMEOUT_S,
    max_queued: int = MAX_QUEUED,
    discovery_url: str | None = None,
    tls_ca: bytes | None = None,
) -> None:
    """Serve the namespace's clients until told to stop; see the module doc.
    Workers are found in the namespace's shared memory, or in the registry
    at ``discovery_url`` (``redis://...``). With ``tls`` (certificate and
    key files), the TCP port of ``host`` serves TLS, for clients of other
    machines, and this machine's clients use the unix socket."""
    stopper = serving.Stopper(parent_fd)
    try:
        token = auth.read_token(namespace)
        router = Router(
            namespace,
            WorkerLink.connector(
                token, grpc.ssl_channel_credentials(tls_ca) if tls_ca else None
            ),
            is_alive=backends.liveness_for(discovery_url),
            no_worker_timeout_s=no_worker_timeout_s,
            max_queued=max_queued,
        )
        server = aio.server(
            interceptors=[auth.CallInterceptor(token)],
            options=serving.GRPC_OPTIONS,
        )
        service = DispatcherService(router, min(MAX_STREAM_TASKS, max_queued))
        dispatcher_pb2_grpc.add_DispatcherServicer_to_server(service, server)  # type: ignore[no-untyped-call]

        def socket() -> Path:
            return paths.namespace_dir(namespace) / SOCKET_NAME

        address, socket_path = serving.bind(
            server,
            host,
            socket,
            port=port,
            advertise=advertise,
            credentials=serving.server_credentials(*tls) if tls else None,
        )
        ready: dict[str, object] = {"address": address}
        if tls:  # this machine's clients keep the private socket, in plain text
            local, socket_path = serving.bind(server, None, socket)
            ready = {"address": local, "remote": address, "tls": True}
        await server.start()
        try:
            async with router, asyncio.TaskGroup() as group:
                following = group.create_task(
                    _follow(namespace, router, discovery_url, tls_ca is not None)
                )
                obeying = None
                if control_fd is not None:
                    obeying = group.create_task(_obey(control_fd, router, stopper))
                serving.announce_ready(ready_fd, **ready)
                await stopper.wait()
                following.cancel()
                await router.finish(LINGER_S)  # every result in, or failed
                service.end_streams()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STREAMS_END_S):
                        await service.streams_ended()
                if obeying is not None:
                    obeying.cancel()
        finally:
            await server.stop(1.0)
            if socket_path is not None:
                socket_path.unlink(missing_ok=True)
    finally:
        stopper.close()


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
    if require_tls and info.extra.get(TLS_KEY) != "1":
        return "it does not serve TLS, and the pool requires it (--tls-ca)"
    return None


async def _obey(fd: int, router: Router, stopper: serving.Stopper) -> None:
    """Follow the supervisor's control lines; their end means it is gone."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
    )
    try:
        while line := await reader.readline():
            try:
                order = json.loads(line)
            except ValueError:
                log.warning("ignoring a control line that is not JSON: %r", line)
                continue
            if order.get("drain"):
                router.stop_taking()
            if order.get("started"):
                router.started()
            if isinstance(exit := order.get("exit"), dict):
                router.record_exit(int(exit["pid"]), str(exit["status"]))
        stopper.stop()
    finally:
        transport.close()


def _read(path: str) -> bytes:
    with open(path, "rb") as source:
        return source.read()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pool.dispatcher.server",
        description="Run a pool's dispatcher (started by `python -m pool up`).",
    )
    parser.add_argument("--namespace", default="default")
    parser.add_argument(
        "--host",
        nargs="?",
        const=serving.LOOPBACK,
        help=f"listen on TCP HOST:<free port> (default {serving.LOOPBACK})",
    )
    serving.add_tcp_arguments(
        parser,
        who="clients of other machines check it; this machine's use the unix socket",
    )
    parser.add_argument(
        "--parent-fd", type=int, help="a pidfd of the process whose death ends this"
    )
    parser.add_argument(
        "--control-fd", type=int, help="read the supervisor's control lines here"
    )
    parser.add_argument("--ready-fd", type=int, help="write the READY line here")
    parser.add_argument(
        "--output-fd", type=int, help="send stdout and stderr here, line by line"
    )
    parser.add_argument(
        "--discovery",
        metavar="URL",
        help="find workers in the registry at redis://HOST:PORT instead of the "
        "namespace's shared memory",
    )
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="the CA that signed the certificates of workers serving TLS "
        "(default: the system's roots)",
    )
    parser.add_argument(
        "--no-worker-timeout-s",
        type=float,
        default=NO_WORKER_TIMEOUT_S,
        help="fail a task that finds no matching ready worker this long",
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        default=MAX_QUEUED,
        help="tasks that may wait for a worker; past it, clients are held back "
        f"(default {MAX_QUEUED})",
    )
    args = parser.parse_args(argv)
    serving.redirect_output(args.output_fd)
    logging.basicConfig(level=logging.WARNING, format="dispatcher: %(message)s")
    # watchdog warns when a watched directory's last events race the
    # observer's stop, as they do when the pool's files are removed at exit.
    logging.getLogger("watchdog").setLevel(logging.ERROR)
    try:
        uvloop.run(
            serve(
                args.namespace,
                host=args.host,
                port=args.port,
                advertise=args.advertise,
                tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
                parent_fd=args.parent_fd,
                control_fd=args.control_fd,
                ready_fd=args.ready_fd,
                no_worker_timeout_s=args.no_worker_timeout_s,
                max_queued=args.max_queued,
                discovery_url=args.discovery,
                tls_ca=_read(args.tls_ca) if args.tls_ca else None,
            )
        )
    except KeyboardInterrupt:
        pass
    except serving.CannotListen as exc:
        print(f"dispatcher: error: {exc}", file=sys.stderr)
        return 1
    except Exception:  # a background task died: say why, and be restarted
        log.exception("stopped by an unexpected error")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
