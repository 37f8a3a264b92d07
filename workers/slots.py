"""Where a worker's plain tasks start and run: :class:`SlotThreads`.

``concurrency`` daemon threads take the plain tasks the service puts in,
the highest priority first (``Task.priority``), in the order they came
within one. A thread *starts* a task under the claim lock
(:attr:`SlotThreads.claim`), which the loop also holds to decide a
withdrawal, so a task is either withdrawn or started, never both; then it
runs the call outside the lock. What the threads start and finish they
post as :class:`News`, and the loop takes it all at once. Owned by
:class:`workers.service.WorkerService`, which ends the threads with
:meth:`SlotThreads.close` (each once its current call returns: a thread
cannot be interrupted).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Final, cast

from workers.alarm import Alarm
from workers.limits import Limits
from workers.protocol.worker_pb2 import Result
from workers.running import Entry, timed

Waiting = tuple[int, int, Entry]  # (-priority, order, entry): least first
_BEST: Final = object()  # (take the best of the heap)
_CLOSE: Final = object()  # (the thread ends)


class News:
    """What the slot threads tell their loop: the tasks they started and
    those that ended (with its result and run time). The caller holds its
    claim lock around every method but :meth:`call`; the loop is called
    once (``take_news``) for all that piles up before it takes it, so a busy
    loop is woken once for many."""

    def __init__(self, loop: asyncio.AbstractEventLoop, take_news: Callable[[], None]):
        self._loop, self._take_news = loop, take_news
        self.starts: list[Entry] = []
        self.ended: list[tuple[Entry, Result, float]] = []
        self._called = False

    def due(self) -> bool:
        """Whether this post must call the loop (no call is pending)."""
        due, self._called = not self._called, True
        return due

    def call(self) -> None:
        """Call the loop to take the news (any thread; outside the lock)."""
        with contextlib.suppress(RuntimeError):  # the loop closed: exiting
            self._loop.call_soon_threadsafe(self._take_news)

    def take(self) -> tuple[list[Entry], list[tuple[Entry, Result, float]]]:
        """Everything posted since the last take; the next post calls again."""
        news = self.starts, self.ended
        self.starts, self.ended, self._called = [], [], False
        return news


class SlotThreads:
    """The threads that start and run plain tasks; see the module docstring.

    :param take_news: called on ``loop`` to take :attr:`news`.
    :param run: runs a started task's call (in its thread): its answer.
    :param refuse: called on the loop with a task that may not start here
        (``limits`` says the worker retires).
    :param retire: called on the loop once a start reached ``limits``.
    :param alarm: the process's backstop for time limits, held while a task
        with one runs (:mod:`workers.alarm`); None in a test's process.
    """

    def __init__(
        self,
        concurrency: int,
        loop: asyncio.AbstractEventLoop,
        limits: Limits,
        *,
        take_news: Callable[[], None],
        run: Callable[[Entry], Result],
        refuse: Callable[[Entry], None],
        retire: Callable[[], None],
        alarm: Alarm | None = None,
    ) -> None:
        self.claim = threading.Lock()  # a thread starting a task vs. the loop
        self.news = News(loop, take_news)  # (under the claim lock)
        self._loop, self._limits = loop, limits
        self._run, self._refuse, self._retire = run, refuse, retire
        self._alarm = alarm
        # What a thread takes next, in order: an entry (with the order it
        # came in), or (once a task of another priority than 0 came) a token
        # for the best of what waits in the heap (under the claim lock);
        # _CLOSE: a thread is to end.
        self._queue: queue.SimpleQueue[Waiting | object] = queue.SimpleQueue()
        self._waiting: list[Waiting] = []
        self._order = itertools.count()
        self._ordered = False  # a task of another priority came: the heap
        self._threads = [
            threading.Thread(target=self._slot, args=(i,), name=f"task-{i}")
            for i in range(concurrency)
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def put(self, entry: Entry) -> None:
        """Start ``entry`` once a thread is free, after those put before of
        its priority or higher."""
        waiting = (-entry.task.priority, next(self._order), entry)
        if not (self._ordered or entry.task.priority):
            self._queue.put(waiting)  # (the common case: no heap, no lock)
            return
        self._ordered = True
        with self.claim:
            heapq.heappush(self._waiting, waiting)
        self._queue.put(_BEST)

    def _next(self, got: Waiting | object) -> Entry:
        """The entry a thread starts (under the claim lock), given what it
        took: the best waiting, or one put before the heap was needed
        (unless a better one waits there: the heap then keeps it)."""
        if got is _BEST:
            return heapq.heappop(self._waiting)[2]
        came = cast(Waiting, got)
        return heapq.heappushpop(self._waiting, came)[2] if self._waiting else came[2]

    def close(self) -> None:
        """Let each thread end once its current task returns."""
        for _ in self._threads:
            self._queue.put(_CLOSE)

    def _timed_run(self, entry: Entry) -> tuple[Result, float]:
        """Run a started task: its answer, and how long it ran (under the
        alarm, if it has a time limit)."""
        limit, alarm = entry.task.timeout_s, self._alarm
        if limit > 0 and alarm is not None:
            alarm.hold(id(entry), limit)
        started = time.perf_counter()
        try:
            return self._run(entry), time.perf_counter() - started
        finally:
            if limit > 0 and alarm is not None:
                alarm.release(id(entry))

    def _slot(self, index: int) -> None:
        """A slot thread: start and run plain tasks one after another."""
        while (got := self._queue.get()) is not _CLOSE:
            with self.claim:
                entry = self._next(got)
                if entry.answered:
                    continue  # withdrawn, handed back, or its stream ended
                if not self._limits.take_start():  # retiring: not here
                    self._loop.call_soon_threadsafe(self._refuse, entry)
                    continue
                entry.take()  # no withdrawal from now on
                self.news.starts.append(entry)
                call = self.news.due()
            if call:
                self.news.call()
            if self._limits.why is not None:  # (its last start: after its news)
                self._loop.call_soon_threadsafe(self._retire)
            result, elapsed = self._timed_run(entry)
            with self.claim:
                entry.ran()
                self.news.ended.append((entry, timed(result, index, elapsed), elapsed))
                call = self.news.due()
            if call:
                self.news.call()
