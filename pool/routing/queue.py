"""The dispatcher's queue: the tasks no worker has, bounded, by priority,
and served fairly between clients.

Jobs wait by their task's ``priority`` (0 unless a client set one): a job
of a higher priority is placed before any of a lower one. Within one
priority, each client (a job's ``owner``) has its own line, and the lines
are served in turn, one job each: a client that sends one task while
another has ten thousand queued waits for one task, not for the ten
thousand. Jobs a lost worker gave back (or a steal took back) wait in a
line of their own at their priority, in their order, served before any
client's there. A job that no link can take (its tags) keeps its place,
and those after it, lower priorities too, go on to the links that can.

At most ``max_queued`` wait in all: :attr:`TaskQueue.room` is clear while
the queue is full, and the client streams stop reading until it is set
again (``docs/architecture.md``: every queue is bounded). A job cancelled
while it waits is counted out at once (:meth:`TaskQueue.leave`) and
skipped when :meth:`TaskQueue.place` or :meth:`TaskQueue.remove_where`
meets it. A job no ready worker matches expires after a bound
(:meth:`TaskQueue.expired`). Where each job goes is
:class:`~pool.routing.choosing.Chooser`'s choice. Owned by
:class:`~pool.routing.placement.Router`, on the dispatcher's loop; no
I/O.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

from pool.routing.choosing import Chooser
from pool.routing.jobs import Job, Owner

MAX_QUEUED: Final = 100_000  # the default bound


class _Level:
    """The jobs of one priority: those given back, then each client's line,
    served in turn."""

    __slots__ = ("front", "lines", "turns", "waiting")

    def __init__(self) -> None:
        self.front: deque[Job] = deque()  # given back: served first
        self.lines: dict[Owner, deque[Job]] = {}  # each client's new jobs
        self.turns: deque[deque[Job]] = deque()  # the lines with jobs, in turn
        self.waiting = 0  # its jobs not finished

    def __bool__(self) -> bool:
        return bool(self.front or self.turns)

    def line(self, owner: Owner) -> deque[Job]:
        line = self.lines.get(owner)
        if line is None:
            line = self.lines[owner] = deque()
            self.turns.append(line)
        return line

    def in_turn(self, chooser: Chooser) -> Iterator[tuple[deque[Job], Job]]:
        """The unfinished jobs, each taken out of its line, while ``chooser``
        has room: those given back, then one of each client's in turn."""
        front, turns = self.front, self.turns
        while front and chooser.room > 0:
            job = front.popleft()
            if not job.finished:  # (else cancelled while it waited: counted out)
                yield front, job
        while turns and chooser.room > 0:
            line = turns[0]
            job = line.popleft()
            if not line:
                turns.popleft()
                del self.lines[job.owner]
            elif len(turns) > 1:
                turns.rotate(-1)
            if not job.finished:
                yield line, job

    def keep(self, kept: list[tuple[deque[Job], Job]]) -> None:
        """Put back, at the head of their lines, the jobs no link took."""
        for line, job in reversed(kept):
            if line is not self.front and not line:
                self.lines[job.owner] = line
                self.turns.append(line)
            line.appendleft(job)

    def remove_where(self, reject: Callable[[Job], bool]) -> list[Job]:
        removed: list[Job] = []
        for line in (self.front, *self.turns):
            kept: list[Job] = []
            for job in line:
                if not job.finished:  # (else counted out when cancelled)
                    (removed if reject(job) else kept).append(job)
            line.clear()
            line.extend(kept)
        self.lines = {owner: line for owner, line in self.lines.items() if line}
        self.turns = deque(self.lines.values())
        return removed


