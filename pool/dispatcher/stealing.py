"""Taking back what workers hold unstarted: :class:`Withdrawals`.

A worker is sent a little ahead of its free slots (to hide a round trip),
and what it holds unstarted stays the router's. This module asks for such
tasks back, for two reasons: to *move* them, when the router's queue is
empty and some worker has a slot with nothing for it (:meth:`steal`), and
to *stop* them, when the pool drains (:meth:`take_back_all`). A holder
whose tasks are far shorter than a round trip, and that answered within
one, is left alone: what it holds will have run before a steal arrives. A task not
yet written to its worker comes back at once; one written is asked back
with a cancel, and the worker answers exactly one of "withdrawn"
(CANCELLED) or "started" (the task runs there, and the ask is forgotten).
Owned by :class:`~pool.dispatcher.placement.Router`, which queues or fails
what comes back; on the dispatcher's loop, no I/O of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from pool.dispatcher.jobs import Job, Link


class Withdrawals:
    """The tasks asked back from their workers, to be placed again."""

    def __init__(self) -> None:
        self.asked: set[Job] = set()

    def forget(self, job: Job) -> None:
        """The ask is answered (withdrawn, started, cancelled or lost)."""
        self.asked.discard(job)

    def steal(self, idle: list[Link], holders: Iterable[Link]) -> list[Job]:
        """Ask back, for each slot of ``idle`` with nothing for it, a task a
        holder keeps waiting behind its busy slots (the newest first), if an
        idle link can run it; what an ask in flight will bring counts. The
        tasks that came back at once (not written yet) are returned."""
        wanted = sum(k.slots - len(k.in_flight) for k in idle) - len(self.asked)
        if wanted <= 0:
            return []
        now = time.monotonic()
        back: list[Job] = []
        for holder in sorted(holders, key=_excess, reverse=True):
            waiting = _excess(holder)
            if waiting <= 0:
                break
            if _keeps_up(holder, now):
                continue
            for job in reversed(list(holder.in_flight.values())):
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
        if link.withdraw(job):  # not written yet: it is back now
            del link.in_flight[job.task.id]
            job.link = None
            back.append(job)
        else:
            job.withdrawing = "requeue"
            self.asked.add(job)
            link.cancel(job.task.id)


def _keeps_up(link: Link, now: float) -> bool:
    """Whether what ``link`` holds will have run before a steal arrives:
    its tasks are shorter than a round trip, and it answered within one."""
    return 0 < link.pace_s < link.rtt_s and now - link.answered_at < link.rtt_s


def _excess(link: Link) -> int:
    """Tasks it holds past its slots: some wait behind a busy one."""
    return len(link.in_flight) - link.slots
