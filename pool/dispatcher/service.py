"""The Dispatcher service that clients call: one :class:`ClientStream` per
``SubmitStream``, and ``ListWorkers``.

A client stream reads batches of submissions and cancels into the
:class:`~pool.routing.placement.Router` and answers with batches of
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
from pool.dispatcher_pb2 import (
    ListWorkersReply,
    ListWorkersRequest,
    SubmissionBatch,
    WorkerState,
)
from pool.routing.jobs import Job
from pool.routing.placement import Router
from workers.protocol.stream import (
    MAX_BATCH_TASKS,
    MAX_UNANSWERED,
    WITHDRAWS,
    Incoming,
)
from workers.protocol.worker_pb2 import Result, ResultBatch, Want

# A client stream with this many tasks in the dispatcher is not read until
# some finish (and none is read while the router's queue is full): more
# than a client writes unanswered, by a message, so that a client that
# keeps to that is always read (its cancels come through); one that does
# not meets gRPC's flow control.
MAX_STREAM_TASKS: Final = MAX_UNANSWERED + MAX_BATCH_TASKS


Requests = AsyncIterator[SubmissionBatch]
Context = aio.ServicerContext[SubmissionBatch, ResultBatch]


class ClientStream(Incoming[Job]):
    """One client's SubmitStream: the receiving half of its task stream
    (:class:`~workers.protocol.stream.Incoming`), whose tasks are jobs in
    the router, held by the client's own ids."""

    def __init__(self, router: Router, max_tasks: int) -> None:
        super().__init__(max_tasks)
        self._router = router

    def on_started(self, job: Job) -> None:
        if self.entries.get(job.client_id) is job:
            self.outbox.start(job.client_id)

    def on_wanted(self, job: Job, source: str) -> None:
        if self.entries.get(job.client_id) is job:
            self.outbox.want(Want(id=job.client_id, source=source))

    def on_result(self, job: Job, result: Result) -> None:
        if self.entries.get(job.client_id) is not job:
            return
        result.id = job.client_id
        self.answer(job.client_id, result)

    async def read(self, requests: AsyncIterator[SubmissionBatch]) -> None:
        """Take the client's submissions and cancels until it closes its side."""
        router = self._router
        async for batch in requests:
            for submission in batch.submissions:
                task = submission.task
                if (code := self.admit(task)) is not None:
                    job = Job(task, frozenset(submission.tags), self, task.id, code)
                    self.entries[task.id] = job
                    router.submit(job)
            router.pump()
            for kind in WITHDRAWS:
                for client_id in getattr(batch, kind):
                    if (asked := self.entries.get(client_id)) is not None:
                        router.cancel(asked, kind)
            # (Not read while full, nor while the router's queue is: gRPC
            # flow control then holds the client.)
            await self.wait_for_room(router.queue.room)
        self.end_of_input()

    def abandon(self) -> None:
        """The client went away: abandon what it left (withdrawn, or a
        running coroutine cancelled; a plain call runs out)."""
        self.reading = False
        jobs, self.entries = list(self.entries.values()), {}
        for job in jobs:
            self._router.cancel(job, "abandon")


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

    async def SubmitStream(self, request_iterator: Requests, context: Context) -> None:
        stream = ClientStream(self._router, self._max_stream_tasks)
        self._streams.add(stream)
        self._no_streams.clear()
        try:
            await stream.serve(stream.read(request_iterator), context.write)
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
                others=link.others,
            )
            for link in self._router.links.values()
        ]
        return ListWorkersReply(
            workers=states,
            queued=self._router.queued,
            clients=len(self._streams),
            queued_by_priority=self._router.queue.by_priority(),
        )
