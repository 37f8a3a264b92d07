"""The dispatcher's queue: the tasks no worker has, in order, bounded.

New jobs join at the back; those a lost worker gave back, at the front, in
their order. At most ``max_queued`` wait: :attr:`TaskQueue.room` is clear
while the queue is full, and the client streams stop reading until it is
set again (DESIGN.md, Concurrency). A job cancelled while it waits is
counted out at once and skipped when :meth:`TaskQueue.place` or
:meth:`TaskQueue.remove_where` meets it. A job no ready worker matches
expires after a bound (:meth:`TaskQueue.expired`). Where each job goes is
:class:`LeastLoaded`'s choice. Owned by
:class:`~pool.dispatcher.placement.Router`, on the dispatcher's loop; no
I/O.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from pool.dispatcher.jobs import Job, Link

MAX_QUEUED: Final = 100_000  # the default bound


class TaskQueue:
    """Jobs waiting for a worker; see the module docstring.

    :raises ValueError: for a ``max_queued`` below 1.
    """

    def __init__(self, max_queued: int) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.max_queued = max_queued
        self._jobs: deque[Job] = deque()
        self.waiting = 0  # jobs in the deque not finished
        self.room = asyncio.Event()  # set while fewer than max_queued wait
        self.room.set()

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def push(self, job: Job, *, front: bool = False) -> None:
        if front:
            self._jobs.appendleft(job)
        else:
            self._jobs.append(job)
        self.waiting += 1
        if self.waiting >= self.max_queued:
            self.room.clear()

    def leave(self) -> None:
        """A queued job was answered where it stands (cancelled)."""
        self.waiting -= 1
        if self.waiting < self.max_queued:
            self.room.set()

    def place(self, chooser: LeastLoaded) -> None:
        """Hand jobs, in order, to the link ``chooser`` picks for each,
        while any has room; a job with none keeps its place."""
        skipped: deque[Job] = deque()
        while self._jobs and chooser.room > 0:
            job = self._jobs.popleft()
            if job.finished:
                continue  # cancelled while it waited (counted out then)
            link = chooser.choose(job)
            if link is None:
                skipped.append(job)
                continue
            self.leave()
            link.send(job)
        self._jobs.extendleft(reversed(skipped))

    def remove_where(self, reject: Callable[[Job], bool]) -> list[Job]:
        """Take out, in order, the waiting jobs ``reject`` says go; the rest
        keep their places."""
        kept: deque[Job] = deque()
        removed = []
        for job in self._jobs:
            if job.finished:
                continue
            if reject(job):
                self.leave()
                removed.append(job)
            else:
                kept.append(job)
        self._jobs = kept
        return removed

    def expired(
        self, ready: list[frozenset[str]], limit_s: float, now: float | None = None
    ) -> list[Job]:
        """Take out the jobs that no ready worker (of ``ready``, their tags)
        has matched for ``limit_s``: each job notes when it was first seen
        unmatched, and forgets it once a match is seen."""
        now = time.monotonic() if now is None else now

        def expired(job: Job) -> bool:
            if any(job.tags <= tags for tags in ready):
                job.unplaceable_since = None
            elif job.unplaceable_since is None:
                job.unplaceable_since = now
            since = job.unplaceable_since
            return since is not None and now - since >= limit_s

        return self.remove_where(expired)


class LeastLoaded:
    """For one pump of the queue: the least-loaded of ``links`` (tasks held
    over slots; the first on a tie) with room for a job and its tags. The
    room of each link is read once; a job without tags takes the top of a
    heap (no scan of every link for every job), one with tags a scan."""

    def __init__(self, links: list[Link]) -> None:
        self._room = {link: link.free for link in links}
        self.room = sum(max(free, 0) for free in self._room.values())
        self._heap = [
            (_load(link), i, link)
            for i, link in enumerate(links)
            if self._room[link] > 0
        ]
        heapq.heapify(self._heap)

    def choose(self, job: Job) -> Link | None:
        """The link for ``job`` (which the caller sends there at once)."""
        if job.tags:
            fits = [
                k for k, n in self._room.items() if n > 0 and job.tags <= k.info.tags
            ]
            link = min(fits, key=_load, default=None)
        else:
            link = self._top()
        if link is not None:
            self._room[link] -= 1
            self.room -= 1
        return link

    def _top(self) -> Link | None:
        heap = self._heap
        while heap:
            load, i, link = heap[0]
            if self._room[link] <= 0:
                heapq.heappop(heap)
            elif load != _load(link):  # (a tagged job went there since)
                heapq.heapreplace(heap, (_load(link), i, link))
            else:  # its load once the job is sent there:
                after = (len(link.in_flight) + 1) / link.slots
                heapq.heapreplace(heap, (after, i, link))
                return link
        return None


def _load(link: Link) -> float:
    return len(link.in_flight) / link.slots
