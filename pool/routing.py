"""Routing tasks to the workers discovery finds.

:class:`Router` owns the queue of tasks waiting for a worker and one
:class:`WorkerLink` per discovered worker: a channel and one ``Run`` stream
carrying batches of tasks out and results back. It places each task on the
least-loaded ready worker whose tags include the task's, never past the
worker's ``capacity``. When a worker is lost (dropped, or its stream
breaks), its unfinished tasks go back to the front of the queue, at most
``max_attempts`` times each, after which they fail with
:class:`~pool.errors.WorkerLost`. A task with no matching ready worker
fails with :class:`~pool.errors.NoWorkerAvailable` after
``no_worker_timeout_s``. Caller: :mod:`pool.dispatcher`, on its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

import grpc
from grpc import aio

from discovery import DiscoveryEvent, WorkerInfo
from discovery.liveness import is_alive
from pool.errors import NoWorkerAvailable, WorkerLost
from workers import auth, tasks
from workers.lifecycle import GRPC_OPTIONS
from workers.worker_pb2 import Result, Task, TaskBatch
from workers.worker_pb2_grpc import WorkerStub

log = logging.getLogger(__name__)

NO_WORKER_TIMEOUT_S: Final = 30.0
MAX_ATTEMPTS: Final = 3
RECONNECT_DELAY_S: Final = 0.5
EXIT_REPORT_WAIT_S: Final = 1.0
EXITS_KEPT: Final = 1024

Deliver = Callable[[Result], None]


@dataclass(eq=False)
class Job:
    """A task in the dispatcher's hands, from submission to its result."""

    task: Task  # its id is the dispatcher's own
    tags: frozenset[str]
    deliver: Deliver
    attempts: int = 0
    lost_on: list[WorkerInfo] = field(default_factory=list)
    unplaceable_since: float | None = None
    link: WorkerLink | None = None


class WorkerLink:
    """The dispatcher's connection to one worker, and the tasks it has there."""

    def __init__(self, info: WorkerInfo, token: str, router: Router) -> None:
        self.info = info
        self.in_flight: dict[int, Job] = {}
        self.done = 0
        self.connected = False  # the stream reached the worker
        self.broken = False
        self._router = router
        self._outbox: list[Task] = []
        self._cancels: list[int] = []
        self._wake = asyncio.Event()
        self._channel = aio.insecure_channel(info.address, options=GRPC_OPTIONS)
        stub = WorkerStub(self._channel)  # type: ignore[no-untyped-call]
        self._call = stub.Run(metadata=auth.call_metadata(token))
        self._io = [
            asyncio.create_task(self._send()),
            asyncio.create_task(self._receive()),
        ]

    @property
    def free(self) -> int:
        """Tasks it may still take."""
        return self.info.capacity - len(self.in_flight)

    @property
    def ready(self) -> bool:
        """Takes tasks: connected, not broken, and not draining."""
        return self.connected and not self.broken and self.info.status == "ready"

    def describe(self) -> str:
        return f"worker pid {self.info.pid} ({str(self.info.uid)[:8]})"

    def send(self, job: Job) -> None:
        job.link = self
        self.in_flight[job.task.id] = job
        self._outbox.append(job.task)
        self._wake.set()

    def cancel(self, task_id: int) -> None:
        self._cancels.append(task_id)
        self._wake.set()

    async def _send(self) -> None:
        try:
            await self._call.wait_for_connection()
        except aio.AioRpcError:
            return  # _receive reports it
        self.connected = True
        self._router.pump()
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = TaskBatch(tasks=self._outbox, cancel=self._cancels)
            self._outbox, self._cancels = [], []
            try:
                await self._call.write(batch)
            except (aio.AioRpcError, aio.UsageError, asyncio.InvalidStateError):
                return  # _receive sees the stream end

    async def _receive(self) -> None:
        try:
            async for batch in self._call:
                for result in batch.results:
                    self._router.on_result(self, result)
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.info("%s: stream broke: %s", self.describe(), exc.code().name)
        finally:
            self.broken = True
            self._router.on_lost(self)

    async def aclose(self) -> None:
        """Stop the stream and close the channel. Never raises."""
        self.broken = True
        self._call.cancel()
        for io in self._io:
            io.cancel()
        for io in self._io:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await io
        await self._channel.close()


