"""One worker process: ``python -m workers --namespace NS``.

Starts a grpc.aio server on uvloop (a unix socket in the namespace's
private directory, or ``HOST:0`` with ``--host``), publishes itself as
``worker-added``, writes one ``READY {json}`` line (to ``--ready-fd``) for whoever
started it, and serves until SIGTERM, SIGINT or the death of the process
``--parent-fd`` names. Its ``capacity`` is its slot threads not held by a
call nobody waits for (see :mod:`workers.service`): what it runs at once.
The dispatcher sends it tasks ahead of that only to hide a round trip. With
no thread free the status is ``"stuck"``.

Then it drains: ``worker-updated`` with ``status="draining"``, refuses new
tasks, finishes what it has within ``--grace-s``, publishes
``worker-dropped`` and exits 0. A worker that *ends* to stop a task (a
time limit, a stop: :meth:`~workers.service.WorkerService.end`) does the
same without waiting for anything, and exits with
:data:`~workers.service.ENDED_EXIT` at once, whatever its threads run.

A change of status or capacity is published at once; counters (tasks
running, held unstarted, stuck, done, failed, and how long the last one
ran) travel in ``WorkerInfo.extra``, at most once a second. Its
background work (the reporter, each stream's tasks) runs in task groups:
an error in any ends the process with the error logged and exit status 1,
and its supervisor starts another.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Final

import uvloop
from grpc import aio
from grpc_health.v1 import health, health_pb2_grpc

import discovery
from discovery import DiscoveryError, Status, WorkerInfo, backends, paths
from workers import imports, initializer
from workers.alarm import Alarm
from workers.common import channels, serving
from workers.common.spec import parse
from workers.limits import (
    Limits,
    MemoryWatch,
    parse_size,
    rss_bytes,
    warn_if_under_baseline,
)
from workers.protocol import auth, transfer, worker_pb2_grpc
from workers.protocol.owners import DataOwner
from workers.service import ENDED_EXIT, WorkerService
from workers.settings import WorkerSettings

log = logging.getLogger("workers")

REPORT_INTERVAL_S: Final = 1.0


DESCRIPTION: Final = (
    "Run one shm-pool worker: a gRPC server that runs tasks and publishes itself "
    "into the namespace's registry. Usually started by `python -m pool up`; the "
    "namespace must exist (the pool creates it)."
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workers``: run a worker as its command line says."""
    return run(
        parse(WorkerSettings, argv, prog="python -m workers", description=DESCRIPTION)
    )


def run(config: WorkerSettings) -> int:
    """Run a worker with these settings (the zygote's entry); its exit status."""
    serving.redirect_output(config.output_fd)
    sys.path[:0] = [p for p in config.paths if p not in sys.path]
    imports.reload_changed(config.reload)
    logging.basicConfig(level=logging.WARNING, format="worker %(process)d: %(message)s")
    init = config.initializer, config.initargs, config.initializer_pickle
    if (failure := initializer.run(*init)) is not None:
        with contextlib.suppress(serving.ParentGone):  # (nobody to tell)
            initializer.report(config.ready_fd, failure)
        return 1
    try:
        ended = uvloop.run(serve(config))
    except (
        DiscoveryError,
        auth.MissingToken,
        auth.BadToken,
        serving.CannotListen,
        serving.ParentGone,
    ) as exc:
        print(f"worker: error: {exc}", file=sys.stderr)
        return 1
    except Exception:  # a background task died: say why, and let it be replaced
        log.exception("stopped by an unexpected error")
        return 1
    if ended is not None:  # (a thread runs a call nothing stops: no join)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ENDED_EXIT)
    return 0


async def serve(config: WorkerSettings) -> str | None:
    """Serve until told to stop, then drain; see the module docstring. Why
    it ended to stop a task, if it did."""
    stopper = serving.Stopper(config.parent_fd)
    try:
        return await _serve(config, stopper)
    finally:
        stopper.close()


def _server(
    token: str, service: WorkerService
) -> tuple[aio.Server, health.aio.HealthServicer]:
    """The gRPC server, with its services: tasks, held values, health."""
    server = serving.server(token)
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    worker_pb2_grpc.add_TransfersServicer_to_server(transfer.HeldService(), server)  # type: ignore[no-untyped-call]
    health_service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    return server, health_service


