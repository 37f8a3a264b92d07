"""The dispatcher's queue: the tasks no worker has, bounded, and served
fairly between clients.

Each client (a job's ``owner``) has its own line, and the lines are served
in turn, one job each: a client that sends one task while another has ten
thousand queued waits for one task, not for the ten thousand. Jobs a lost
worker gave back (or a steal took back) wait in a line of their own, in
their order, served before any client's. At most ``max_queued`` wait in
all: :attr:`TaskQueue.room` is clear while the queue is full, and the
client streams stop reading until it is set again (``docs/architecture.md``:
every queue is bounded). A job cancelled while it waits is counted out at once and
skipped when :meth:`TaskQueue.place` or :meth:`TaskQueue.remove_where`
meets it. A job no ready worker matches expires after a bound
(:meth:`TaskQueue.expired`). Where each job goes is
:class:`~pool.dispatcher.choosing.Chooser`'s choice. Owned by
:class:`~pool.dispatcher.placement.Router`, on the dispatcher's loop; no
I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

from pool.dispatcher.choosing import Chooser
from pool.dispatcher.jobs import Job, Owner

MAX_QUEUED: Final = 100_000  # the default bound


class TaskQueue:
    """Jobs waiting for a worker; see the module docstring.

    :raises ValueError: for a ``max_queued`` below 1.
    """

    def __init__(self, max_queued: int) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.max_queued = max_queued
        self._front: deque[Job] = deque()  # given back: served first
        self._lines: dict[Owner, deque[Job]] = {}  # each client's new jobs
        self._turns: deque[deque[Job]] = deque()  # the lines with jobs, in turn
        self.waiting = 0  # jobs in the lines not finished
        self.room = asyncio.Event()  # set while fewer than max_queued wait
        self.room.set()

    def __bool__(self) -> bool:
        return bool(self._front or self._turns)

    def push(self, job: Job, *, front: bool = False) -> None:
        """Queue ``job`` at the back of its client's line, or (``front``) at
        the front of the line of jobs given back."""
        if front:
            self._front.appendleft(job)
        else:
            self._line(job.owner).append(job)
        self.waiting += 1
        if self.waiting >= self.max_queued:
            self.room.clear()

    def leave(self) -> None:
        """A queued job was answered where it stands (cancelled)."""
        self.waiting -= 1
        if self.waiting < self.max_queued:
            self.room.set()

    def place(self, chooser: Chooser) -> None:
        """Hand jobs, in turn, to the link ``chooser`` picks for each, while
        any has room; a job with none keeps its place in its line."""
        kept: list[tuple[deque[Job], Job]] = []
        for line, job in self._in_turn(chooser):
            link = chooser.choose(job)
            if link is None:
                kept.append((line, job))
                continue
            self.leave()
            link.send(job)
        for line, job in reversed(kept):
            if line is not self._front and not line:
                self._lines[job.owner] = line
                self._turns.append(line)
            line.appendleft(job)

    def _in_turn(self, chooser: Chooser) -> Iterator[tuple[deque[Job], Job]]:
        """The unfinished jobs, each taken out of its line, while ``chooser``
        has room: those given back, then one of each client's in turn."""
        front, turns = self._front, self._turns
        while front and chooser.room > 0:
            job = front.popleft()
            if not job.finished:  # (else cancelled while it waited: counted out)
                yield front, job
        while turns and chooser.room > 0:
            line = turns[0]
            job = line.popleft()
            if not line:
                turns.popleft()
                del self._lines[job.owner]
            elif len(turns) > 1:
                turns.rotate(-1)
            if not job.finished:
                yield line, job

    def _line(self, owner: Owner) -> deque[Job]:
        line = self._lines.get(owner)
        if line is None:
            line = self._lines[owner] = deque()
            self._turns.append(line)
        return line

    def remove_where(self, reject: Callable[[Job], bool]) -> list[Job]:
        """Take out, in order (those given back first, then each client's),
        the waiting jobs ``reject`` says go; the rest keep their places."""
        removed: list[Job] = []
        for line in (self._front, *self._turns):
            kept: list[Job] = []
            for job in line:
                if not job.finished:  # (else counted out when cancelled)
                    (removed if reject(job) else kept).append(job)
            line.clear()
            line.extend(kept)
        for _ in removed:
            self.leave()
        self._lines = {owner: line for owner, line in self._lines.items() if line}
        self._turns = deque(self._lines.values())
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