class Router:
    """The queue of waiting tasks and the links to workers; see the module doc."""

    def __init__(
        self,
        namespace: str,
        token: str,
        *,
        no_worker_timeout_s: float = NO_WORKER_TIMEOUT_S,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self._namespace = namespace
        self._token = token
        self._no_worker_timeout_s = no_worker_timeout_s
        self._max_attempts = max_attempts
        self._ids = itertools.count(1)
        self.links: dict[UUID, WorkerLink] = {}
        self.queue: deque[Job] = deque()
        self.watchers: set[asyncio.Queue[DiscoveryEvent]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._exits: dict[int, str] = {}  # pid -> how it ended, newest last
        self._exit_waiters: dict[int, asyncio.Event] = {}

    # -- discovery ---------------------------------------------------------

    def on_event(self, event: DiscoveryEvent) -> None:
        info = event.worker_info
        match event.type:
            case "worker-added":
                self.links[info.uid] = WorkerLink(info, self._token, self)
            case "worker-updated":
                if (link := self.links.get(info.uid)) is not None:
                    link.info = info
            case "worker-dropped":
                if (link := self.links.pop(info.uid, None)) is not None:
                    self._requeue(link)
                    self._close_later(link)
        for watcher in self.watchers:
            watcher.put_nowait(event)
        self.pump()

    def on_lost(self, link: WorkerLink) -> None:
        """A link's stream ended: its tasks go elsewhere; reconnect if the
        worker is still registered and alive (its drop is coming otherwise)."""
        self._requeue(link)
        alive = is_alive(self._namespace, link.info.uid)
        if alive and self.links.get(link.info.uid) is link:
            asyncio.get_running_loop().call_later(
                RECONNECT_DELAY_S, self._reconnect, link
            )
        self.pump()

    def _reconnect(self, old: WorkerLink) -> None:
        if self.links.get(old.info.uid) is old:
            self.links[old.info.uid] = WorkerLink(old.info, self._token, self)
            self._close_later(old)
            self.pump()

    def _close_later(self, link: WorkerLink) -> None:
        closing = asyncio.create_task(link.aclose())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _requeue(self, link: WorkerLink) -> None:
        jobs, link.in_flight = list(link.in_flight.values()), {}
        for job in reversed(jobs):  # keep their order at the queue's front
            job.link = None
            job.attempts += 1
            job.lost_on.append(link.info)
            if job.attempts >= self._max_attempts:
                failing = asyncio.create_task(self._fail_lost(job))
                self._closing.add(failing)
                failing.add_done_callback(self._closing.discard)
            else:
                self.queue.appendleft(job)

    async def _fail_lost(self, job: Job) -> None:
        """Fail a task that lost its worker too often, saying how each died
        (waiting a moment for the supervisor's report of the last death)."""
        last = job.lost_on[-1].pid
        if last not in self._exits:
            waiter = self._exit_waiters.setdefault(last, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EXIT_REPORT_WAIT_S):
                    await waiter.wait()
            self._exit_waiters.pop(last, None)
        workers = tuple(
            f"worker pid {info.pid} ({str(info.uid)[:8]}): "
            f"{self._exits.get(info.pid, 'ended, how unknown')}"
            for info in job.lost_on
        )
        lost = WorkerLost(job.attempts, workers)
        job.deliver(Result(id=job.task.id, failure=tasks.failure_of(lost)))

    def record_exit(self, pid: int, status: str) -> None:
        """The supervisor's word on how worker ``pid`` ended."""
        self._exits[pid] = status
        while len(self._exits) > EXITS_KEPT:
            self._exits.pop(next(iter(self._exits)))
        if (waiter := self._exit_waiters.get(pid)) is not None:
            waiter.set()

    # -- tasks ---------------------------------------------------------------

    def submit(self, task: Task, tags: Iterable[str], deliver: Deliver) -> Job:
        """Queue a task (its id is replaced by the dispatcher's own). Call
        :meth:`pump` once the caller's batch is queued."""
        task.id = next(self._ids)
        job = Job(task, frozenset(tags), deliver)
        self.queue.append(job)
        return job

    def cancel(self, job: Job) -> None:
        """Cancel a task: at once if queued, through its worker if running."""
        if job.link is not None:
            job.link.cancel(job.task.id)
            return
        with contextlib.suppress(ValueError):
            self.queue.remove(job)
            job.deliver(Result(id=job.task.id, failure=tasks.cancelled()))

    def on_result(self, link: WorkerLink, result: Result) -> None:
        job = link.in_flight.pop(result.id, None)
        if job is None:
            return  # already requeued elsewhere
        job.link = None
        failed = result.HasField("failure")
        if failed and tasks.status_of(result.failure) == grpc.StatusCode.UNAVAILABLE:
            self.queue.appendleft(job)  # the worker is draining
        else:
            link.done += 1
            job.deliver(result)
        self.pump()

    def pump(self) -> None:
        """Place every queued task that a ready worker can take now."""
        if not self.queue:
            return
        ready = [link for link in self.links.values() if link.ready]
        free = sum(max(link.free, 0) for link in ready)
        waiting: deque[Job] = deque()
        while self.queue and free > 0:
            job = self.queue.popleft()
            open_ = [
                link for link in ready if link.free > 0 and job.tags <= link.info.tags
            ]
            if not open_:
                waiting.append(job)
                continue
            min(open_, key=_load).send(job)
            free -= 1
        self.queue.extendleft(reversed(waiting))  # skipped jobs keep their place

    def expire(self) -> None:
        """Fail the tasks that have had no matching ready worker for too long.

        Called about once a second; a task fails between the limit and a
        second past it.
        """
        now, limit = time.monotonic(), self._no_worker_timeout_s
        ready = [link.info.tags for link in self.links.values() if link.ready]
        keep: deque[Job] = deque()
        for job in self.queue:
            if any(job.tags <= tags for tags in ready):
                job.unplaceable_since = None
            elif job.unplaceable_since is None:
                job.unplaceable_since = now
            elif now - job.unplaceable_since >= limit:
                error = NoWorkerAvailable(tuple(sorted(job.tags)), limit)
                job.deliver(Result(id=job.task.id, failure=tasks.failure_of(error)))
                continue
            keep.append(job)
        self.queue = keep

    async def aclose(self) -> None:
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.aclose() for link in links), *self._closing)


def _load(link: WorkerLink) -> float:
    return len(link.in_flight) / link.info.capacity
