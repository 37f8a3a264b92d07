"""Clients of a running pool, found by namespace.

:class:`Client` is a :class:`concurrent.futures.Executor` that behaves like
``ProcessPoolExecutor`` wherever ``concurrent.futures`` defines the
behaviour. It runs a uvloop loop on a thread of its own (a
:class:`_LoopThread`, which holds no reference to the client, so that an
unreferenced client is finalized like the standard executors), and that
loop runs the client's :class:`~pool.client.connection.Connection`. A future is
PENDING, and cancellable, until a worker has taken its task; then RUNNING.
A cancel reaches the dispatcher's queue. ``shutdown(wait=False)`` lets
pending futures finish; at interpreter exit, every client's pending
futures are waited for, as the standard executors do.

:class:`AsyncClient` is the same for asyncio code, on the caller's loop.

A task is run *at least once*: if its worker dies, the dispatcher runs it
again elsewhere (up to its attempt limit), so a task with side effects may
see them twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import pickle
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import ModuleType, TracebackType
from typing import Any, Final, Self

import uvloop

from discovery import backends, paths
from pool.client.connection import Connection
from pool.client.rendezvous import Locator
from pool.dispatcher_pb2 import Submission
from pool.errors import PoolError
from workers.protocol import codec, shipping
from workers.protocol.worker_pb2 import Result, Task

__all__ = ["AsyncClient", "Client", "outcome"]

CONNECT_TIMEOUT_S: Final = 30.0

# map's adaptive chunks (see Client.map): the first calls go one per task,
PROBE_CALLS: Final = 8
# and the first of them to answer says how long a call runs, unless one has
# run this long without an answer (a long call: one per task, then); a pool
# slow to take them (busy, or starting) is waited for up to PROBE_MAX_S;
PROBE_WAIT_S: Final = 0.05
PROBE_MAX_S: Final = 1.0
# then the rest go in chunks that run about this long in the worker (a task
# costs about 0.2 ms of CPU over the three processes it crosses),
CHUNK_TARGET_S: Final = 0.002
# and in at least this many chunks, so that every worker gets its share,
MIN_CHUNKS: Final = 64
# each carrying about this many bytes of arguments at most.
MAX_CHUNK_BYTES: Final = 1 << 20

log = logging.getLogger("pool.client.executor")

# Like concurrent.futures.thread: once the interpreter starts to exit, every
# client's pending futures are waited for and no new one is accepted.
_loops: weakref.WeakSet[_LoopThread] = weakref.WeakSet()
_shutting_down = False


def _python_exit() -> None:
    global _shutting_down
    _shutting_down = True
    loops = list(_loops)
    for loop in loops:
        loop.close_when_idle()
    for loop in loops:
        loop.join()


# Runs before non-daemon threads are joined, while our loop threads still
# run (the standard executors register their exit hook the same way).
threading._register_atexit(_python_exit)  # type: ignore[attr-defined]


def outcome(result: Result) -> Any:
    """The value a result carries, or raise the exception it carries."""
    if result.HasField("failure"):
        raise codec.exception_of(result.failure)
    return pickle.loads(result.value)


class Submissions:
    """What both clients put on a task: a fresh id, the callable (by name,
    or by value: see :mod:`workers.protocol.shipping`), the pickled call, and the
    client's tags and time limit.

    :param ship_modules: modules whose functions and classes travel by value
        (registered with cloudpickle for the life of the process).
    """

    def __init__(
        self,
        tags: Iterable[str],
        task_timeout_s: float | None,
        ship_modules: Iterable[ModuleType] = (),
    ) -> None:
        self._tags = tuple(tags)
        self.timeout_s = task_timeout_s or 0.0
        self._ids = itertools.count(1)
        self._ship_modules = tuple(_ship(module) for module in ship_modules)

    def reference(self, fn: Callable[..., Any] | str) -> shipping.Reference:
        """How ``fn`` travels (pickled once here if by value).

        :raises TypeError: if ``fn`` is neither a callable nor a name.
        :raises Exception: whatever pickling ``fn`` raises.
        """
        if not (isinstance(fn, str) or callable(fn)):
            raise TypeError(f"{type(fn).__name__!r} object is not callable")
        return shipping.reference(fn, self._ship_modules)

    def make(
        self,
        ref: shipping.Reference,
        args: tuple[Any, ...],
        kwargs: Any,
        *,
        chunk: bool = False,
    ) -> tuple[Submission, bytes]:
        """A submission calling ``ref``, and the code to ship with it.

        :raises Exception: whatever pickling the arguments raises.
        """
        task = Task(
            id=next(self._ids),
            function=ref.name,
            digest=ref.digest,
            args=codec.dump_call(args, dict(kwargs), by_value=ref.by_value),
            timeout_s=self.timeout_s,
            chunk=chunk,
        )
        return Submission(task=task, tags=self._tags), ref.code


def _ship(module: ModuleType) -> str:
    if not isinstance(module, ModuleType):
        raise TypeError(
            f"ship_modules takes modules (import them first), got "
            f"{type(module).__name__} {module!r}"
        )
    import cloudpickle  # (only a client that ships modules needs it now)

    cloudpickle.register_pickle_by_value(module)
    return module.__name__


class FutureHandler:
    """Drives one :class:`concurrent.futures.Future` from its task's answers,
    on the client's loop: RUNNING once a worker took it, then its result.
    A cancelled future is told to its waiters once (see
    ``Future.set_running_or_notify_cancel``)."""

    __slots__ = ("_future", "_notified")

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self._future = future
        self._notified = False  # set_running_or_notify_cancel was called

    def accepted(self) -> None:
        if not self._notified:
            self._notified = True
            self._future.set_running_or_notify_cancel()

    def cancelled(self) -> None:
        """The future was cancelled: wake those who wait on it."""
        self.accepted()  # returns False and notifies, the future being cancelled

    def resolve(self, result: Result) -> None:
        future = self._future
        if future.cancelled():
            return
        try:
            value = outcome(result)
        except BaseException as exc:  # the task's error, whatever it is
            _settle(future.set_exception, exc)
        else:
            _settle(future.set_result, value)


def _settle(setter: Callable[[Any], None], value: Any) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        setter(value)  # (raises if its owner cancelled it in the meantime)


class _LoopThread:
    """A client's loop on a thread of its own, running its connection.

    Holds nothing of the client: the client's finalizer closes it.
    """

    def __init__(self, locator: Locator) -> None:
        self._lock = threading.Lock()
        self._inbox: list[tuple[Submission, bytes, FutureHandler]] = []
        self._flush_scheduled = False
        self.outstanding: set[concurrent.futures.Future[Any]] = set()
        self._crashed: PoolError | None = None
        self._loop = uvloop.new_event_loop()
        self._connection: Connection | None = None
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(locator, started), name="pool-client", daemon=True
        )
        self._thread.start()
        try:
            started.result(CONNECT_TIMEOUT_S)
        except BaseException:
            self._thread.join()
            raise
        _loops.add(self)

    def _run(self, locator: Locator, started: concurrent.futures.Future[None]) -> None:
        try:
            self._loop.run_until_complete(self._main(locator, started))
        except BaseException as exc:  # a bug of ours: fail what waits, loudly
            log.exception("the client's connection to %r failed", locator.namespace)
            crashed = PoolError(f"the client's connection failed: {exc!r}")
            with self._lock:
                self._crashed = crashed
                futures = list(self.outstanding)
            for future in futures:
                _settle(future.set_exception, crashed)
        finally:
            self._loop.close()

    async def _main(
        self, locator: Locator, started: concurrent.futures.Future[None]
    ) -> None:
        try:
            self._connection = await Connection.open(locator)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        await self._connection.run()

    def submit(
        self,
        submission: Submission,
        code: bytes,
        future: concurrent.futures.Future[Any],
    ) -> None:
        handler = FutureHandler(future)
        with self._lock:
            if self._crashed is not None:
                future.set_exception(self._crashed)
                return
            self.outstanding.add(future)
            self._inbox.append((submission, code, handler))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon_threadsafe(self._flush)
        task_id = submission.task.id
        future.add_done_callback(lambda f: self._on_done(f, task_id, handler))

    def _on_done(
        self,
        future: concurrent.futures.Future[Any],
        task_id: int,
        handler: FutureHandler,
    ) -> None:
        """Any thread: the future finished, or its owner cancelled it."""
        with self._lock:
            self.outstanding.discard(future)
        if future.cancelled():
            with contextlib.suppress(RuntimeError):  # closed: nothing pending there
                self._loop.call_soon_threadsafe(self._cancel, task_id, handler)

    def _flush(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
            self._flush_scheduled = False
        assert self._connection is not None
        for submission, code, handler in inbox:
            self._connection.submit(submission, handler, code)

    def _cancel(self, task_id: int, handler: FutureHandler) -> None:
        assert self._connection is not None
        self._connection.cancel(task_id)
        handler.cancelled()

    def cancel_pending(self) -> None:
        """Cancel every future not yet taken by a worker (any thread)."""
        with self._lock:
            futures = list(self.outstanding)
        for future in futures:
            future.cancel()

    def close_when_idle(self) -> None:
        """Stop the loop once every pending future is done (any thread)."""
        with contextlib.suppress(RuntimeError):  # closed already
            self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def join(self) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join()


class Client(concurrent.futures.Executor):
    """An Executor whose tasks run in the pool serving ``namespace``.

    :param namespace: the pool's namespace (``pool up --namespace``).
    :param tags: tags every task of this client requires of its worker.
    :param task_timeout_s: per-task limit enforced by the worker (None: none).
    :param ship_modules: modules of yours that the workers cannot import:
        their functions and classes travel by value (cloudpickle's
        ``register_pickle_by_value``, for the life of this process).
    :param discovery_url: find the pool through the Redis it registers in
        (``pool up --discovery redis://...``), from any machine, rather than
        in this machine's runtime directory.
    :param token_file: with ``discovery_url``, the file holding the pool's
        token (else ``$SHMPOOL_TOKEN``, else this machine's pool's).
    :param tls_ca: with ``discovery_url``, the CA (PEM file) of a dispatcher
        that serves TLS (``pool up --tls-cert``; default: the system's roots).
    :raises PoolNotRunning: if no pool serves the namespace.
    """

    def __init__(
        self,
        namespace: str = "default",
        *,
        tags: Iterable[str] = (),
        task_timeout_s: float | None = None,
        ship_modules: Iterable[ModuleType] = (),
        discovery_url: str | None = None,
        token_file: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.namespace = paths.validate_namespace(namespace)
        url = backends.check_url(discovery_url)
        locator = Locator(namespace, url, token_file, tls_ca)
        self._submissions = Submissions(tags, task_timeout_s, ship_modules)
        self._shutdown_lock = threading.Lock()
        self._shutdown = False
        self._runner = _LoopThread(locator)
        # Unreferenced, the client lets its futures finish, then its thread ends.
        self._finalizer = weakref.finalize(self, self._runner.close_when_idle)

    def submit(
        self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in the pool. ``fn`` is any callable: a
        function the workers can import travels by name (or pass
        ``"module:qualname"``), anything else by value with cloudpickle
        (lambdas, closures, ``__main__`` functions, partials, bound methods,
        callable objects), pickled now and sent once per connection.

        A function or arguments that cannot be sent set the future's
        exception, as pickling errors do in ``ProcessPoolExecutor``.

        :raises RuntimeError: after :meth:`shutdown`, or once the interpreter
            is exiting.
        """
        ref: shipping.Reference | Exception
        try:
            ref = self._submissions.reference(fn)
        except Exception as exc:
            ref = exc  # set on the future, once the client is known to be open
        return self._send(ref, args, kwargs)

    def _send(
        self,
        ref: shipping.Reference | Exception,
        args: tuple[Any, ...],
        kwargs: Any,
        *,
        chunk: bool = False,
    ) -> concurrent.futures.Future[Any]:
        with self._shutdown_lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if _shutting_down:
                raise RuntimeError(
                    "cannot schedule new futures after interpreter shutdown"
                )
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            try:
                if isinstance(ref, Exception):
                    raise ref
                submission, code = self._submissions.make(
                    ref, args, kwargs, chunk=chunk
                )
            except Exception as exc:
                future.set_exception(exc)
                return future
            self._runner.submit(submission, code, future)
            return future

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
    ) -> Iterator[Any]:
        """Like :meth:`Executor.map`: every call is submitted now, results come
        in order, each released once yielded, and a call's exception is
        raised when its turn comes; ``timeout`` counts from this call.

        ``chunksize`` calls travel and run as one task (1: a task per call,
        as ``ProcessPoolExecutor`` does by default). By default the size
        adapts: the first calls go one per task, and once one has answered
        (or one has run :data:`PROBE_WAIT_S` unanswered) the rest go in
        chunks that run about :data:`CHUNK_TARGET_S` each, or one per task
        if calls are longer. A chunk's calls keep their own values and exceptions, and a
        worker lost mid-chunk costs only that chunk, which runs again. With
        ``task_timeout_s`` the default is one call per task, so that the
        limit stays per call."""
        if chunksize is not None and chunksize < 1:
            raise ValueError(f"chunksize must be at least 1, got {chunksize}")
        deadline = None if timeout is None else time.monotonic() + timeout
        if chunksize is None and self._submissions.timeout_s:
            chunksize = 1
        try:
            ref = self._submissions.reference(fn)  # pickled once for every call
        except Exception as exc:  # raised on iteration, as the rest would be
            failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
            failed.set_exception(exc)
            return _in_order([failed], deadline)
        if chunksize == 1:
            futures = [
                self._send(ref, args, {}) for args in zip(*iterables, strict=False)
            ]
            return _in_order(futures, deadline)
        calls = list(zip(*iterables, strict=False))
        futures = []
        if chunksize is None:
            futures = [
                self._send(ref, ([call],), {}, chunk=True)
                for call in calls[:PROBE_CALLS]
            ]
            per_call_s = _time_per_call(futures)
            chunksize = auto_chunksize(
                per_call_s, len(calls) - len(futures), _call_bytes(calls)
            )
        futures += [
            self._send(ref, (chunk,), {}, chunk=True)
            for chunk in _slices(calls, len(futures), chunksize)
        ]
        return _flatten(_in_order(futures, deadline))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Accept no more tasks; with ``cancel_futures``, cancel those no
        worker has taken; with ``wait``, return once every future is done and
        the client's thread has ended (else it ends once they are done)."""
        with self._shutdown_lock:
            self._shutdown = True
        if cancel_futures:
            self._runner.cancel_pending()
        self._runner.close_when_idle()
        if wait:
            self._runner.join()


def auto_chunksize(
    per_call_s: float | None, calls: int, per_call_bytes: int = 0
) -> int:
    """How many calls of ``per_call_s`` each (None: not known in time) to
    send per task when ``calls`` are left: enough to run about
    :data:`CHUNK_TARGET_S`, but at least :data:`MIN_CHUNKS` chunks, and
    no more than :data:`MAX_CHUNK_BYTES` of arguments of ``per_call_bytes``."""
    if per_call_s is None or per_call_s >= CHUNK_TARGET_S:
        return 1
    size = int(CHUNK_TARGET_S / max(per_call_s, 1e-7))
    size = min(size, MAX_CHUNK_BYTES // max(per_call_bytes, 1))
    return max(1, min(size, calls // MIN_CHUNKS))


def _time_per_call(futures: list[concurrent.futures.Future[Any]]) -> float | None:
    """How long one call took in the first chunk to answer; None if one
    ran :data:`PROBE_WAIT_S` without an answer (or none answered within
    :data:`PROBE_MAX_S`). Waiting counts from when a worker took one, so
    that a pool slow to take them is not mistaken for long calls."""
    started = time.monotonic()
    running_since = None
    while True:
        now = time.monotonic()
        if running_since is None and any(f.running() for f in futures):
            running_since = now
        if running_since is not None:
            left = running_since + PROBE_WAIT_S - now
        else:  # look again soon for one taken
            left = min(PROBE_WAIT_S / 5, started + PROBE_MAX_S - now)
        if left <= 0 or now - started >= PROBE_MAX_S:
            return None
        done, _ = concurrent.futures.wait(
            futures, left, concurrent.futures.FIRST_COMPLETED
        )
        for future in done:
            if future.exception() is None:
                chunk: codec.ChunkResult = future.result()
                return chunk.elapsed_s / max(1, len(chunk.values))
        if done:
            return None  # the probe failed: so will the rest, one by one


def _call_bytes(calls: list[tuple[Any, ...]]) -> int:
    """The pickled size of the last call's arguments, as a sample (0 if they
    do not pickle: the chunk that holds them will fail as they would)."""
    try:
        return len(pickle.dumps(calls[-1], pickle.HIGHEST_PROTOCOL)) if calls else 0
    except Exception:
        return 0


def _slices(calls: list[Any], start: int, size: int) -> Iterator[list[Any]]:
    for at in range(start, len(calls), size):
        yield calls[at : at + size]


def _in_order(
    futures: list[concurrent.futures.Future[Any]], deadline: float | None
) -> Iterator[Any]:
    """Each future's result in order, each future dropped once its result is
    taken (as ``Executor.map`` does); whatever is left is cancelled."""
    futures.reverse()
    try:
        while futures:
            left = None if deadline is None else deadline - time.monotonic()
            yield _result_or_cancel(futures.pop(), left)
    finally:
        for future in futures:
            future.cancel()


def _result_or_cancel(
    future: concurrent.futures.Future[Any], timeout: float | None
) -> Any:
    try:
        return future.result(timeout)
    finally:
        future.cancel()  # a no-op once done: a timeout or an interrupt cancels it


def _flatten(chunks: Iterator[codec.ChunkResult]) -> Iterator[Any]:
    for chunk in chunks:
        yield from codec.chunk_items(chunk)


class AsyncClient:
    """The pool for asyncio code: ``async with AsyncClient(ns) as client``.

    Enter and leave it in the same task: it runs its connection in a task
    group of that task.

    :param namespace: the pool's namespace.
    :param tags: tags every task of this client requires of its worker.
    :param task_timeout_s: per-task limit enforced by the worker (None: none).
    :param ship_modules, discovery_url, token_file, tls_ca: as for
        :class:`Client`.
    """

    def __init__(
        self,
        namespace: str = "default",
        *,
        tags: Iterable[str] = (),
        task_timeout_s: float | None = None,
        ship_modules: Iterable[ModuleType] = (),
        discovery_url: str | None = None,
        token_file: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.namespace = paths.validate_namespace(namespace)
        url = backends.check_url(discovery_url)
        self._locator = Locator(namespace, url, token_file, tls_ca)
        self._submissions = Submissions(tags, task_timeout_s, ship_modules)
        self._connection: Connection | None = None
        self._group: asyncio.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        connection = await Connection.open(self._locator)
        group = asyncio.TaskGroup()
        await group.__aenter__()
        group.create_task(connection.run())
        self._connection, self._group = connection, group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the stream; tasks still pending fail. Never raises over an
        error already unwinding."""
        if self._connection is None or self._group is None:
            return
        connection, group = self._connection, self._group
        self._connection = self._group = None
        connection.close(abandon=True)
        await group.__aexit__(None, None, None)

    def _send(
        self,
        ref: shipping.Reference,
        args: tuple[Any, ...],
        kwargs: Any,
        *,
        chunk: bool = False,
    ) -> tuple[int, asyncio.Future[Result]]:
        if self._connection is None:
            raise RuntimeError("use `async with AsyncClient(...)` before submitting")
        submission, code = self._submissions.make(ref, args, kwargs, chunk=chunk)
        answer: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._connection.submit(submission, _AsyncHandler(answer), code)
        return submission.task.id, answer

    async def _outcome(self, task_id: int, answer: asyncio.Future[Result]) -> Any:
        try:
            return outcome(await answer)
        except asyncio.CancelledError:
            if self._connection is not None:
                self._connection.cancel(task_id)
            raise

    async def submit(
        self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` in the pool and return its result.

        Cancelling the awaiting task cancels the task in the pool.
        """
        ref = self._submissions.reference(fn)
        return await self._outcome(*self._send(ref, args, kwargs))

    async def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        chunksize: int | None = None,
    ) -> AsyncIterator[Any]:
        """Results of ``fn`` over the iterables, in order; every task is sent
        at once, and those not yet awaited are cancelled if the loop stops.
        ``chunksize`` is as for :meth:`Client.map` (adaptive by default)."""
        if chunksize is not None and chunksize < 1:
            raise ValueError(f"chunksize must be at least 1, got {chunksize}")
        if chunksize is None and self._submissions.timeout_s:
            chunksize = 1
        chunked = chunksize != 1
        ref = self._submissions.reference(fn)
        if not chunked:
            sent = [self._send(ref, args, {}) for args in zip(*iterables, strict=False)]
        else:
            calls = list(zip(*iterables, strict=False))
            sent = []
            if chunksize is None:
                sent = [
                    self._send(ref, ([call],), {}, chunk=True)
                    for call in calls[:PROBE_CALLS]
                ]
                per_call_s = await _time_per_call_async([a for _, a in sent])
                chunksize = auto_chunksize(
                    per_call_s, len(calls) - len(sent), _call_bytes(calls)
                )
            sent += [
                self._send(ref, (chunk,), {}, chunk=True)
                for chunk in _slices(calls, len(sent), chunksize)
            ]
        sent.reverse()
        try:
            while sent:
                value = await self._outcome(*sent.pop())
                if not chunked:
                    yield value
                else:
                    for item in codec.chunk_items(value):
                        yield item
        finally:
            for task_id, answer in sent:
                if not answer.done() and self._connection is not None:
                    self._connection.cancel(task_id)


async def _time_per_call_async(answers: list[asyncio.Future[Result]]) -> float | None:
    """:func:`_time_per_call` for :class:`AsyncClient`."""
    if not answers:
        return None
    # (An asyncio client does not hear when a task is taken: it waits longer.)
    done, _ = await asyncio.wait(
        answers, timeout=4 * PROBE_WAIT_S, return_when=asyncio.FIRST_COMPLETED
    )
    for answer in done:
        with contextlib.suppress(Exception):
            chunk: codec.ChunkResult = outcome(answer.result())
            return chunk.elapsed_s / max(1, len(chunk.values))
    return None


class _AsyncHandler:
    """Resolves an asyncio future with a task's result (on its loop)."""

    __slots__ = ("_answer",)

    def __init__(self, answer: asyncio.Future[Result]) -> None:
        self._answer = answer

    def accepted(self) -> None:
        pass

    def resolve(self, result: Result) -> None:
        if not self._answer.done():
            self._answer.set_result(result)
