"""The Worker gRPC service: runs the tasks a dispatcher streams to it.

One :class:`WorkerService` per worker process; each ``Run`` call is one
dispatcher connection, a stream of task batches in and result batches out.
A task's life here::

    read ──> held (its callable found) ──> started by a slot thread ──> run
         ──> answered (exactly once: result, failure, withdrawal, timeout)

A plain task is *held* until a slot thread is free for it (the highest
priority first, then in the order tasks came): the dispatcher sends only
what hides one round trip ahead of the slots. A held task is still the
dispatcher's, which may withdraw it (to cancel it, or to move it to a free
worker). A slot thread *starts* it, deciding under one lock against a
withdrawal. Starts go back batched with results, and the client's future
turns RUNNING then. A coroutine function starts at once, on the loop. How
tasks end early (cancels, time limits, stops) and how the worker retires
or ends is :mod:`workers.ending`.

Each stream owns an :class:`asyncio.TaskGroup`: its reader, its coroutine
tasks and the imports it waits for; a hang-up cancels it. Plain functions
go to ``concurrency`` slot threads (:mod:`workers.slots`). A plain task
answered while its thread runs on (its dispatcher hung up) counts as
*stuck* until the call returns, and the advertised capacity shrinks; with
every thread stuck the status is ``"stuck"``, the held tasks are handed
back (UNAVAILABLE: sent elsewhere) and the supervisor replaces the worker
after its grace. Imports, shipped functions' unpickling and large
coroutine arguments run in daemon threads, never on the loop. A task that
cannot be run as sent is answered alone with its precise status
(``proto/workers/protocol/worker.proto``); its stream goes on.

Several dispatchers may each hold a stream (a pool with a dispatcher on
each of several hosts). The slots are shared in the order tasks come, and
each stream is told, when it changes, how many tasks the worker holds for
the others (``ResultBatch.others``): a dispatcher counts them in the
worker's load, so that it does not promise a slot another one filled.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from grpc import aio

from workers import imports
from workers import running as tasks
from workers.alarm import Alarm
from workers.common.offload import Offload
from workers.ending import ENDED_EXIT, EndingEarly
from workers.limits import Limits
from workers.protocol import codec, worker_pb2_grpc
from workers.protocol.errors import BadTask
from workers.protocol.owners import DataOwner
from workers.protocol.stream import WITHDRAWS
from workers.protocol.worker_pb2 import Result, ResultBatch, Task, TaskBatch
from workers.retrying import retrying
from workers.running import Entry, PaceMeter, Phase, Stream, failed, timed
from workers.slots import SlotThreads

_ALL_STUCK: Final = "every task thread is held by a task whose dispatcher hung up on it"
__all__ = ["ENDED_EXIT", "WorkerService"]


def _check(concurrency: int, max_args_bytes: int) -> None:
    """:raises ValueError: for a bad argument of :class:`WorkerService`."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if max_args_bytes < 0:
        raise ValueError(f"max_args_bytes must be 0 or more, got {max_args_bytes}")


Requests = AsyncIterator[TaskBatch]
Context = aio.ServicerContext[TaskBatch, ResultBatch]


