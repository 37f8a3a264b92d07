"""Routing tasks to the workers discovery finds: the dispatcher's logic.

:class:`Router` owns the queue of tasks waiting for a worker
(:mod:`pool.dispatcher.queue`) and one :class:`~pool.dispatcher.jobs.Link`
per discovered worker (the real one is
:class:`~pool.dispatcher.links.WorkerLink`). It places each task on the
least-loaded ready worker whose tags include the task's, never past the
worker's ``capacity``. Caller: :mod:`pool.dispatcher.server`, on its loop;
the unit tests drive it with fake links.

Attempts. A worker tells the router which tasks it has *taken* before it
starts any of them. When a worker is lost (its stream ends, or it is
dropped and its stream ended after a grace), its unfinished tasks go back
to the front of the queue: a task it had taken counts one attempt, one it
had not taken counts none (it never ran there). At ``max_attempts`` the
task fails with :class:`~pool.errors.WorkerLost`, which says how each
worker died. A task lost untaken :data:`MAX_UNTAKEN_LOSSES` times fails
too, so that nothing is retried forever.

Bounds. At most ``max_queued`` tasks wait (:attr:`Router.room`). A task
with no matching ready worker fails with
:class:`~pool.errors.NoWorkerAvailable` after ``no_worker_timeout_s``.

Stopping. :meth:`Router.stop_taking` (the pool drains) fails every queued
task with :class:`~pool.errors.PoolStopping` at once, and every task
submitted later; tasks on workers finish and are delivered.
:meth:`Router.finish` waits a bounded time for them, then fails the rest.

Every background task (the links, the expiry ticker, the grace of a
dropped worker's stream, failures that wait for an exit report) runs in
the task group the router holds while it is entered (``async with
Router(...) as router``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, Self, assert_never
from uuid import UUID

import grpc

from discovery import DiscoveryEvent, WorkerInfo
from pool.dispatcher.exits import Exits
from pool.dispatcher.jobs import Connect, Job, Link
from pool.dispatcher.queue import MAX_QUEUED, TaskQueue
from pool.errors import NoWorkerAvailable, PoolStopping, WorkerLost
from workers.protocol import codec
from workers.protocol.worker_pb2 import Result

NO_WORKER_TIMEOUT_S: Final = 30.0
MAX_ATTEMPTS: Final = 3
MAX_UNTAKEN_LOSSES: Final = 10
RECONNECT_DELAY_S: Final = 0.5
LEAVE_GRACE_S: Final = 5.0  # a dropped worker's stream may finish this long
EXPIRE_EVERY_S: Final = 1.0
_STOPPED: Final = {  # why a task lost its worker as the pool stopped, if taken
    True: "its worker stopped before it finished",
    False: "its worker stopped before it took the task, so it never ran",
}


class Router:
    """The queue of waiting tasks and the links to workers; see the module doc.

    :param connect: makes the link to a newly discovered worker.
    :param is_alive: whether a worker is still registered by a live process
        (its liveness lock); a link that breaks to a live worker reconnects.
    """

    def __init__(
        self,
        namespace: str,
        connect: Connect,
        *,
        is_alive: Callable[[str, UUID], bool],
        no_worker_timeout_s: float = NO_WORKER_TIMEOUT_S,
        max_attempts: int = MAX_ATTEMPTS,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.namespace = namespace
        self._connect = connect
        self._is_alive = is_alive
        self._no_worker_timeout_s = no_worker_timeout_s
        self._max_attempts = max_attempts
        self._ids = itertools.count(1)
        self.links: dict[UUID, Link] = {}  # registered workers
        self._open: set[Link] = set()  # every link whose stream still runs
        self._refusing: set[Link] = set()  # answered UNAVAILABLE since its last news
        self.queue = TaskQueue(max_queued)
        self.stopping = False
        self._stack = contextlib.AsyncExitStack()  # holds the task group
        self._group: asyncio.TaskGroup | None = None
        self._expiring: asyncio.Task[None]
        self._graces: set[asyncio.Task[None]] = set()  # of dropped workers' links
        self._closed = False
        self._settled = asyncio.Event()  # stopping, and no worker has a task
        self._exits = Exits()
        self._started = False  # every worker of the pool has started once

    # -- lifetime ------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Start owning the links and timers (in a task group of the
        entering task, which an error in any of them cancels)."""
        group = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._group = group
        self._expiring = group.create_task(self._expire_every(EXPIRE_EVERY_S))
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        """Close every link and wait for all of it to end."""
        self._closed = True
        self._expiring.cancel()
        for grace in self._graces:
            grace.cancel()
        for link in list(self._open):
            link.close()
        await self._stack.__aexit__(*exc_info)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        assert self._group is not None, "use the router inside `async with`"
        return self._group.create_task(coro)

    # -- discovery -----------------------------------------------------------

    def on_event(self, event: DiscoveryEvent) -> None:
        info = event.worker_info
        match event.type:
            case "worker-added":
                self._open_link(info)
            case "worker-updated":
                if (link := self.links.get(info.uid)) is not None:
                    link.info = info
                    self._refusing.discard(link)  # its news says what it takes
            case "worker-dropped":
                if (link := self.links.pop(info.uid, None)) is not None:
                    link.dropped = True  # takes nothing more; may still answer
                    grace = self._spawn(_close_after(link, LEAVE_GRACE_S))
                    self._graces.add(grace)
                    grace.add_done_callback(self._graces.discard)
            case _:
                assert_never(event.type)
        self.pump()

    def _open_link(self, info: WorkerInfo) -> None:
        link = self._connect(info, self)
        self.links[info.uid] = link
        self._open.add(link)
        self._spawn(self._serve(link))

    async def _serve(self, link: Link) -> None:
        try:
            await link.run()
        finally:
            self._open.discard(link)
            self._refusing.discard(link)
            self._lost(link)

    def _lost(self, link: Link) -> None:
        """A link's stream ended: its tasks go elsewhere; reconnect if the
        worker is still registered and alive (its drop is coming otherwise)."""
        self._requeue(link)
        if self.links.get(link.info.uid) is link and not self._closed:
            if self._is_alive(self.namespace, link.info.uid):
                self._spawn(self._reconnect(link))
            else:
                del self.links[link.info.uid]
        self.pump()

    async def _reconnect(self, old: Link) -> None:
        await asyncio.sleep(RECONNECT_DELAY_S)  # a pause, not a wait for an event
        if self.links.get(old.info.uid) is old and not self._closed:
            self._open_link(old.info)
            self.pump()

    def _requeue(self, link: Link) -> None:
        jobs, link.in_flight = list(link.in_flight.values()), {}
        for job in reversed(jobs):  # keep their order at the queue's front
            job.link = None
            if job.finished:
                continue
            taken = job.lost(link.info)
            if job.attempts >= self._max_attempts:
                if self._closed:  # no time to wait for how the last one died
                    self._fail(job, self._lost_error(job))
                else:
                    self._spawn(self._fail_lost(job))
            elif job.untaken_losses >= MAX_UNTAKEN_LOSSES:
                self._fail(job, WorkerLost(job.untaken_losses, ()))
            elif self.stopping:
                self._fail(job, PoolStopping(self.namespace, _STOPPED[taken]))
            else:
                self.queue.push(job, front=True)
        self._check_settled()

    async def _fail_lost(self, job: Job) -> None:
        """Fail a task that lost its worker too often, saying how each died
        (waiting a moment for the supervisor's report of the last death)."""
        await self._exits.wait_for(job.lost_on[-1].pid)
        self._fail(job, self._lost_error(job))

    def _lost_error(self, job: Job) -> WorkerLost:
        return WorkerLost(job.attempts, tuple(map(self._exits.describe, job.lost_on)))

    def record_exit(self, pid: int, status: str) -> None:
        """The supervisor's word on how worker ``pid`` ended."""
        self._exits.record(pid, status)

    # -- tasks ---------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job (its task's id is replaced by the dispatcher's own).
        Call :meth:`pump` once the caller's batch is queued. While stopping,
        the job fails at once."""
        job.task.id = next(self._ids)
        if self.stopping:
            self._fail(job, PoolStopping(self.namespace))
        elif self._unmatched(job):
            self._fail_unmatched(job)
        else:
            self.queue.push(job)

    def started(self) -> None:
        """Every worker of the pool has started (the supervisor says so): from
        now on, a task whose tags no registered worker has fails at once."""
        self._started = True
        for job in self.queue.remove_where(self._unmatched):
            self._fail_unmatched(job)

    def _unmatched(self, job: Job) -> bool:
        """Whether the pool has started and no registered worker has the
        job's tags (else it may yet find one)."""
        if not (self._started and job.tags and self.links):
            return False
        return not any(job.tags <= link.info.tags for link in self.links.values())

    def _fail_unmatched(self, job: Job) -> None:
        known = frozenset().union(*(link.info.tags for link in self.links.values()))
        error = NoWorkerAvailable(tuple(sorted(job.tags)), 0.0, tuple(sorted(known)))
        self._fail(job, error, grpc.StatusCode.DEADLINE_EXCEEDED)

    @property
    def queued(self) -> int:
        """Tasks waiting for a worker."""
        return self.queue.waiting

    @property
    def room(self) -> asyncio.Event:
        """Set while the queue has room (see :class:`TaskQueue`)."""
        return self.queue.room

    def cancel(self, job: Job) -> None:
        """Cancel a task: at once if no worker has it, else through its worker."""
        if job.finished:
            return
        link = job.link
        if link is None:  # queued: it leaves the queue when the pump meets it
            self.queue.leave()
            self._deliver(job, Result(id=job.task.id, failure=codec.cancelled()))
        elif link.withdraw(job):  # not written to the worker yet
            del link.in_flight[job.task.id]
            job.link = None
            self._deliver(job, Result(id=job.task.id, failure=codec.cancelled()))
        else:
            link.cancel(job.task.id)

    def _deliver(self, job: Job, result: Result) -> None:
        job.finished = True
        job.owner.on_result(job, result)

    def _fail(
        self, job: Job, error: Exception, code: grpc.StatusCode | None = None
    ) -> None:
        failure = codec.failure_of(error, code or grpc.StatusCode.ABORTED, remote=False)
        self._deliver(job, Result(id=job.task.id, failure=failure))

    def on_connected(self, link: Link) -> None:
        """The stream to ``link``'s worker is up: send it what waits."""
        self.pump()

    def on_accepted(self, link: Link, task_ids: Iterable[int]) -> None:
        """The worker on ``link`` has taken these tasks."""
        for task_id in task_ids:
            if (job := link.in_flight.get(task_id)) is not None and not job.taken:
                job.taken = True
                job.owner.on_accepted(job)

    def on_results(self, link: Link, results: Iterable[Result]) -> None:
        """Results from the worker on ``link`` (one message's): each is
        delivered, then the queue is pumped once."""
        for result in results:
            self._on_result(link, result)
        self._check_settled()
        self.pump()

    def _on_result(self, link: Link, result: Result) -> None:
        job = link.in_flight.pop(result.id, None)
        if job is None:
            return  # requeued elsewhere already, or withdrawn
        job.link = None
        failed = result.HasField("failure")
        if failed and codec.status_of(result.failure) == grpc.StatusCode.UNAVAILABLE:
            job.taken = False  # the worker could not run it: not an attempt
            # Send it nothing more until its published state changes (it is
            # draining or stuck): else the task would bounce back and forth.
            self._refusing.add(link)
            if self.stopping:
                self._fail(job, PoolStopping(self.namespace))
            else:
                self.queue.push(job, front=True)
        else:
            link.done += 1
            self._deliver(job, result)

    def pump(self) -> None:
        """Place every queued task that a ready worker can take now."""
        if not self.queue:
            return
        ready = [
            link
            for link in self.links.values()
            if link.ready and link not in self._refusing
        ]

        def choose(job: Job) -> Link | None:
            """The least-loaded ready link with room and the job's tags."""
            fits = [k for k in ready if k.free > 0 and job.tags <= k.info.tags]
            return min(fits, key=_load, default=None)

        self.queue.place(sum(max(link.free, 0) for link in ready), choose)

    def expire(self) -> None:
        """Fail the tasks that have had no matching ready worker for too long.

        Called about once a second; a task fails between the limit and a
        second past it.
        """
        limit = self._no_worker_timeout_s
        ready = [link.info.tags for link in self.links.values() if link.ready]
        for job in self.queue.expired(ready, limit):
            error = NoWorkerAvailable(tuple(sorted(job.tags)), limit)
            self._fail(job, error, grpc.StatusCode.DEADLINE_EXCEEDED)

    async def _expire_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)  # a ticker, not a wait for an event
            self.expire()

    # -- stopping ------------------------------------------------------------

    def stop_taking(self) -> None:
        """The pool drains: fail what waits, and whatever comes later."""
        if self.stopping:
            return
        self.stopping = True
        for job in self.queue.remove_where(lambda job: True):
            self._fail(job, PoolStopping(self.namespace))
        self._check_settled()

    def _check_settled(self) -> None:
        if self.stopping and not any(link.in_flight for link in self._open):
            self._settled.set()

    async def finish(self, linger_s: float) -> None:
        """Stop: wait up to ``linger_s`` for the workers' last results, then
        fail every task still unanswered."""
        self.stop_taking()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(linger_s):
                await self._settled.wait()
        detail = "the pool stopped before its worker answered"
        for link in list(self._open):
            jobs, link.in_flight = list(link.in_flight.values()), {}
            for job in jobs:
                if not job.finished:
                    self._fail(job, PoolStopping(self.namespace, detail))


async def _close_after(link: Link, grace_s: float) -> None:
    """Close a dropped worker's link once its stream had ``grace_s`` to end."""
    try:
        await asyncio.sleep(grace_s)  # the grace itself, not a wait for an event
    finally:
        link.close()


def _load(link: Link) -> float:
    return len(link.in_flight) / link.info.capacity
