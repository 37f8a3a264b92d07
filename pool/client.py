"""Clients of a running pool, found by namespace.

:class:`Client` is a :class:`concurrent.futures.Executor`; it runs its own
uvloop loop on a daemon thread, which owns the gRPC channel. Both it and
:class:`AsyncClient` (on the caller's loop) send tasks through one
``SubmitStream`` per client (a :class:`Connection`), many tasks per
message: submissions made while a write is under way go out together in
the next one.

A task is run *at least once*: if its worker dies, the dispatcher runs it
again elsewhere (up to its attempt limit), so a task with side effects
may see them twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import pickle
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Self

import grpc
import uvloop
from grpc import aio

from discovery import paths
from pool import dispatcher_pb2_grpc
from pool.dispatcher_pb2 import Submission, SubmissionBatch
from pool.errors import PoolNotRunning
from workers import auth, tasks
from workers.lifecycle import GRPC_OPTIONS
from workers.worker_pb2 import Result, Task

ADDRESS_FILE = "address"
RECONNECT_S = 30.0  # how long a client waits for a restarted dispatcher
RECONNECT_FIRST_S = 0.05
STOPPED = "the pool stopped"  # the reason when the dispatcher ends a stream

OnResult = Callable[[Result], None]


def locate(namespace: str) -> tuple[str, str]:
    """The dispatcher address and token of the pool serving ``namespace``.

    :raises PoolNotRunning: if no pool serves it.
    """
    directory = paths.namespace_dir(namespace, create=False)
    try:
        address = (directory / ADDRESS_FILE).read_text().strip()
        return address, auth.read_token(namespace)
    except (FileNotFoundError, auth.MissingToken):
        raise PoolNotRunning(namespace) from None


def outcome(result: Result) -> Any:
    """The value a result carries, or raise the exception it carries."""
    if result.HasField("failure"):
        raise tasks.exception_of(result.failure)
    return pickle.loads(result.value)


class Connection:
    """The stream of tasks to a pool's dispatcher, bound to the loop that made it.

    If the stream breaks (the supervisor restarts a dispatcher that died),
    it reconnects, with back-off, for up to ``reconnect_s``, and sends again
    every task still unanswered: the new dispatcher never saw them (so a
    task may run twice; see the module docstring). Past that, or at once
    when the dispatcher ends the stream because the pool stops, those tasks
    fail with :class:`PoolNotRunning`.

    :raises PoolNotRunning: if no pool serves the namespace now.
    """

    def __init__(self, namespace: str, *, reconnect_s: float = RECONNECT_S) -> None:
        locate(namespace)  # fail now, clearly, if there is no pool at all
        self.namespace = namespace
        self._reconnect_s = reconnect_s
        self._pending: dict[int, tuple[Submission, OnResult]] = {}
        self._outgoing: list[Submission] = []
        self._cancels: list[int] = []
        self._cancelled: set[int] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._refused: PoolNotRunning | None = None
        self._runner = asyncio.create_task(self._run())

    def submit(self, submission: Submission, on_result: OnResult) -> None:
        if self._refused is not None:
            raise self._refused
        self._pending[submission.task.id] = (submission, on_result)
        self._outgoing.append(submission)
        self._wake.set()

    def cancel(self, task_id: int) -> None:
        if task_id in self._pending:
            self._cancelled.add(task_id)
            self._cancels.append(task_id)
            self._wake.set()

    async def _run(self) -> None:
        """Keep a stream open while there is work; reconnect when it breaks."""
        lost_at: float | None = None
        delay = RECONNECT_FIRST_S
        while not self._closing:
            if not self._pending and not self._outgoing:
                await self._wake.wait()  # connect (again) only for work
                continue
            reason, served = await self._stream()
            if self._closing or self._refused is not None:
                return
            if reason is STOPPED:  # a clean end: the pool is going away
                self._fail_all(PoolNotRunning(self.namespace, reason))
                continue
            if served:
                lost_at, delay = None, RECONNECT_FIRST_S
            self._resend_pending()
            lost_at = lost_at or time.monotonic()
            if time.monotonic() - lost_at >= self._reconnect_s:
                self._fail_all(PoolNotRunning(self.namespace, reason))
                lost_at = None
                continue
            await asyncio.sleep(delay)  # back-off between attempts to reconnect
            delay = min(delay * 2, 1.0)

    async def _stream(self) -> tuple[str, bool]:
        """Serve one stream until it ends: why it ended, and whether it got
        as far as the dispatcher."""
        try:
            address, token = locate(self.namespace)
        except PoolNotRunning:
            return STOPPED, False  # its files are gone: no restart is coming
        channel = aio.insecure_channel(address, options=GRPC_OPTIONS)
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)  # type: ignore[no-untyped-call]
        call = stub.SubmitStream(metadata=auth.call_metadata(token))
        sender = asyncio.create_task(self._send(call))
        if self._outgoing:
            self._wake.set()
        served = False
        try:
            await call.wait_for_connection()
            served = True
            async for batch in call:
                for result in batch.results:
                    if (entry := self._pending.pop(result.id, None)) is not None:
                        self._cancelled.discard(result.id)
                        entry[1](result)
            return STOPPED, served
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                detail = f"the pool refused our token ({exc.details()})"
                self._refused = PoolNotRunning(self.namespace, detail)
                self._fail_all(self._refused)
            return f"{exc.code().name}: {exc.details()}", served
        finally:
            sender.cancel()
            call.cancel()
            await channel.close()

    async def _send(self, call: Any) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = SubmissionBatch(submissions=self._outgoing, cancel=self._cancels)
            self._outgoing, self._cancels = [], []
            try:
                await call.write(batch)
            except (aio.AioRpcError, aio.UsageError, asyncio.InvalidStateError):
                return  # _stream sees the stream end and sends them again

    def _resend_pending(self) -> None:
        """After a lost stream: every unanswered task goes out again, but
        those cancelled meanwhile are answered here."""
        for task_id in self._cancelled & self._pending.keys():
            _, on_result = self._pending.pop(task_id)
            on_result(Result(id=task_id, failure=tasks.cancelled()))
        self._cancelled.clear()
        self._outgoing = [submission for submission, _ in self._pending.values()]
        self._cancels = []

    def _fail_all(self, error: PoolNotRunning) -> None:
        pending, self._pending = self._pending, {}
        self._outgoing, self._cancels = [], []
        failure = tasks.failure_of(error, remote=False)
        for task_id, (_, on_result) in pending.items():
            on_result(Result(id=task_id, failure=failure))

    async def aclose(self) -> None:
        """Close the stream; fail what is still pending. Never raises."""
        self._closing = True
        self._wake.set()
        self._runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._runner
        self._fail_all(PoolNotRunning(self.namespace, "the client was closed"))


class Submissions:
    """What both clients put on a task: a fresh id, the function's name, the
    pickled call, and the client's tags and time limit."""

    def __init__(self, tags: Iterable[str], task_timeout_s: float | None) -> None:
        self._tags = tuple(tags)
        self._timeout_s = task_timeout_s or 0.0
        self._ids = itertools.count(1)

    def make(
        self, fn: Callable[..., Any] | str, args: tuple[Any, ...], kwargs: Any
    ) -> Submission:
        """A submission calling ``fn`` (a callable or ``"module:qualname"``)."""
        name = fn if isinstance(fn, str) else tasks.function_name(fn)
        task = Task(
            id=next(self._ids),
            function=name,
            args=tasks.dump_call(args, dict(kwargs)),
            timeout_s=self._timeout_s,
        )
        return Submission(task=task, tags=self._tags)


