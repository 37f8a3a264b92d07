"""Routing tasks to the workers discovery finds: the engine the dispatcher runs.

:class:`Router` owns the queue of tasks waiting for a worker
(:mod:`pool.routing.queue`) and the links to the workers
(:mod:`pool.routing.roster`; the real link is
:class:`~pool.routing.links.WorkerLink`). It places each task on a
ready worker whose tags include the task's (short work packed, the rest
spread: :mod:`pool.routing.choosing`), never past what the link may
hold (:attr:`~pool.routing.jobs.Link.free`). Caller:
:mod:`pool.dispatcher.server`, on its loop; tests drive it with fake links.

A task is the router's until a worker *starts* it. One a worker holds
unstarted is withdrawn when its client cancels it, and moved when the
queue has nothing for a worker's free slot, or a task of a higher priority
waits (:mod:`pool.routing.stealing`). So no task waits behind another
while a slot that could run it is free.

Priorities. Queued tasks go highest priority first
(:mod:`pool.routing.queue`). With several priorities about, nothing of
a lower one is sent while one of a higher one is held unstarted anywhere
(it would start first on another worker), and a higher one that waits
takes back what a worker holds of a lower one.

Cancels. A cancel is answered where the task is: in the queue, or in a
link not yet written, at once; else its worker decides, as its kind says
(:data:`~workers.protocol.stream.Withdraw`).

Attempts. A worker reports the tasks it has *started* with its results.
When a worker is lost (its stream ends), its unfinished tasks go back to
the front of the queue, counting an attempt if they may have run there,
or are answered (:mod:`pool.routing.losses` says which); at
``max_attempts`` a task fails with :class:`~pool.errors.WorkerLost`,
which says how each worker died.

Bounds. At most ``max_queued`` tasks wait (``Router.queue.room``); one with no
matching ready worker fails after ``no_worker_timeout_s``
(:mod:`pool.routing.matching`).

Stopping. Tasks not started fail with :class:`~pool.errors.PoolStopping`
(:meth:`Router.stop_taking`); started ones finish and are delivered, for a
bounded time (:meth:`Router.finish`).

Every background task (links, ticker, graces, failures that wait for an exit
report) runs in the router's task group (``async with Router(...)``). With a
dashboard, :attr:`Router.telemetry` is told of every task's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, Self, assert_never
from uuid import UUID

import grpc

from discovery import DiscoveryEvent, WorkerInfo
from pool.errors import PoolStopping, WorkerLost
from pool.routing.choosing import Chooser
from pool.routing.exits import Exits
from pool.routing.jobs import Connect, Ends, Job, Link
from pool.routing.losses import Fate, fates
from pool.routing.matching import NO_WORKER_TIMEOUT_S, Matching
from pool.routing.queue import MAX_QUEUED, TaskQueue
from pool.routing.roster import Roster
from pool.routing.stealing import Withdrawals
from workers.protocol import codec
from workers.protocol.errors import TaskTimeout
from workers.protocol.stream import STRENGTH, Withdraw
from workers.protocol.worker_pb2 import Failure, Result

MAX_ATTEMPTS: Final = 3
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
        self._matching = Matching(self._roster.links, no_worker_timeout_s)
        self._refusing: set[Link] = set()  # answered UNAVAILABLE since its last news
        self.queue = TaskQueue(max_queued)
        self._withdrawals = Withdrawals(self.queue, self.pump)  # asked back
        self.stopping = False
        self._stack = contextlib.AsyncExitStack()  # holds the task group
        self._group: asyncio.TaskGroup | None = None
        self._expiring: asyncio.Task[None]
        self._settled = asyncio.Event()  # stopping, and no worker has a task
        self._exits = Exits()
        self.telemetry: Ends | None = None  # told of every end, if set

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
        for job in jobs:
            self._withdrawals.forget(job)
        now = time.monotonic()
        for job, fate, taken in fates(link, jobs, self._max_attempts, now):
            match fate:
                case Fate.AGAIN if self.stopping:
                    self._fail(job, PoolStopping(self.namespace, _STOPPED[taken]))
                case Fate.AGAIN:
                    self.queue.push(job, front=True)
                case Fate.CANCELLED:
                    self._cancelled(job)
                case Fate.TIMED_OUT:
                    deadline = grpc.StatusCode.DEADLINE_EXCEEDED
                    self._fail(job, TaskTimeout(job.task.timeout_s), deadline)
                case Fate.ATTEMPTS_SPENT if self._roster.closed:
                    self._fail(job, self._lost_error(job))  # (no time to wait)
                case Fate.ATTEMPTS_SPENT:
                    self._spawn(self._fail_lost(job))
                case Fate.UNTAKEN_TOO_OFTEN:
                    self._fail(job, WorkerLost(job.untaken_losses, ()))
                case _:
                    assert_never(fate)
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
        elif (refusal := self._matching.refusal(job)) is not None:
            self._deliver(job, refusal)
        else:
            self.queue.push(job)

    def started(self) -> None:
        """Every worker of the pool has started (the supervisor says so): from
        now on, a task whose tags no registered worker has fails at once."""
        self._matching.started = True
        self._refuse(self.queue.remove_where(self._matching.unmatched))

    def broken(self, failure: Failure) -> None:
        """No worker can start (their initializer fails): what waits, and
        whatever comes later, fails with ``failure``."""
        self._matching.broken = failure
        self._refuse(self.queue.remove_where(lambda job: True))

    def _refuse(self, jobs: list[Job]) -> None:
        for job in jobs:
            refusal = self._matching.refusal(job)
            assert refusal is not None
            self._deliver(job, refusal)

    @property
    def queued(self) -> int:
        """Tasks waiting for a worker."""
        return self.queue.waiting

    def cancel(self, job: Job, kind: Withdraw = "cancel") -> None:
        """Withdraw a task as its client asks (``kind``: see the module
        docstring): at once if no worker has it, else through its worker;
        once per kind, a stronger one going on."""
        if job.finished:
            return
        link = job.link
        if link is None:  # queued: it leaves the queue when the pump meets it
            self.queue.leave(job)
            self._cancelled(job)
        elif link.take_back(job):  # not written to the worker yet
            self._cancelled(job)
        elif kind == "cancel" and job.started:
            return  # (the worker would refuse: its start is the client's no)
        elif STRENGTH[kind] > STRENGTH[job.asked]:
            if not (kind == "cancel" and job.withdrawing == "requeue"):
                link.cancel(job.task.id, kind)  # (a steal's ask is a cancel)
            self._withdrawals.forget(job)
            job.withdrawing = kind  # (a steal under way answers this too)

    def _cancelled(self, job: Job) -> None:
        self._deliver(job, Result(id=job.task.id, failure=codec.cancelled()))

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
        """The worker on ``link`` has started these tasks (with several
        priorities about, what waited for them to start goes now)."""
        now = time.monotonic()
        for task_id in task_ids:
            if (job := link.in_flight.get(task_id)) is not None and not job.started:
                job.started, job.started_at = True, now
                if job.withdrawing == "requeue":
                    job.withdrawing = None  # too late: it runs there
                    self._withdrawals.forget(job)
                job.owner.on_started(job)
        if self.queue.mixed and self.queue:
            self.pump()

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
            if job.asked:  # (handed back unrun: its client's cancel holds)
                self._cancelled(job)
            elif self.stopping:
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
        withdrawals = self._withdrawals
        for _ in range(2):  # (again once for what came back at once)
            floor = withdrawals.held_floor(self._open)
            if self.queue:
                self.queue.place(Chooser(ready), floor)
            if self.queue.waiting and withdrawals.preempt(ready):
                continue
            # With the queue empty, or holding only what waits for higher
            # work held elsewhere, the slots that have nothing take that.
            if self.queue.waiting and floor is None:
                return
            if not withdrawals.steal(ready, self._open):
                return

    def expire(self) -> None:
        """Fail the tasks that have had no matching ready worker for too long
        (:meth:`Matching.expired`)."""
        for job, result in self._matching.expired(self.queue):
            self._deliver(job, result)

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
