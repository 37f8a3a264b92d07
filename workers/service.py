"""The Worker gRPC service: runs the tasks a dispatcher streams to it.

One :class:`WorkerService` per worker process; each ``Run`` call is one
dispatcher connection, a stream of task batches in and result batches out
(every result ready at the moment of a write goes in one message).
Coroutine functions run on the loop; plain functions in a pool of
``concurrency`` threads. The service owns those threads and every task
it started; a stream that breaks cancels its own tasks. While draining it
refuses new tasks with a ``REJECTED`` failure, which the dispatcher sends
elsewhere.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpc import aio

from workers import tasks, worker_pb2, worker_pb2_grpc
from workers.outbox import Outbox
from workers.worker_pb2 import Failure, Result, ResultBatch, Task, TaskBatch


class WorkerService(worker_pb2_grpc.WorkerServicer):
    """Runs tasks, at most ``concurrency`` at once per the dispatcher's promise.

    :param concurrency: threads for plain functions; the capacity advertised.
    :param on_change: called (on the loop) whenever a counter changes.
    """

    def __init__(self, concurrency: int, on_change: Callable[[], None]) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix="task")
        self._on_change = on_change
        self._active: set[asyncio.Task[Result]] = set()
        self._streams: set[Outbox[Result]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.done = 0
        self.failed = 0

    @property
    def running(self) -> int:
        """Tasks under way now."""
        return len(self._active)

    async def wait_idle(self) -> None:
        """Return once no task is under way."""
        await self._idle.wait()

    def end_streams(self) -> None:
        """End every Run stream cleanly (once drained), so that stopping the
        server cancels nothing."""
        for outbox in self._streams:
            outbox.close()

    def close(self) -> None:
        """Stop the task threads (those running finish on their own)."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def Run(
        self,
        request_iterator: AsyncIterator[TaskBatch],
        context: aio.ServicerContext[TaskBatch, ResultBatch],
    ) -> None:
        outbox: Outbox[Result] = Outbox()
        stream: dict[int, asyncio.Task[Result]] = {}
        reader = asyncio.create_task(self._read(request_iterator, stream, outbox))
        self._streams.add(outbox)
        try:
            async for results in outbox.batches():
                await context.write(ResultBatch(results=results))
        finally:
            self._streams.discard(outbox)
            reader.cancel()
            for task in stream.values():
                task.cancel()

    async def _read(
        self,
        requests: AsyncIterator[TaskBatch],
        stream: dict[int, asyncio.Task[Result]],
        outbox: Outbox[Result],
    ) -> None:
        async for batch in requests:
            for task_id in batch.cancel:
                if (running := stream.get(task_id)) is not None:
                    running.cancel()
            for task in batch.tasks:
                if task.id in stream:
                    outbox.put(_failed(task.id, _reused(task.id)))
                    continue
                self._start(task, stream, outbox)
        while stream:  # the dispatcher closed its side: finish, then end
            await asyncio.wait(list(stream.values()))
        outbox.close()

    def _start(
        self,
        task: Task,
        stream: dict[int, asyncio.Task[Result]],
        outbox: Outbox[Result],
    ) -> None:
        if self.draining:
            failure = Failure(
                type="workers.Draining",
                message="the worker is draining",
                code=Failure.REJECTED,
            )
            outbox.put(_failed(task.id, failure))
            return
        job = asyncio.create_task(self._execute(task))
        stream[task.id] = job
        self._active.add(job)
        self._idle.clear()
        self._on_change()

        def finished(job: asyncio.Task[Result]) -> None:
            stream.pop(task.id, None)
            self._active.discard(job)
            if not self._active:
                self._idle.set()
            if job.cancelled():
                cancelled = Failure(
                    type="asyncio.CancelledError",
                    message="the task was cancelled",
                    code=Failure.CANCELLED,
                )
                outbox.put(_failed(task.id, cancelled))
            else:
                result = job.result()
                self.done += 1
                self.failed += result.HasField("failure")
                outbox.put(result)
            self._on_change()

        job.add_done_callback(finished)

    async def _execute(self, task: Task) -> Result:
        try:
            fn = tasks.resolve(task.function)
            args, kwargs = tasks.load_call(task.args)
        except tasks.BadTask as exc:
            return _failed(task.id, tasks.failure_of(exc, Failure.BAD_REQUEST))
        try:
            async with asyncio.timeout(task.timeout_s or None) as deadline:
                value = await self._call(fn, args, kwargs)
            return Result(id=task.id, value=tasks.dump_value(value))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a task's SystemExit must not end the worker
            if deadline.expired():
                timed_out = TimeoutError(f"the task ran over its {task.timeout_s:g} s")
                return _failed(task.id, tasks.failure_of(timed_out, Failure.TIMED_OUT))
            return _failed(task.id, tasks.failure_of(exc))

    async def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._threads, functools.partial(fn, *args, **kwargs)
        )


def _failed(task_id: int, failure: worker_pb2.Failure) -> Result:
    return Result(id=task_id, failure=failure)


def _reused(task_id: int) -> Failure:
    return Failure(
        type="workers.TaskIdReused",
        message=f"task id {task_id} is already in flight on this stream",
        code=Failure.BAD_REQUEST,
    )