def _chunks(iterables: tuple[Iterable[Any], ...], size: int) -> Iterator[list[Any]]:
    it = zip(*iterables, strict=False)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


class Client(concurrent.futures.Executor):
    """An Executor whose tasks run in the pool serving ``namespace``.

    :param namespace: the pool's namespace (``pool up --namespace``).
    :param tags: tags every task of this client requires of its worker.
    :param task_timeout_s: per-task limit enforced by the worker (None: none).
    :raises PoolNotRunning: if no pool serves the namespace.
    """

    def __init__(
        self,
        namespace: str = "default",
        *,
        tags: Iterable[str] = (),
        task_timeout_s: float | None = None,
    ) -> None:
        self.namespace = namespace
        self._submissions = Submissions(tags, task_timeout_s)
        self._lock = threading.Lock()
        self._queued: list[tuple[Submission, concurrent.futures.Future[Any]]] = []
        self._flush_scheduled = False
        self._outstanding: set[concurrent.futures.Future[Any]] = set()
        self._closed = False
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pool-client", daemon=True
        )
        self._thread.start()
        try:
            self._connection = self._on_loop(self._connect(namespace))
        except BaseException:
            self._stop_loop()
            raise

    async def _connect(self, namespace: str) -> Connection:
        return Connection(namespace)

    def _on_loop(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(
        self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in the pool; ``fn`` must be importable
        by the workers (a module-level function, or ``"module:qualname"``)."""
        submission = self._submissions.make(fn, args, kwargs)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queued.append((submission, future))
            self._outstanding.add(future)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon_threadsafe(self._flush)
        future.add_done_callback(self._outstanding.discard)
        return future

    def _flush(self) -> None:
        with self._lock:
            queued, self._queued = self._queued, []
            self._flush_scheduled = False
        for submission, future in queued:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                self._connection.submit(submission, _resolver(future))
            except PoolNotRunning as exc:
                future.set_exception(exc)

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        """Like :meth:`Executor.map`: every task is submitted now, results come
        in order; ``chunksize`` calls travel and run as one task."""
        if chunksize < 1:
            raise ValueError(f"chunksize must be at least 1, got {chunksize}")
        if chunksize == 1:
            futures = [self.submit(fn, *args) for args in zip(*iterables, strict=False)]
            return _in_order(futures, timeout, flatten=False)
        name = tasks.function_name(fn)
        futures = [
            self.submit(tasks.CHUNK_FUNCTION, name, chunk)
            for chunk in _chunks(iterables, chunksize)
        ]
        return _in_order(futures, timeout, flatten=True)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                for _, future in self._queued:
                    future.cancel()
        if wait:
            concurrent.futures.wait(list(self._outstanding))
        if self._thread.is_alive():
            self._on_loop(self._connection.aclose())
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _in_order(
    futures: list[concurrent.futures.Future[Any]], timeout: float | None, flatten: bool
) -> Iterator[Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for future in futures:
            left = None if deadline is None else deadline - time.monotonic()
            value = future.result(left)
            if flatten:
                yield from value
            else:
                yield value
    finally:
        for future in futures:
            future.cancel()


def _resolver(future: concurrent.futures.Future[Any]) -> OnResult:
    def resolve(result: Result) -> None:
        try:
            future.set_result(outcome(result))
        except BaseException as exc:
            future.set_exception(exc)

    return resolve


class AsyncClient:
    """The pool for asyncio code: ``async with AsyncClient(ns) as client``.

    :param namespace: the pool's namespace.
    :param tags: tags every task of this client requires of its worker.
    :param task_timeout_s: per-task limit enforced by the worker (None: none).
    """

    def __init__(
        self,
        namespace: str = "default",
        *,
        tags: Iterable[str] = (),
        task_timeout_s: float | None = None,
    ) -> None:
        self.namespace = namespace
        self._submissions = Submissions(tags, task_timeout_s)
        self._connection: Connection | None = None

    async def __aenter__(self) -> Self:
        self._connection = Connection(self.namespace)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.aclose()

    async def submit(
        self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` in the pool and return its result.

        Cancelling the awaiting task cancels the task in the pool.
        """
        if self._connection is None:
            raise RuntimeError("use `async with AsyncClient(...)` before submitting")
        submission = self._submissions.make(fn, args, kwargs)
        done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()

        def deliver(result: Result) -> None:
            if not done.done():
                done.set_result(result)

        self._connection.submit(submission, deliver)
        try:
            return outcome(await done)
        except asyncio.CancelledError:
            self._connection.cancel(submission.task.id)
            raise

    async def map(
        self, fn: Callable[..., Any], *iterables: Iterable[Any], chunksize: int = 1
    ) -> AsyncIterator[Any]:
        """Results of ``fn`` over the iterables, in order."""
        if chunksize == 1:
            calls = [
                asyncio.ensure_future(self.submit(fn, *a))
                for a in zip(*iterables, strict=False)
            ]
            try:
                for call in calls:
                    yield await call
            finally:
                for call in calls:
                    call.cancel()
            return
        name = tasks.function_name(fn)
        chunks = [
            asyncio.ensure_future(self.submit(tasks.CHUNK_FUNCTION, name, chunk))
            for chunk in _chunks(iterables, chunksize)
        ]
        try:
            for chunk in chunks:
                for value in await chunk:
                    yield value
        finally:
            for chunk in chunks:
                chunk.cancel()
