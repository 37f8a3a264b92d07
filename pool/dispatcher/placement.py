"""Routing tasks to the workers discovery finds: the dispatcher's logic.

:class:`Router` owns the queue of tasks waiting for a worker
(:mod:`pool.dispatcher.queue`) and the links to the workers
(:mod:`pool.dispatcher.roster`; the real link is
:class:`~pool.dispatcher.links.WorkerLink`). It places each task on a
ready worker whose tags include the task's (short work packed, the rest
spread: :mod:`pool.dispatcher.choosing`), never past what the link may
hold (:attr:`~pool.dispatcher.jobs.Link.free`). Caller:
:mod:`pool.dispatcher.server`, on its loop; tests drive it with fake links.

A task is the router's until a worker *starts* it. One a worker holds
unstarted is withdrawn when its client cancels it, and moved when the
queue is empty and another worker has a slot with nothing for it
(:mod:`pool.dispatcher.stealing`). So no task waits behind another while a
slot that could run it is free.

Attempts. A worker reports the tasks it has *started* with its results.
When a worker is lost (its stream ends), its unfinished tasks go back to
the front of the queue: one that may have run there (reported started,
or among the first unreported that a free slot could have taken) counts
an attempt, one held behind busy slots none. At ``max_attempts`` it fails with
:class:`~pool.errors.WorkerLost`, which says how each worker died; one
lost unstarted :data:`MAX_UNTAKEN_LOSSES` times fails too.

Bounds. At most ``max_queued`` tasks wait (``Router.queue.room``); one with no
matching ready worker fails after ``no_worker_timeout_s``.

Stopping. :meth:`Router.stop_taking` (the pool drains) fails with
:class:`~pool.errors.PoolStopping` every task not started (queued, or held
by a worker, which gives it back) and every task submitted later; started
ones finish and are delivered. :meth:`Router.finish` waits a bounded time
for them, then fails the rest.

Every background task (links, ticker, graces, failures that wait for an exit
report) runs in the router's task group (``async with Router(...)``). With a
dashboard, :attr:`Router.telemetry` is told of every task's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, Self
from uuid import UUID

import grpc

from discovery import DiscoveryEvent, WorkerInfo
from pool.dispatcher.choosing import Chooser
from pool.dispatcher.exits import Exits
from pool.dispatcher.jobs import Connect, Job, Link
from pool.dispatcher.queue import MAX_QUEUED, TaskQueue
from pool.dispatcher.roster import Roster
from pool.dispatcher.stealing import Withdrawals
from pool.dispatcher.telemetry import Telemetry
from pool.errors import NoWorkerAvailable, PoolStopping, WorkerLost
from workers.protocol import codec
from workers.protocol.worker_pb2 import Failure, Result

NO_WORKER_TIMEOUT_S: Final = 30.0
MAX_ATTEMPTS: Final = 3
MAX_UNTAKEN_LOSSES: Final = 10
EXPIRE_EVERY_S: Final = 1.0
_STOPPED: Final = {  # why a task lost its worker as the pool stopped, if started
    True: "its worker stopped before it finished",
    False: "its worker stopped before it started the task, so it never ran",
}


class Router:
    """The queue of waiting tasks and the links to workers; see the module doc.

    :param connect: makes the link to a newly discovered worker.
    :param is_alive: whether a worker is still registered by a live process
        (its liveness lock); a link that breaks to a live worker reconnects.
    :param on_linked: told of each worker whose stream is up.
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
        on_linked: Callable[[WorkerInfo], None] = lambda info: None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.namespace, self._connect, self._is_alive = namespace, connect, is_alive
        self._on_linked, self._max_attempts = on_linked, max_attempts
        self._no_worker_timeout_s = no_worker_timeout_s
        self._ids = itertools.count(1)
        self._roster = Roster(
            namespace,
            connect,
            self,
            is_alive=is_alive,
            spawn=self._spawn,
            on_lost=self._lost,
        )
        self._open = self._roster.open  # every link whose stream still runs
        self._refusing: set[Link] = set()  # answered UNAVAILABLE since its last news
        self._withdrawals = Withdrawals(self.pump)  # asked back from workers
        self.queue = TaskQueue(max_queued)
        self.stopping = False
        self._stack = contextlib.AsyncExitStack()  # holds the task group
        self._group: asyncio.TaskGroup | None = None
        self._expiring: asyncio.Task[None]
        self._settled = asyncio.Event()  # stopping, and no worker has a task
        self._exits = Exits()
        self._started = False  # every worker of the pool has started once
        self._broken: Failure | None = None  # no worker can start: fail all
        self.telemetry: Telemetry | None = None  # told of every end, if set

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
        self._expiring.cancel()
        self._withdrawals.close()
        self._roster.close()
        await self._stack.__aexit__(*exc_info)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        assert self._group is not None, "use the router inside `async with`"
        return self._group.create_task(coro)

    # -- discovery -----------------------------------------------------------

    def on_event(self, event: DiscoveryEvent) -> None:
        if (link := self._roster.on_event(event)) is not None:
            self._refusing.discard(link)  # its news says what it takes
        self.pump()

    @property
    def links(self) -> dict[UUID, Link]:
        """The links of the registered workers, by uid."""
        return self._roster.links

    def _lost(self, link: Link) -> None:
        """A link's stream ended: its tasks go elsewhere."""
        self._refusing.discard(link)
        self._requeue(link)
        self.pump()

    def _requeue(self, link: Link) -> None:
        jobs = link.in_flight.remove_all()
        # A worker starts tasks in the order it got them and reports starts
        # after the fact: as many of the first unreported ones as it had
        # slots free may have run.
        free = link.slots - sum(job.started for job in jobs)
        unreported = [job for job in jobs if not job.started and not job.finished]
        maybe = set(unreported[: max(free, 0)])
        for job in reversed(jobs):  # keep their order at the queue's front
            self._withdrawals.forget(job)
            if job.finished:
                continue
            taken = job.lost(link.info, job in maybe)
            if job.attempts >= self._max_attempts:
                if self._roster.closed:  # no time to wait for how the last one died
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
        elif self._broken is not None:
            self._deliver(job, Result(id=job.task.id, failure=self._broken))
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

    def broken(self, failure: Failure) -> None:
        """No worker can start (their initializer fails): what waits, and
        whatever comes later, fails with ``failure``."""
        self._broken = failure
        for job in self.queue.remove_where(lambda job: True):
            self._deliver(job, Result(id=job.task.id, failure=failure))

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

    def cancel(self, job: Job) -> None:
        """Cancel a task: at once if no worker has it, else through its worker."""
        if job.finished:
            return
        link = job.link
        if link is None:  # queued: it leaves the queue when the pump meets it
            self.queue.leave()
            self._deliver(job, Result(id=job.task.id, failure=codec.cancelled()))
        elif link.take_back(job):  # not written to the worker yet
            self._deliver(job, Result(id=job.task.id, failure=codec.cancelled()))
        elif job.withdrawing != "cancel":  # (once asked, asked)
            if job.withdrawing is None:
                link.cancel(job.task.id)
            self._withdrawals.forget(job)
            job.withdrawing = "cancel"  # (a steal under way answers this too)

    def _deliver(self, job: Job, result: Result, by: WorkerInfo | None = None) -> None:
        job.finished = True
        if self.telemetry is not None:
            self.telemetry.finished(job, result, by)
        job.owner.on_result(job, result)

    def _fail(
        self, job: Job, error: Exception, code: grpc.StatusCode | None = None
    ) -> None:
        failure = codec.failure_of(error, code or grpc.StatusCode.ABORTED, remote=False)
        self._deliver(job, Result(id=job.task.id, failure=failure))

    def on_connected(self, link: Link) -> None:
        """The stream to ``link``'s worker is up: send it what waits."""
        self._on_linked(link.info)
        self.pump()

    def on_started(self, link: Link, task_ids: Iterable[int]) -> None:
        """The worker on ``link`` has started these tasks."""
        for task_id in task_ids:
            if (job := link.in_flight.get(task_id)) is not None and not job.started:
                job.started = True
                if job.withdrawing == "requeue":
                    job.withdrawing = None  # too late: it runs there
                    self._withdrawals.forget(job)
                job.owner.on_started(job)

    def on_results(self, link: Link, results: Iterable[Result]) -> None:
        """Results from the worker on ``link`` (one message's): each is
        delivered, then the queue is pumped once."""
        for result in results:
            self._on_result(link, result)
        self._check_settled()
        self.pump()

    def _on_result(self, link: Link, result: Result) -> None:
        job = link.in_flight.remove(result.id)
        if job is None:
            return  # requeued elsewhere already, or withdrawn
        failed = result.HasField("failure")
        status = codec.status_of(result.failure) if failed else None
        self._withdrawals.forget(job)
        if job.withdrawing == "requeue" and status == grpc.StatusCode.CANCELLED:
            job.withdrawing = None
            if self.stopping:
                self._fail(job, PoolStopping(self.namespace, _STOPPED[False]))
            else:
                self.queue.push(job, front=True)  # on to a free worker (the pump)
        elif status == grpc.StatusCode.UNAVAILABLE:
            job.started = False  # the worker could not run it: not an attempt
            # Send it nothing more until its published state changes (it is
            # draining or stuck): else the task would bounce back and forth.
            self._refusing.add(link)
            if self.stopping:
                self._fail(job, PoolStopping(self.namespace))
            else:
                self.queue.push(job, front=True)
        else:
            link.done += 1
            self._deliver(job, result, link.info)

    def pump(self) -> None:
        """Place every queued task that a ready worker can take now; with
        none queued, steal for the slots that have nothing."""
        ready = [
            link
            for link in self.links.values()
            if link.ready and link not in self._refusing
        ]
        for _ in range(2):  # (again once for what a steal took back at once)
            if self.queue:
                self.queue.place(Chooser(ready))
            if self.queue.waiting or not self._steal(ready):
                return

    def _steal(self, ready: list[Link]) -> bool:
        """Ask back tasks held behind busy slots for the slots that have
        nothing (:mod:`pool.dispatcher.stealing`); whether some came back at
        once (they are queued again)."""
        idle = [link for link in ready if link.load < link.slots]
        if not idle:
            return False
        back = self._withdrawals.steal(idle, self._open)
        for job in reversed(back):
            self.queue.push(job, front=True)
        return bool(back)

    def expire(self) -> None:
        """Fail the tasks that have had no matching ready worker for too long
        (called about once a second: a task fails up to a second late)."""
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
        """The pool drains: fail what waits (queued, or held unstarted by a
        worker, which is asked to give it back), and whatever comes later."""
        if self.stopping:
            return
        self.stopping = True
        for job in self.queue.remove_where(lambda job: True):
            self._fail(job, PoolStopping(self.namespace))
        for job in self._withdrawals.take_back_all(self._open):  # unstarted
            self._fail(job, PoolStopping(self.namespace, _STOPPED[False]))
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
            for job in link.in_flight.remove_all():
                if not job.finished:
                    self._fail(job, PoolStopping(self.namespace, detail))
