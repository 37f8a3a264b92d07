"""The Dispatcher service that clients call: one :class:`ClientStream` per
``SubmitStream``, and ``ListWorkers``.

A client stream reads batches of submissions and cancels into the
:class:`~pool.dispatcher.placement.Router` and answers with batches of
results and of the ids of tasks a worker took, as they come (its
:class:`~workers.protocol.outbox.Outbox`). It stops reading while it holds
``max_tasks`` unanswered or the router's queue is full, so gRPC flow
control holds the client; it ends once the client closed its side and
every task is answered. Run by :mod:`pool.dispatcher.server`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from grpc import aio

from pool import dispatcher_pb2_grpc
from pool.dispatcher.jobs import Job
from pool.dispatcher.placement import Router
from pool.dispatcher_pb2 import (
    ListWorkersReply,
    ListWorkersRequest,
    Submission,
    SubmissionBatch,
    WorkerState,
)
from workers.protocol import codec, shipping
from workers.protocol.errors import BadTask
from workers.protocol.outbox import Outbox
from workers.protocol.worker_pb2 import Result, ResultBatch

# A client stream with this many tasks in the dispatcher is not read until
# some finish (and none is read while the router's queue is full).
MAX_STREAM_TASKS: Final = 10_000


class ClientStream:
    """One client's SubmitStream: its tasks in the router, and its outbox."""

    def __init__(self, router: Router, max_tasks: int) -> None:
        self._router = router
        self._max_tasks = max_tasks
        self.jobs: dict[int, Job] = {}  # by the client's id
        self.outbox = Outbox()
        self._shipped = shipping.StreamCache()  # functions this stream carried
        self._room = asyncio.Event()
        self._reading = True

    def on_accepted(self, job: Job) -> None:
        if self.jobs.get(job.client_id) is job:
            self.outbox.accept(job.client_id)

    def on_result(self, job: Job, result: Result) -> None:
        if self.jobs.get(job.client_id) is not job:
            return
        del self.jobs[job.client_id]
        result.id = job.client_id
        self.outbox.put(result)
        if len(self.jobs) < self._max_tasks:
            self._room.set()
        if not self.jobs and not self._reading:
            self.outbox.close()

    async def read(self, requests: AsyncIterator[SubmissionBatch]) -> None:
        """Take the client's submissions and cancels until it closes its side."""
        router = self._router
        async for batch in requests:
            for submission in batch.submissions:
                if (job := self._job_of(submission)) is not None:
                    self.jobs[job.client_id] = job
                    router.submit(job)
            router.pump()
            for client_id in batch.cancel:
                if (cancelled := self.jobs.get(client_id)) is not None:
                    router.cancel(cancelled)
            await self._wait_for_room()
        self._reading = False
        if not self.jobs:
            self.outbox.close()

    def _job_of(self, submission: Submission) -> Job | None:
        """The job of a submission, or None if it was answered at once."""
        task = submission.task
        code = b""
        if task.digest:  # first, whatever becomes of it: see workers.protocol.shipping
            try:
                code = self._shipped.incoming(task.digest, task.code)
            except shipping.ShippingError as exc:
                self._refuse(task.id, BadTask(str(exc)))
                return None
            task.ClearField("code")  # the job keeps the one copy
        if task.id in self.jobs:
            self.outbox.put(Result(id=task.id, failure=codec.id_reused(task.id)))
            return None
        return Job(task, frozenset(submission.tags), self, task.id, code)

    def _refuse(self, task_id: int, error: Exception) -> None:
        failure = codec.failure_of(error, remote=False)
        self.outbox.put(Result(id=task_id, failure=failure))

    async def _wait_for_room(self) -> None:
        """Stop reading (so gRPC flow control holds the client) while this
        stream, or the router's queue, is full."""
        while len(self.jobs) >= self._max_tasks or not self._router.room.is_set():
            self._room.clear()
            if len(self.jobs) >= self._max_tasks:
                await self._room.wait()
            else:
                await self._router.room.wait()

    def abandon(self) -> None:
        """The client went away: cancel what it left."""
        self._reading = False
        jobs, self.jobs = list(self.jobs.values()), {}
        for job in jobs:
            self._router.cancel(job)


class DispatcherService(dispatcher_pb2_grpc.DispatcherServicer):
    """What clients call; every task goes through the router."""

    def __init__(self, router: Router, max_stream_tasks: int = MAX_STREAM_TASKS):
        self._router = router
        self._max_stream_tasks = max_stream_tasks
        self._streams: set[ClientStream] = set()
        self._no_streams = asyncio.Event()
        self._no_streams.set()

    def end_streams(self) -> None:
        """End every client stream once it has written what it holds."""
        for stream in self._streams:
            stream.outbox.close()

    async def streams_ended(self) -> None:
        await self._no_streams.wait()

    async def SubmitStream(
        self,
        request_iterator: AsyncIterator[SubmissionBatch],
        context: aio.ServicerContext[SubmissionBatch, ResultBatch],
    ) -> None:
        stream = ClientStream(self._router, self._max_stream_tasks)
        self._streams.add(stream)
        self._no_streams.clear()
        try:
            async with asyncio.TaskGroup() as group:
                reading = group.create_task(stream.read(request_iterator))
                async for batch in stream.outbox.batches():
                    await context.write(batch)
                reading.cancel()  # the dispatcher is stopping: read no more
        finally:
            self._streams.discard(stream)
            if not self._streams:
                self._no_streams.set()
            stream.abandon()

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
        return ListWorkersReply(workers=states, queued=self._router.queued)