class WorkerService(EndingEarly, worker_pb2_grpc.WorkerServicer):
    """Runs tasks, at most ``concurrency`` plain ones at once (create it on
    the loop that serves it).

    :param concurrency: slot threads for plain functions.
    :param on_change: called (on the loop) whenever a counter changes.
    :param max_args_bytes: the largest arguments a task's message may carry.
    :param limits: when it retires (:mod:`workers.limits`, :attr:`retiring`).
    :param writer: it writes large values into its clients' shared memory
        (None: into the message).
    :param alarm: the process's backstop for time limits (:mod:`workers.alarm`;
        a worker process's own: not in a test's process).
    """

    def __init__(
        self,
        concurrency: int,
        on_change: Callable[[], None],
        *,
        max_args_bytes: int = codec.MAX_ARGS_BYTES,
        limits: Limits | None = None,
        writer: DataOwner | None = None,
        alarm: Alarm | None = None,
    ) -> None:
        _check(concurrency, max_args_bytes)
        self._alarm = alarm
        self.concurrency, self._max_args_bytes = concurrency, max_args_bytes
        self._writer, self.limits = writer, limits or Limits()
        self.retiring = asyncio.Event()  # (set too when it ends)
        self.ending: str | None = None  # why it ends now (see end)
        self._loop = asyncio.get_running_loop()
        self._on_change = on_change
        self._offload = Offload("offload")  # imports, large arguments
        self._slots = self._slot_threads(concurrency, max_args_bytes, writer)
        self._claim = self._slots.claim  # (the loop decides against the threads)
        self._streams: set[Stream] = set()
        self._sharing = False  # a second stream came: tell each the others'
        self._idle = asyncio.Event()
        self._idle.set()  # (nothing runs yet)
        self.draining = self._streams_ended = False  # (end_streams was called)
        self.unanswered = 0  # tasks taken and not answered
        self.active = 0  # of those, the ones started (reported so)
        self.stuck = 0  # slot threads still running a task already answered
        self.stuck_changed = asyncio.Event()  # (capacity follows: published)
        self.done = self.failed = 0
        self.pace = PaceMeter()  # how long plain tasks run

    def _slot_threads(
        self, concurrency: int, max_args_bytes: int, writer: DataOwner | None
    ) -> SlotThreads:
        run = functools.partial(
            tasks.run_plain, max_args_bytes=max_args_bytes, writer=writer
        )
        return SlotThreads(
            concurrency,
            self._loop,
            self.limits,
            take_news=self._take_news,
            run=run,
            refuse=self._refuse_held,
            retire=self.retire,
            alarm=self._alarm,
        )

    @property
    def free_threads(self) -> int:
        """Slot threads not held by a task that was already answered."""
        return self.concurrency - self.stuck

    async def wait_idle(self) -> None:
        """Return once every task taken is answered."""
        await self._idle.wait()

    def end_streams(self) -> None:
        """End every Run stream cleanly (once drained), and any opened from
        now on at once, so that stopping the server cancels nothing."""
        self._streams_ended = True
        for stream in self._streams:
            stream.outbox.close()

    async def aclose(self) -> None:
        """Let the slot threads end once their current task returns, and
        end the offload threads (bounded: an import may hang)."""
        self._slots.close()
        await self._offload.aclose()

    async def Run(self, request_iterator: Requests, context: Context) -> None:
        stream = Stream()
        self._streams.add(stream)
        self._sharing = self._sharing or len(self._streams) > 1
        stream.outbox.others(self.unanswered)  # (another dispatcher's, if any)
        if (
            self._streams_ended
        ):  # (a dispatcher reconnecting to a worker on its way out)
            stream.outbox.close()

        async def write(batch: ResultBatch) -> None:
            if batch.results:
                batch.pace_us = self.pace.typical_us
            await context.write(batch)

        try:
            async with asyncio.TaskGroup() as group:
                stream.group = group
                # Ended (drained), what the dispatcher sends from then on
                # finds the stream closed, and it sends the task elsewhere.
                await stream.serve(self._read(request_iterator, stream), write)
        finally:
            self._streams.discard(stream)
            for entry in list(stream.entries.values()):  # nobody to answer now
                self._answer(entry, None)

    async def _read(self, requests: AsyncIterator[TaskBatch], stream: Stream) -> None:
        async for batch in requests:
            for task in batch.tasks:
                self._accept(stream, task)
            for kind in WITHDRAWS:  # after the tasks: a batch may hold both
                for task_id in getattr(batch, kind):
                    if (entry := stream.entries.get(task_id)) is not None:
                        self._cancel(entry, kind)
            await stream.wait_for_room()
        stream.end_of_input()  # the dispatcher closed its side: finish, then end

    # -- taking and holding ----------------------------------------------------

    @property
    def takes_tasks(self) -> bool:
        return not self.draining and self.free_threads > 0

    @property
    def _busy_reason(self) -> str:
        return "it is draining" if self.draining else _ALL_STUCK

    def _accept(self, stream: Stream, task: Task) -> None:
        if (code := stream.admit(task)) is None:
            return
        try:  # malformed is malformed, whatever this worker's state
            codec.check_timeout(task)
        except BadTask as exc:
            stream.refuse(task.id, codec.failure_of(exc))
            return
        if not self.takes_tasks:
            stream.refuse(task.id, codec.rejected(self._busy_reason))
            return
        entry = Entry(task, stream, code)
        stream.entries[task.id] = entry
        self.unanswered += 1
        self._share(stream)
        self._idle.clear()
        if (fn := imports.found(task)) is None:
            self._find(entry)
        else:
            self._launch(entry, fn)
        self._on_change()

    def _share(self, changed: Stream) -> None:
        """``changed`` took or settled a task: tell each other stream (another
        dispatcher) how many this worker now holds for the rest."""
        if self._sharing:  # (once a second stream came: it may be gone again)
            for stream in self._streams:
                if stream is not changed:
                    stream.outbox.others(self.unanswered - len(stream.entries))

    def _find(self, entry: Entry) -> None:
        """Find a held task's callable in a thread (an import may take long,
        and other tasks run meanwhile), once for all the stream's tasks that
        name it."""
        stream, task = entry.stream, entry.task
        key = (task.function, task.digest)
        if (waiting := stream.finding.get(key)) is not None:
            waiting.append(entry)
            return
        stream.finding[key] = [entry]
        assert stream.group is not None
        stream.group.create_task(self._find_for(stream, key, task, entry.code))

    async def _find_for(
        self, stream: Stream, key: tuple[str, bytes], task: Task, code: bytes
    ) -> None:
        try:
            fn = await self._offload.run(imports.find, task, code)
        except BadTask as exc:
            for entry in stream.finding.pop(key):
                self._answer(entry, failed(entry.task.id, codec.failure_of(exc)))
            return
        for entry in stream.finding.pop(key):
            if not entry.answered:
                self._launch(entry, fn)

    def _launch(self, entry: Entry, fn: Callable[..., Any]) -> None:
        """Start a coroutine task; hand a plain one to the slot threads."""
        task = entry.task
        fn = retrying(fn, task)
        if task.chunk:
            fn = functools.partial(codec.run_chunk, fn)
        coroutine = not task.chunk and inspect.iscoroutinefunction(fn)
        entry.kind = "coroutine" if coroutine else "plain"
        entry.fn, entry.code = fn, b""
        if coroutine:
            with self._claim:
                allowed = self.limits.take_start()
            if not allowed:
                self._refuse_held(entry)
                return
            if self.limits.why is not None:
                self.retire()
            self._started(entry)
            self._time_limit(entry)
            assert entry.stream.group is not None
            entry.job = entry.stream.group.create_task(self._run_coroutine(entry, fn))
        elif self.free_threads == 0:  # every thread is stuck: let another worker
            self._answer(entry, failed(task.id, codec.rejected(_ALL_STUCK)))
        else:
            self._slots.put(entry)

    async def _run_coroutine(self, entry: Entry, fn: Callable[..., Any]) -> None:
        started, limit = time.perf_counter(), self._max_args_bytes
        result = await tasks.run_coroutine(
            entry.task, fn, self._offload, limit, self._writer
        )
        elapsed = time.perf_counter() - started
        self._answer(entry, timed(result, self.concurrency, elapsed))

    def _take_news(self) -> None:
        """Report the starts, then settle the ends, that the threads posted."""
        with self._claim:
            starts, ended = self._slots.news.take()
        for entry in starts:
            if not entry.answered:
                self._started(entry)
                self._time_limit(entry)
        for entry, result, elapsed in ended:
            self._plain_done(entry, result, elapsed)

    def _started(self, entry: Entry) -> None:
        entry.started = True
        self.active += 1
        entry.stream.outbox.start(entry.task.id)
        self._on_change()

    def _time_limit(self, entry: Entry) -> None:
        """A started task's time limit runs from now (a coroutine's under
        the alarm too, which a plain task's slot thread holds itself)."""
        if (limit := entry.task.timeout_s) > 0:
            entry.timer = self._loop.call_later(limit, self._time_out, entry)
            if entry.kind == "coroutine" and self._alarm is not None:
                self._alarm.hold(id(entry), limit)

    def _plain_done(self, entry: Entry, result: Result, elapsed: float) -> None:
        self.pace.note(elapsed)
        # (Its thread is done with it: only the loop changes a stuck task.)
        if entry.unstick():  # its answer went long ago; the thread is free again
            self.stuck -= 1
            self.stuck_changed.set()
            self._on_change()
        else:
            self._answer(entry, result)

    def _answer(
        self, entry: Entry, result: Result | None, *, withdraw: bool = False
    ) -> None:
        """Settle a task once: send ``result`` (None: nobody to send it to);
        with ``withdraw``, only if no slot thread has started it."""
        if entry.kind == "plain":
            with self._claim:  # decide against a slot thread taking it now
                if not entry.settle(withdraw=withdraw):
                    return
        elif not entry.settle(withdraw=withdraw):
            return
        if entry.timer is not None:
            entry.timer.cancel()
            if entry.kind == "coroutine" and self._alarm is not None:
                self._alarm.release(id(entry))
        self.unanswered -= 1
        self.active -= entry.started
        if result is not None:
            self.done += 1
            self.failed += result.HasField("failure")
        entry.stream.answer(entry.task.id, result)
        self._share(entry.stream)
        if entry.started and self.limits.after_task():
            self.retire()
        if not self.unanswered:
            self._idle.set()
        if entry.phase is Phase.STUCK:
            self.stuck += 1
            self.stuck_changed.set()
            if self.free_threads == 0:
                self._hand_back(_ALL_STUCK)
        self._on_change()