async def _serve(config: WorkerSettings, stopper: serving.Stopper) -> str | None:
    token = auth.token_for(config.namespace, config.token_file)
    uid = uuid.uuid4()
    changed = asyncio.Event()
    max_memory = parse_size(config.max_memory or 0)
    warn_if_under_baseline(max_memory)
    writer = DataOwner(config.namespace, limit_bytes=config.shm_limit_bytes)
    service = WorkerService(
        config.concurrency,
        changed.set,
        max_args_bytes=config.max_args_bytes,
        limits=Limits(config.max_tasks_per_child, max_memory),
        writer=writer,
        alarm=Alarm(),
    )
    server, health_service = _server(token, service)
    address, socket_path = serving.bind(
        server,
        config.host,
        lambda: paths.namespace_dir(config.namespace) / f"w-{uid.hex[:12]}.sock",
        port=config.port,
        advertise=config.advertise,
        credentials=serving.server_credentials(*config.tls) if config.tls else None,
    )
    await server.start()
    try:
        reporter = _Reporter(service, _info(config, uid, address, service), changed)
        with contextlib.ExitStack() as watching:
            if max_memory:
                watching.enter_context(
                    MemoryWatch(max_memory, lambda: service.active > 0)
                )
            await _registered(config, reporter, stopper, health_service)
    finally:
        await server.stop(1.0)
        await service.aclose()
        writer.close()
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)
    return service.ending


def _info(
    config: WorkerSettings, uid: uuid.UUID, address: str, service: WorkerService
) -> WorkerInfo:
    """What the worker publishes of itself first."""
    return WorkerInfo(
        uid,
        address,
        os.getpid(),
        discovery.__version__,
        tags=frozenset(config.tags),
        extra={
            **_counters(service),
            **({channels.TLS_EXTRA: "1"} if config.tls else {}),
        },
        capacity=config.concurrency,
    )


async def _registered(
    config: WorkerSettings,
    reporter: _Reporter,
    stopper: serving.Stopper,
    health_service: health.aio.HealthServicer,
) -> None:
    """Publish the worker, say READY, report until told to stop, then drain
    (published as draining, then dropped)."""
    service = reporter.service
    registry = backends.publisher_for(config.namespace, config.discovery_url)
    async with registry as publisher:
        await publisher.publish("worker-added", reporter.info)
        uid, address = str(reporter.info.uid), reporter.info.address
        serving.announce_ready(config.ready_fd, uid=uid, address=address)
        async with asyncio.TaskGroup() as group:
            reporting = group.create_task(reporter.run(publisher))
            await _until_stopped_or_retiring(stopper, service)
            reporting.cancel()
        service.draining = True
        await health_service.enter_graceful_shutdown()
        await publisher.publish("worker-updated", reporter.current())
        if service.ending is None:  # (else: what runs dies with the process)
            await _drain(service, config.grace_s)
            # (Values held for clients of other machines: fetched through
            # the dispatcher, which finds this worker until it is dropped.)
            await transfer.HELD.wait_fetched(config.grace_s)
        service.end_streams()


async def _until_stopped_or_retiring(
    stopper: serving.Stopper, service: WorkerService
) -> None:
    """Until the worker is told to stop, or retires (:mod:`workers.limits`)."""
    async with asyncio.TaskGroup() as group:
        waits = [
            group.create_task(stopper.wait()),
            group.create_task(service.retiring.wait()),
        ]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()


async def _drain(service: WorkerService, grace_s: float) -> None:
    try:
        async with asyncio.timeout(grace_s):
            await service.wait_idle()
    except TimeoutError:
        log.warning(
            "%d task(s) still running after %g s; leaving", service.unanswered, grace_s
        )


class _Reporter:
    """Publishes what changes about the worker: its status and capacity (its
    free threads) at once, its counters at most once a second."""

    def __init__(
        self, service: WorkerService, info: WorkerInfo, changed: asyncio.Event
    ) -> None:
        self.service, self.info = service, info
        self._changed = changed

    def current(self) -> WorkerInfo:
        service = self.service
        status: Status = "ready"
        if service.draining:
            status = "draining"
        elif service.free_threads == 0:
            status = "stuck"
        return dataclasses.replace(
            self.info,
            status=status,
            capacity=max(1, service.free_threads),
            extra={**self.info.extra, **_counters(service)},
        )

    async def run(self, publisher: backends.AnyPublisher) -> None:
        published = self.info
        stuck_changed = self.service.stuck_changed
        while True:
            await self._changed.wait()
            self._changed.clear()
            stuck_changed.clear()  # (what it changed is in what is published now)
            current = self.current()
            if current != published:
                await publisher.publish("worker-updated", current)
                published = current
            # The rate limit for counters; a change of status or capacity (a
            # thread stuck, or free again) cuts it short. Counter changes do
            # not wake this task meanwhile: they only set `changed`.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPORT_INTERVAL_S):
                    await stuck_changed.wait()


def _counters(service: WorkerService) -> dict[str, str]:
    return {
        "running": str(service.active + service.stuck),
        "held": str(service.unanswered - service.active),
        "stuck": str(service.stuck),
        "done": str(service.done),
        "failed": str(service.failed),
        "last_ms": f"{service.pace.last_s * 1e3:.1f}",
        "rss_mb": f"{rss_bytes() / 1e6:.0f}",
        "cpu_s": f"{time.process_time():.2f}",  # (the dashboard's CPU %)
    }


if __name__ == "__main__":
    sys.exit(main())
