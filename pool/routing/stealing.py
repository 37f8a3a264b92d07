"""Taking back what workers hold unstarted: :class:`Withdrawals`.

A worker is sent a little ahead of its free slots (to hide a round trip),
and what it holds unstarted stays the router's. This module asks for such
tasks back, for three reasons: to *move* them, when the router's queue is
empty and some worker has a slot with nothing for it (:meth:`steal`); to
let a task of a higher priority that waits start first (:meth:`preempt`);
and to *stop* them, when the pool drains (:meth:`take_back_all`). A holder
whose tasks are shorter than a round trip, and that started one lately, is
left alone (:func:`~pool.routing.choosing.keeps_up`): what it holds
will have run before a steal arrives. A task not yet written to its
worker comes back at once; one written is asked back
with a cancel, and the worker answers exactly one of "withdrawn"
(CANCELLED) or "started" (the task runs there, and the ask is forgotten).
Owned by :class:`~pool.routing.placement.Router`, which queues or fails
what comes back; on the dispatcher's loop, no I/O of its own.

A holder left alone because it kept up may stop keeping up with nothing
else happening (a long task among short ones that the router packed
behind it: :mod:`pool.routing.choosing`): so :meth:`Withdrawals.steal`
keeps one timer, for when the first such holder will lag
(:func:`~pool.routing.choosing.lag_after`), and then calls its owner
back to pump (and steal) again.
Its owner ends it with :meth:`Withdrawals.close`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from typing import Final

from pool.routing.choosing import keeps_up, lag_after
from pool.routing.jobs import Job, Link
from pool.routing.queue import TaskQueue

# The look-again timer waits at least this long (it fires about once per
# choosing.LAG_MIN_S while a packed holder keeps up beside an idle worker).
LOOK_AGAIN_MIN_S: Final = 0.001


class Withdrawals:
    """The tasks asked back from their workers, to be placed again: those
    that come back at once go to the front of ``queue``, the others when
    their worker's answer comes (the owner puts them there).

    :param look_again: called (on the loop) once a holder left alone
        by :meth:`steal` may no longer keep up: the owner pumps again.
    """

    def __init__(
        self, queue: TaskQueue, look_again: Callable[[], None] = lambda: None
    ) -> None:
        self._queue = queue
        self.asked: set[Job] = set()
        self._look_again = look_again
        self._due: float | None = None  # when a holder left alone may lag
        self._timer: asyncio.TimerHandle | None = None
        self._fires_at = 0.0  # when the timer, if set, fires

    def close(self) -> None:
        """Stop the look-again timer."""
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def forget(self, job: Job) -> None:
        """The ask is answered (withdrawn, started, cancelled or lost)."""
        self.asked.discard(job)

    def steal(self, ready: list[Link], holders: Iterable[Link]) -> bool:
        """Ask back, for each slot of ``ready`` with nothing for it, a task a
        holder keeps waiting behind its busy slots (the highest priority,
        then the newest first), if an idle link can run it; what an ask in
        flight will bring counts. Whether some came back at once (not
        written yet: they are queued again)."""
        self._due = None
        idle = [link for link in ready if link.load < link.slots]
        return bool(idle) and self._again(self._steal(idle, holders))

    def _steal(self, idle: list[Link], holders: Iterable[Link]) -> list[Job]:
        wanted = sum(k.slots - k.load for k in idle) - len(self.asked)
        if wanted <= 0:
            return []
        now = time.monotonic()
        back: list[Job] = []
        holding = [k for k in holders if k.load > k.slots]  # (few)
        for holder in sorted(holding, key=_excess, reverse=True):
            waiting = _excess(holder)
            if keeps_up(holder, now):
                self._watch(lag_after(holder))
                continue
            for job in _newest_of_highest_priority(holder):
                if wanted <= 0 or waiting <= 0:
                    break
                if job.started or job.withdrawing is not None:
                    continue
                if any(job.tags <= k.info.tags for k in idle if k is not holder):
                    self._take_back(holder, job, back)
                    wanted -= 1
                    waiting -= 1
            if wanted <= 0:
                break
        return back

    def _watch(self, due: float) -> None:
        """Look again at ``due`` (or sooner, if another holder lags sooner);
        a timer set for later than that is set again."""
        if self._due is None or due < self._due:
            self._due = due
        if self._timer is not None and self._fires_at <= self._due:
            return  # (it fires first, and waits on for the rest if need be)
        if self._timer is not None:
            self._timer.cancel()
        self._arm(self._due)

    def _arm(self, due: float) -> None:
        delay = max(due - time.monotonic(), LOOK_AGAIN_MIN_S)
        self._fires_at = time.monotonic() + delay
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        """The timer: call the owner back, unless the last steal found the
        holders it left alone lagging later than this (wait for that)."""
        self._timer = None
        if self._due is None:
            return  # no holder is left alone beside an idle slot now
        if time.monotonic() < self._due:
            self._arm(self._due)
        else:
            self._due = None
            self._look_again()

    def held_floor(self, links: Iterable[Link]) -> float | None:
        """With jobs of several priorities queued so far: the highest
        priority that ``links`` hold unstarted (-inf: none), below which
        nothing is placed (:meth:`TaskQueue.place`). None with one priority
        only."""
        if not self._queue.mixed:
            return None
        held = (
            job.task.priority
            for link in links
            for job in link.in_flight.values()
            if not job.started
        )
        return max(held, default=-math.inf)

    def preempt(self, holders: list[Link]) -> bool:
        """Ask back what ``holders`` keep unstarted behind queued jobs of a
        higher priority (:meth:`_preempt`); whether some came back at once
        (queued again, at their own priority)."""
        queue = self._queue
        top = queue.top_priority
        if top is None or top <= queue.lowest:
            return False  # (nothing can be held at a lower one)
        room = sum(link.load for link in holders)
        waiting = queue.waiting_above(queue.lowest, room)
        return self._again(self._preempt(holders, waiting))

    def _again(self, back: list[Job]) -> bool:
        """Queue again, in order at the front, what came back at once."""
        for job in reversed(back):
            self._queue.push(job, front=True)
        return bool(back)

    def _preempt(self, holders: Iterable[Link], waiting: Iterable[Job]) -> list[Job]:
        """Ask back, for each job of ``waiting`` (queued, highest priority
        first), one its priority passes that a holder its tags fit keeps
        unstarted (the lowest priority first, the newest first); an ask in
        flight counts for one. The jobs that came back at once (not
        written yet) are returned."""
        held = [
            (job, link)
            for link in holders
            for job in reversed(link.in_flight.values())
            if not job.started and job.withdrawing is None
        ]
        held.sort(key=lambda pair: pair[0].task.priority)  # (stable: newest first)
        back: list[Job] = []
        in_flight = len(self.asked)
        for want in waiting:
            if in_flight:
                in_flight -= 1
                continue
            for i, (job, link) in enumerate(held):
                if job.task.priority >= want.task.priority:
                    return back  # (none lower is left)
                if want.tags <= link.info.tags:
                    self._take_back(link, job, back)
                    del held[i]
                    break
        return back

    def take_back_all(self, links: Iterable[Link]) -> list[Job]:
        """Ask back every task the links hold unstarted (the pool stops);
        those that came back at once are returned."""
        back: list[Job] = []
        for link in links:
            for job in list(link.in_flight.values()):
                if not job.started and job.withdrawing is None:
                    self._take_back(link, job, back)
        return back

    def _take_back(self, link: Link, job: Job, back: list[Job]) -> None:
        if link.take_back(job):  # not written yet: it is back now
            back.append(job)
        else:
            job.withdrawing = "requeue"
            self.asked.add(job)
            link.cancel(job.task.id)


def _newest_of_highest_priority(link: Link) -> list[Job]:
    """What ``link`` holds, the highest priority first, the newest first
    within one."""
    jobs = list(link.in_flight.values())
    jobs.reverse()
    jobs.sort(key=lambda job: -job.task.priority)  # (stable: newest first)
    return jobs


def _excess(link: Link) -> int:
    """Tasks its worker holds past its slots (other dispatchers' count):
    some wait behind a busy one."""
    return link.load - link.slots
