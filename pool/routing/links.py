"""The dispatcher's stream to one worker: :class:`WorkerLink`.

A link owns a gRPC channel and one ``Run`` call to its worker, and, while
:meth:`WorkerLink.run` runs, a task group of two: a sender that writes the
tasks it is given (and cancels), many per message, through the sending
half of the stream (:class:`~workers.protocol.stream.Outgoing`), and the
caller of ``run`` reading the worker's batches back. It reports what it
hears through :class:`~pool.routing.jobs.LinkEvents` (connected, tasks
started, results) and holds nothing of the router, which decides: ``run``
returns when the stream ends, however it ends, and the router then
requeues what the worker did not answer. Created and run by
:class:`pool.routing.placement.Router`.

How much a worker is sent ahead of its slots (:attr:`WorkerLink.free`):
what keeps each slot busy through one round trip, at the pace its worker
reports with its results: one a slot for tasks as long as a round trip or
longer (``ProcessPoolExecutor`` holds ``max_workers + 1`` in its call
queue), up to :data:`MAX_AHEAD_PER_SLOT` for tasks far shorter (which
the router packs onto few workers: :mod:`pool.routing.choosing`). The round
trip is measured here, from a task's write to the report of its start: a
slowly decaying minimum, since a task that waited for a slot reports late.

A worker that other dispatchers also link (a pool with a dispatcher on each
of several hosts) tells each one how many tasks it holds for the others
when that changes (:attr:`WorkerLink.others`): they count in the worker's
:attr:`~WorkerLink.load`, as the router weighs it everywhere, so that a
slot another dispatcher filled is not promised again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable
from typing import Final

import grpc
from grpc import aio

from discovery import WorkerInfo
from pool.routing.jobs import Connect, Job, Link, LinkEvents
from workers.common import channels
from workers.protocol import auth, transfer
from workers.protocol.stream import Cancels, Outgoing, Withdraw
from workers.protocol.worker_pb2 import (
    Chunk,
    FetchRequest,
    Result,
    ResultBatch,
    Task,
    TaskBatch,
)
from workers.protocol.worker_pb2_grpc import TransfersStub, WorkerStub

log = logging.getLogger("pool.dispatcher")

# (Not more: with 128, 256 no-ops in flight from one client ran 9 % faster,
# packed on fewer workers, but 16 client processes of 16 each ran 30 %
# slower, each client's window going out and back as one burst.)
MAX_AHEAD_PER_SLOT: Final = 32
FIRST_RTT_S: Final = 0.0005  # the round trip, until one is measured
RTT_DECAY: Final = 0.01  # how fast the measured minimum forgets


class WorkerLink(Link):
    """The dispatcher's connection to one worker, and the tasks it has there."""

    def __init__(
        self,
        info: WorkerInfo,
        events: LinkEvents,
        token: str,
        tls: grpc.ChannelCredentials | None = None,
    ) -> None:
        super().__init__(info, FIRST_RTT_S)
        self._ended = False
        self._events = events
        self._token = token
        self._tls = tls  # for a worker that serves TLS ("tls" in its extra)
        self._outgoing: Outgoing[Job] = Outgoing(_task_of)
        self._call: aio.StreamStreamCall[TaskBatch, ResultBatch] | None = None
        self._channel: aio.Channel | None = None  # while run() runs

    @classmethod
    def connector(
        cls, token: str, tls: grpc.ChannelCredentials | None = None
    ) -> Connect:
        """What the router calls to link a newly discovered worker (over TLS,
        with ``tls``, to the workers that serve it)."""

        def connect(info: WorkerInfo, events: LinkEvents) -> WorkerLink:
            return cls(info, events, token, tls)

        return connect

    @property
    def free(self) -> int:
        ahead = 1
        if self.pace_s > 0:
            ahead = min(MAX_AHEAD_PER_SLOT, math.ceil(self.rtt_s / self.pace_s))
        return self.slots * (1 + ahead) - self.load

    @property
    def ready(self) -> bool:
        """Takes tasks: connected, still streaming, registered and ready."""
        return (
            self.connected
            and not self._ended
            and not self.dropped
            and self.info.status == "ready"
        )

    def send(self, job: Job) -> None:
        if not self.in_flight:  # idle until now: its starts are not late
            self.progressed_at = time.monotonic()
        task = job.task
        task.attempt = job.attempts + 1
        self.in_flight.add(job)
        self._outgoing.add(job, job.code)
        if transfer.transfer_of(task) is not None:
            # (Its client holds its arguments: they are uploaded to here.)
            job.owner.on_wanted(job, str(self.info.uid))

    def take_back(self, job: Job) -> bool:
        if not self._outgoing.withdraw(job.task.id):
            return False
        self.in_flight.remove(job.task.id)
        return True

    def cancel(self, task_id: int, kind: Withdraw = "cancel") -> None:
        self._outgoing.cancel(task_id, kind)

    async def run(self) -> None:
        """Stream tasks to the worker and results back until the stream ends."""
        tls = None
        if self.info.extra.get(channels.TLS_EXTRA) == "1":
            # (No CA given: the system's roots.)
            tls = self._tls or grpc.ssl_channel_credentials()
        self._channel = channel = channels.channel(self.info.address, tls)
        try:
            stub = WorkerStub(channel)  # type: ignore[no-untyped-call]
            self._call = stub.Run(metadata=auth.call_metadata(self._token))
            async with asyncio.TaskGroup() as group:
                sending = group.create_task(self._send(self._call))
                try:
                    await self._receive(self._call)
                finally:
                    sending.cancel()
        finally:
            self._ended = True
            self._channel = None
            await channel.close()

    def fetch(self, request: FetchRequest) -> AsyncIterator[Chunk]:
        """A value the worker holds, a chunk at a time (over the stream's
        channel: TLS where the stream is).

        :raises LookupError: if the stream to the worker has ended.
        """
        if self._channel is None:
            raise LookupError(f"{self.describe()} is not linked")
        stub = TransfersStub(self._channel)  # type: ignore[no-untyped-call]
        call: AsyncIterator[Chunk] = stub.Fetch(
            request, metadata=auth.call_metadata(self._token)
        )
        return call

    async def upload(self, chunks: AsyncIterator[Chunk]) -> None:
        """A task's arguments, to the worker, as they come.

        :raises LookupError: if the stream to the worker has ended.
        :raises grpc.aio.AioRpcError: if the worker does not take them.
        """
        if self._channel is None:
            raise LookupError(f"{self.describe()} is not linked")
        stub = TransfersStub(self._channel)  # type: ignore[no-untyped-call]
        await stub.Upload(chunks, metadata=auth.call_metadata(self._token))

    def close(self) -> None:
        """End the stream; :meth:`run` returns soon after. Never raises."""
        self._ended = True
        if self._call is not None:
            self._call.cancel()

    async def _send(self, call: aio.StreamStreamCall[TaskBatch, ResultBatch]) -> None:
        try:
            await call.wait_for_connection()
        except aio.AioRpcError:
            return  # _receive reports it
        self.connected = True
        self._events.on_connected(self)

        async def write(jobs: list[Job], cancels: Cancels) -> bool:
            now = time.monotonic()
            for job in jobs:
                job.sent_at = now
            batch = TaskBatch(tasks=[j.task for j in jobs], **cancels._asdict())
            try:
                await call.write(batch)
            except (aio.AioRpcError, aio.UsageError, asyncio.InvalidStateError):
                return False  # _receive sees the stream end
            return True

        await self._outgoing.write_all(write)

    async def _receive(
        self, call: aio.StreamStreamCall[TaskBatch, ResultBatch]
    ) -> None:
        events = self._events
        try:
            async for batch in call:
                if batch.started:  # (its slots move on: a withdrawal is no sign)
                    self.progressed_at = time.monotonic()
                    self._time_round_trip(batch.started[0])
                    events.on_started(self, batch.started)
                if batch.HasField("others"):
                    self.others = batch.others
                if batch.results:
                    self._name_holder(batch.results)
                    if batch.pace_us:
                        self.pace_s = batch.pace_us * 1e-6
                if batch.results or batch.HasField("others"):
                    events.on_results(self, batch.results)
        except aio.AioRpcError as exc:
            self._report(exc)

    def _name_holder(self, results: Iterable[Result]) -> None:
        """Values the worker holds for the client to fetch: name it, the
        fetch's way back here (:mod:`workers.protocol.transfer`)."""
        for result in results:
            if (held := transfer.transfer_of(result)) is not None:
                held.source = str(self.info.uid)

    def _time_round_trip(self, task_id: int) -> None:
        """One sample (a message's first start) of the round trip."""
        if (job := self.in_flight.get(task_id)) is None or not job.sent_at:
            return
        sample = time.monotonic() - job.sent_at
        if sample < self.rtt_s:
            self.rtt_s = sample
        else:
            self.rtt_s += (sample - self.rtt_s) * RTT_DECAY

    def _report(self, exc: aio.AioRpcError) -> None:
        code = exc.code()
        if code in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.UNAUTHENTICATED,
        ):
            self.refused = f"{code.name}: {exc.details()}"
            log.error("%s refused this dispatcher: %s", self.describe(), exc.details())
        elif code != grpc.StatusCode.CANCELLED:
            self.broke = f"{code.name}: {exc.details()}"
            log.info("%s: stream broke: %s", self.describe(), code.name)


def _task_of(job: Job) -> Task:
    return job.task
