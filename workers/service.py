"""The Worker gRPC service: runs the tasks a dispatcher streams to it.

One :class:`WorkerService` per worker process; each ``Run`` call is one
dispatcher connection, a stream of task batches in and result batches out
(every result ready at the moment of a write goes in one message).

Coroutine functions run on the loop as tasks. Plain functions go to
``concurrency`` slot threads that each take the next task from one queue,
unpickle its arguments, call it, pickle the outcome and hand the finished
result back to the loop: no asyncio future per task, so a no-op task costs
tens of microseconds here, not hundreds. A thread cannot be interrupted: a
plain task cancelled or timed out while running is answered at once, and
its thread is free again when the call returns.

The service owns its slot threads and every task it started; a stream that
breaks drops its tasks' answers. While draining it refuses new tasks with
an UNAVAILABLE failure, which the dispatcher sends elsewhere. A task that
cannot be run as sent is answered alone with its precise status (see
``proto/workers/worker.proto``); its stream and the other tasks go on.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from workers import tasks, worker_pb2_grpc
from workers.outbox import Outbox
from workers.worker_pb2 import Failure, Result, ResultBatch, Task, TaskBatch


@dataclass(eq=False)
class _Stream:
    """One Run call: its outbox and the tasks it has not been answered."""

    outbox: Outbox[Result] = field(default_factory=Outbox)
    entries: dict[int, _Entry] = field(default_factory=dict)
    emptied: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False, slots=True)
class _Entry:
    """A task this worker has accepted and not yet answered."""

    task: Task
    stream: _Stream
    job: asyncio.Task[Result] | None = None  # a coroutine function's run
    timer: asyncio.TimerHandle | None = None
    answered: bool = False


_Plain = tuple[_Entry, Callable[..., Any]]


class WorkerService(worker_pb2_grpc.WorkerServicer):
    """Runs tasks, at most ``concurrency`` plain ones at once.

    Create it on the loop that serves it.

    :param concurrency: slot threads for plain functions.
    :param on_change: called (on the loop) whenever a counter changes.
    :param max_args_bytes: the largest pickled arguments a task may carry.
    """

    def __init__(
        self,
        concurrency: int,
        on_change: Callable[[], None],
        *,
        max_args_bytes: int = tasks.MAX_ARGS_BYTES,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if max_args_bytes < 0:
            raise ValueError(f"max_args_bytes must be 0 or more, got {max_args_bytes}")
        self._max_args_bytes = max_args_bytes
        self._loop = asyncio.get_running_loop()
        self._on_change = on_change
        self._plain: queue.SimpleQueue[_Plain | None] = queue.SimpleQueue()
        self._slots = [
            threading.Thread(target=self._slot, name=f"task-{i}", daemon=True)
            for i in range(concurrency)
        ]
        for slot in self._slots:
            slot.start()
        self._streams: set[Outbox[Result]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.running = 0
        self.done = 0
        self.failed = 0

    async def wait_idle(self) -> None:
        """Return once no task is under way."""
        await self._idle.wait()

    def end_streams(self) -> None:
        """End every Run stream cleanly (once drained), so that stopping the
        server cancels nothing."""
        for outbox in self._streams:
            outbox.close()

    def close(self) -> None:
        """Let the slot threads end once their current task returns."""
        for _ in self._slots:
            self._plain.put(None)

    async def Run(
        self,
        request_iterator: AsyncIterator[TaskBatch],
        context: aio.ServicerContext[TaskBatch, ResultBatch],
    ) -> None:
        stream = _Stream()
        reader = asyncio.create_task(self._read(request_iterator, stream))
        self._streams.add(stream.outbox)
        try:
            async for results in stream.outbox.batches():
                await context.write(ResultBatch(results=results))
        finally:
            self._streams.discard(stream.outbox)
            reader.cancel()
            for entry in list(stream.entries.values()):  # nobody to answer now
                self._answer(entry, None)

    async def _read(self, requests: AsyncIterator[TaskBatch], stream: _Stream) -> None:
        async for batch in requests:
            for task_id in batch.cancel:
                if (entry := stream.entries.get(task_id)) is not None:
                    self._cancel(entry)
            for task in batch.tasks:
                if task.id in stream.entries:
                    stream.outbox.put(_failed(task.id, tasks.id_reused(task.id)))
                else:
                    self._start(_Entry(task, stream))
        while stream.entries:  # the dispatcher closed its side: finish, then end
            stream.emptied.clear()
            await stream.emptied.wait()
        stream.outbox.close()

    # -- running ------------------------------------------------------------

    def _start(self, entry: _Entry) -> None:
        task = entry.task
        if self.draining:
            entry.stream.outbox.put(_failed(task.id, tasks.rejected()))
            return
        entry.stream.entries[task.id] = entry
        self.running += 1
        self._idle.clear()
        self._on_change()
        try:
            tasks.check_timeout(task)
            fn = tasks.resolve(task.function)
        except tasks.BadTask as exc:
            self._answer(entry, _failed(task.id, tasks.failure_of(exc, remote=False)))
            return
        if task.timeout_s > 0:
            entry.timer = self._loop.call_later(task.timeout_s, self._time_out, entry)
        if inspect.iscoroutinefunction(fn):
            run = _run_coroutine(fn, task, self._max_args_bytes)
            entry.job = asyncio.create_task(run)
            entry.job.add_done_callback(lambda job: self._coroutine_done(entry, job))
        else:
            self._plain.put((entry, fn))

    def _slot(self) -> None:
        """A slot thread: run plain tasks one after another."""
        while (item := self._plain.get()) is not None:
            entry, fn = item
            if entry.answered:
                continue  # cancelled or timed out before it started
            result = _run_plain(fn, entry.task, self._max_args_bytes)
            self._loop.call_soon_threadsafe(self._answer, entry, result)

    def _coroutine_done(self, entry: _Entry, job: asyncio.Task[Result]) -> None:
        if not job.cancelled():
            self._answer(entry, job.result())

    def _cancel(self, entry: _Entry) -> None:
        if entry.job is not None:
            entry.job.cancel()
        self._answer(entry, _failed(entry.task.id, tasks.cancelled()))

    def _time_out(self, entry: _Entry) -> None:
        if entry.job is not None:
            entry.job.cancel()
        timeout = TimeoutError(f"the task ran over its {entry.task.timeout_s:g} s")
        failure = tasks.failure_of(timeout, grpc.StatusCode.DEADLINE_EXCEEDED)
        self._answer(entry, _failed(entry.task.id, failure))

    def _answer(self, entry: _Entry, result: Result | None) -> None:
        """Settle a task once: send ``result`` (None: nobody to send it to)."""
        if entry.answered:
            return
        entry.answered = True
        if entry.timer is not None:
            entry.timer.cancel()
        stream = entry.stream
        del stream.entries[entry.task.id]
        self.running -= 1
        if result is not None:
            self.done += 1
            self.failed += result.HasField("failure")
            stream.outbox.put(result)
        if not stream.entries:
            stream.emptied.set()
        if not self.running:
            self._idle.set()
        self._on_change()


async def _run_coroutine(
    fn: Callable[..., Any], task: Task, max_args_bytes: int
) -> Result:
    try:
        args, kwargs = tasks.load_call(task.args, max_args_bytes)
    except tasks.BadTask as exc:
        return _failed(task.id, tasks.failure_of(exc, remote=False))
    try:
        value = await fn(*args, **kwargs)
        return Result(id=task.id, value=tasks.dump_value(value))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # a task's SystemExit must not end the worker
        return _failed(task.id, tasks.failure_of(exc))


def _run_plain(fn: Callable[..., Any], task: Task, max_args_bytes: int) -> Result:
    try:
        args, kwargs = tasks.load_call(task.args, max_args_bytes)
    except tasks.BadTask as exc:
        return _failed(task.id, tasks.failure_of(exc, remote=False))
    try:
        return Result(id=task.id, value=tasks.dump_value(fn(*args, **kwargs)))
    except BaseException as exc:  # a task's SystemExit must not end the worker
        return _failed(task.id, tasks.failure_of(exc))


def _failed(task_id: int, failure: Failure) -> Result:
    return Result(id=task_id, failure=failure)
