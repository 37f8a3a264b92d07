"""The dispatcher process: ``python -m pool.dispatcher --namespace NS``.

A grpc.aio server on uvloop (a unix socket in the namespace's private
directory, or ``HOST:0``) serving the Dispatcher service to clients. It
follows the namespace's discovery events into a :class:`~pool.routing.Router`
and answers each client stream with batches of results as they finish. It
writes one ``READY {json}`` line (to ``--ready-fd``) once it serves, and
exits on SIGTERM, SIGINT or the death of ``--parent``. Started and owned by
the supervisor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Sequence

import uvloop
from grpc import aio

from discovery import DiscoveryEvent, Subscriber, paths
from pool import dispatcher_pb2_grpc
from pool.dispatcher_pb2 import (
    ListWorkersReply,
    ListWorkersRequest,
    Submission,
    SubmissionBatch,
    WatchEvent,
    WatchRequest,
    WorkerExit,
    WorkerExitReply,
    WorkerState,
)
from pool.routing import NO_WORKER_TIMEOUT_S, Deliver, Job, Router
from workers import auth, lifecycle, tasks
from workers.outbox import Outbox
from workers.worker_pb2 import Result, ResultBatch

log = logging.getLogger("pool.dispatcher")

SOCKET_NAME = "dispatcher.sock"


class DispatcherService(dispatcher_pb2_grpc.DispatcherServicer):
    """What clients call; every task goes through the router."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._streams: set[Outbox[Result]] = set()

    def end_streams(self) -> None:
        """End every client stream cleanly before the server stops."""
        for outbox in self._streams:
            outbox.close()

    async def Submit(
        self, request: Submission, context: aio.ServicerContext[Submission, Result]
    ) -> Result:
        client_id = request.task.id
        done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()

        def deliver(result: Result) -> None:
            if not done.done():
                done.set_result(result)

        job = self._router.submit(request.task, request.tags, deliver)
        self._router.pump()
        try:
            result = await done
        except asyncio.CancelledError:
            self._router.cancel(job)
            raise
        result.id = client_id
        return result

    async def SubmitStream(
        self,
        request_iterator: AsyncIterator[SubmissionBatch],
        context: aio.ServicerContext[SubmissionBatch, ResultBatch],
    ) -> None:
        outbox: Outbox[Result] = Outbox()
        jobs: dict[int, Job] = {}
        reader = asyncio.create_task(self._read(request_iterator, jobs, outbox))
        self._streams.add(outbox)
        try:
            async for results in outbox.batches():
                await context.write(ResultBatch(results=results))
        finally:
            self._streams.discard(outbox)
            reader.cancel()
            for job in list(jobs.values()):  # the client went away
                self._router.cancel(job)

    async def _read(
        self,
        requests: AsyncIterator[SubmissionBatch],
        jobs: dict[int, Job],
        outbox: Outbox[Result],
    ) -> None:
        finished = asyncio.Event()
        closed = False

        def deliverer(client_id: int) -> Deliver:
            def deliver(result: Result) -> None:
                jobs.pop(client_id, None)
                result.id = client_id
                outbox.put(result)
                if closed and not jobs:
                    finished.set()

            return deliver

        async for batch in requests:
            for submission in batch.submissions:
                client_id = submission.task.id
                if client_id in jobs:
                    outbox.put(Result(id=client_id, failure=tasks.id_reused(client_id)))
                    continue
                deliver = deliverer(client_id)
                jobs[client_id] = self._router.submit(
                    submission.task, submission.tags, deliver
                )
            self._router.pump()
            for client_id in batch.cancel:
                if (job := jobs.get(client_id)) is not None:
                    self._router.cancel(job)
        closed = True
        if jobs:
            await finished.wait()
        outbox.close()

    async def ListWorkers(
        self,
        request: ListWorkersRequest,
        context: aio.ServicerContext[ListWorkersRequest, ListWorkersReply],
    ) -> ListWorkersReply:
        states = [
            WorkerState(
                info=link.info.to_protobuf(),
                in_flight=len(link.in_flight),
                done=link.done,
            )
            for link in self._router.links.values()
        ]
        return ListWorkersReply(workers=states, queued=len(self._router.queue))

    async def Watch(
        self,
        request: WatchRequest,
        context: aio.ServicerContext[WatchRequest, WatchEvent],
    ) -> AsyncIterator[WatchEvent]:
        events: asyncio.Queue[DiscoveryEvent] = asyncio.Queue()
        for link in self._router.links.values():
            events.put_nowait(DiscoveryEvent("worker-added", link.info))
        self._router.watchers.add(events)
        try:
            while True:
                event = await events.get()
                yield WatchEvent(type=event.type, info=event.worker_info.to_protobuf())
        finally:
            self._router.watchers.discard(events)

    async def ReportExit(
        self,
        request: WorkerExit,
        context: aio.ServicerContext[WorkerExit, WorkerExitReply],
    ) -> WorkerExitReply:
        self._router.record_exit(request.pid, request.status)
        return WorkerExitReply()


async def serve(
    namespace: str,
    *,
    host: str | None = None,
    parent: int | None = None,
    ready_fd: int | None = None,
    no_worker_timeout_s: float = NO_WORKER_TIMEOUT_S,
) -> None:
    """Serve the namespace's clients until told to stop."""
    stopper = lifecycle.Stopper(parent)
    token = auth.read_token(namespace)
    router = Router(namespace, token, no_worker_timeout_s=no_worker_timeout_s)
    server = aio.server(
        interceptors=[auth.TokenInterceptor(token)], options=lifecycle.GRPC_OPTIONS
    )
    service = DispatcherService(router)
    dispatcher_pb2_grpc.add_DispatcherServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    socket = paths.namespace_dir(namespace) / SOCKET_NAME
    address, socket_path = lifecycle.bind(server, host, socket)
    await server.start()
    background = [
        asyncio.create_task(_follow(namespace, router)),
        asyncio.create_task(_expire(router)),
    ]
    try:
        lifecycle.announce_ready(ready_fd, address=address)
        await stopper.wait()
    finally:
        stopper.close()
        for task in background:
            task.cancel()
        service.end_streams()
        await server.stop(1.0)
        await router.aclose()
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)


async def _follow(namespace: str, router: Router) -> None:
    async for event in Subscriber(namespace):
        router.on_event(event)


async def _expire(router: Router) -> None:
    while True:
        await asyncio.sleep(1.0)  # a ticker, not a wait for an event
        router.expire()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pool.dispatcher",
        description="Run a pool's dispatcher (started by `python -m pool up`).",
    )
    parser.add_argument("--namespace", default="default")
    parser.add_argument(
        "--host",
        nargs="?",
        const=lifecycle.LOOPBACK,
        help=f"listen on TCP HOST:<free port> (default {lifecycle.LOOPBACK})",
    )
    parser.add_argument("--parent", type=int, help="exit when this pid dies")
    parser.add_argument("--ready-fd", type=int, help="write the READY line here")
    parser.add_argument(
        "--no-worker-timeout-s",
        type=float,
        default=NO_WORKER_TIMEOUT_S,
        help="fail a task that finds no matching ready worker this long",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="dispatcher: %(message)s")
    # watchdog warns when a watched directory's last events race the
    # observer's stop, as they do when the pool's files are removed at exit.
    logging.getLogger("watchdog").setLevel(logging.ERROR)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(
            serve(
                args.namespace,
                host=args.host,
                parent=args.parent,
                ready_fd=args.ready_fd,
                no_worker_timeout_s=args.no_worker_timeout_s,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
