"""The dispatcher's queue: the tasks no worker has, in order, bounded.

New jobs join at the back; those a lost worker gave back, at the front, in
their order. At most ``max_queued`` wait: :attr:`TaskQueue.room` is clear
while the queue is full, and the client streams stop reading until it is
set again (DESIGN.md, Concurrency). A job cancelled while it waits is
counted out at once and skipped when :meth:`TaskQueue.place` or
:meth:`TaskQueue.remove_where` meets it. A job no ready worker matches
expires after a bound (:meth:`TaskQueue.expired`). Owned by
:class:`~pool.dispatcher.placement.Router`, on the dispatcher's loop; no
I/O.
"""

from __future__ import annotations

import asyncio
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

    def place(self, free: int, choose: Callable[[Job], Link | None]) -> None:
        """Hand up to ``free`` jobs, in order, to the link ``choose`` picks
        for each; a job with none keeps its place."""
        skipped: deque[Job] = deque()
        while self._jobs and free > 0:
            job = self._jobs.popleft()
            if job.finished:
                continue  # cancelled while it waited (counted out then)
            link = choose(job)
            if link is None:
                skipped.append(job)
                continue
            self.leave()
            link.send(job)
            free -= 1
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