class TaskQueue:
    """Jobs waiting for a worker; see the module docstring.

    :raises ValueError: for a ``max_queued`` below 1.
    """

    def __init__(self, max_queued: int) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.max_queued = max_queued
        self._levels: dict[int, _Level] = {}
        self._order: list[int] = []  # the priorities with a level, ascending
        self.waiting = 0  # jobs in the lines not finished
        self.room = asyncio.Event()  # set while fewer than max_queued wait
        self.room.set()
        self.lowest = self.highest = 0  # the priorities of the jobs pushed so far

    def __bool__(self) -> bool:
        return any(self._levels.values())

    @property
    def mixed(self) -> bool:
        """Whether jobs of more than one priority have been queued."""
        return self.lowest != self.highest

    def _level(self, priority: int) -> _Level:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level()
            bisect.insort(self._order, priority)
        return level

    def push(self, job: Job, *, front: bool = False) -> None:
        """Queue ``job`` at the back of its client's line at its priority,
        or (``front``) at the front of the line of jobs given back there."""
        priority = job.task.priority
        if not self.lowest <= priority <= self.highest:
            self.lowest, self.highest = (
                min(self.lowest, priority),
                max(self.highest, priority),
            )
        level = self._level(priority)
        if front:
            level.front.appendleft(job)
        else:
            level.line(job.owner).append(job)
        level.waiting += 1
        self.waiting += 1
        if self.waiting >= self.max_queued:
            self.room.clear()

    def leave(self, job: Job) -> None:
        """A queued job left (placed, or answered where it stands)."""
        self._levels[job.task.priority].waiting -= 1
        self.waiting -= 1
        if self.waiting < self.max_queued:
            self.room.set()

    @property
    def top_priority(self) -> int | None:
        """The highest priority that has jobs waiting (None: none wait)."""
        for priority in reversed(self._order):
            if self._levels[priority].waiting:
                return priority
        return None

    def waiting_above(self, priority: int, limit: int) -> list[Job]:
        """Up to ``limit`` of the jobs that wait with a priority higher than
        ``priority``, the highest first."""
        start = bisect.bisect_right(self._order, priority)
        found: list[Job] = []
        for p in reversed(self._order[start:]):
            level = self._levels[p]
            for line in (level.front, *level.turns):
                for job in line:
                    if len(found) == limit:
                        return found
                    if not job.finished:
                        found.append(job)
        return found

    def by_priority(self) -> dict[int, int]:
        """How many jobs wait at each priority that has some."""
        return {p: n for p, level in self._levels.items() if (n := level.waiting)}

    def place(self, chooser: Chooser, floor: float | None = None) -> None:
        """Hand jobs, highest priority first and in turn within one, to the
        link ``chooser`` picks for each, while any has room; a job with
        none keeps its place in its line. With a ``floor`` (tasks of several
        priorities are about: the highest priority that workers hold
        unstarted), no job of a lower priority than one held unstarted is
        sent, those placed now included: it would start first on another
        worker."""
        for priority in reversed(self._order):
            if floor is not None and priority < floor:
                break
            level = self._levels[priority]
            kept: list[tuple[deque[Job], Job]] = []
            placed = False
            for line, job in level.in_turn(chooser):
                link = chooser.choose(job)
                if link is None:
                    kept.append((line, job))
                    continue
                self.leave(job)
                link.send(job)
                placed = True
            level.keep(kept)
            if floor is not None and placed:
                floor = max(floor, priority)
            if chooser.room <= 0:
                break
        self._drop_empty()

    def _drop_empty(self) -> None:
        """Forget the levels of priorities nothing waits at (a client may
        send a new priority with every call)."""
        if len(self._order) > 1:
            for priority in [p for p in self._order if not self._levels[p]]:
                del self._levels[priority]
                self._order.remove(priority)

    def remove_where(self, reject: Callable[[Job], bool]) -> list[Job]:
        """Take out, in order (highest priority first; at each, those given
        back first, then each client's), the waiting jobs ``reject`` says
        go; the rest keep their places."""
        removed: list[Job] = []
        for priority in reversed(self._order):
            removed += self._levels[priority].remove_where(reject)
        for job in removed:
            self.leave(job)
        self._drop_empty()
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
