"""The loop of a :class:`~pool.client.executor.Client`, on a thread of its own.

:class:`LoopThread` runs a uvloop loop that runs the client's
:class:`~pool.client.connection.Connection`; it holds nothing of the
client, so that an unreferenced client is finalized like the standard
executors. Callers hand it submissions from any thread (one wake-up of the
loop per burst); a :class:`FutureHandler` drives each future from its
task's answers on the loop. At interpreter exit every loop's pending
futures are waited for, as ``concurrent.futures.thread`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

import uvloop
from grpc import aio

from pool.client.connection import Connection
from pool.client.core import dropped, outcome
from pool.client.futures import PoolFuture
from pool.client.rendezvous import Locator
from pool.client.store import HOLD_NOTHING, Hold, Store
from pool.dispatcher_pb2 import Submission
from pool.errors import PoolError, PoolNotRunning
from workers.protocol.worker_pb2 import Result

CONNECT_TIMEOUT_S: Final = 30.0
FLUSH_MAX: Final = 4096  # submissions handed to the connection a turn


log = logging.getLogger("pool.client")

# Like concurrent.futures.thread: once the interpreter starts to exit, every
# client's pending futures are waited for and no new one is accepted.
_loops: weakref.WeakSet[LoopThread] = weakref.WeakSet()
_shutting_down = False


def interpreter_exiting() -> bool:
    """Whether the interpreter has begun to exit (no new task is taken)."""
    return _shutting_down


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


class FutureHandler:
    """Drives one :class:`concurrent.futures.Future` from its task's answers,
    on the client's loop: RUNNING once a worker started it, then its result.
    A cancelled future is told to its waiters once (see
    ``Future.set_running_or_notify_cancel``). With ``runner``, tells it
    when the future is settled or its owner cancelled it."""

    __slots__ = ("_future", "_hold", "_notified", "_runner", "_store", "task_id")

    def __init__(
        self,
        future: concurrent.futures.Future[Any],
        store: Store | None = None,
        hold: Hold = HOLD_NOTHING,
        runner: LoopThread | None = None,
        task_id: int = 0,
    ) -> None:
        # (Let go of once it is settled: the future holds this handler until
        # it is cancelled, and a cycle would keep a large value until a GC.)
        self._future: concurrent.futures.Future[Any] | None = future
        self._notified = False  # set_running_or_notify_cancel was called
        self._store, self._hold = store, hold  # its arguments' shared memory
        self._runner, self.task_id = runner, task_id

    def started(self) -> None:
        if not self._notified and self._future is not None:
            self._notified = True
            self._future.set_running_or_notify_cancel()

    def cancelled(self) -> None:
        """The future was cancelled: wake those who wait on it."""
        self.started()  # returns False and notifies, the future being cancelled

    def owner_cancelled(self) -> None:
        """Any thread: the future's owner cancelled it."""
        if self._runner is not None and self._future is not None:
            self._runner.on_cancel(self._future, self)

    def fail(self, exc: BaseException) -> None:
        """The task was never sent: its future fails with ``exc``."""
        if (future := self._settling()) is not None:
            settle(future.set_exception, exc)
            self._settled(future)

    def resolve(self, result: Result) -> None:
        if (future := self._settling()) is None:
            dropped(result, self._store)  # (cancelled: nobody reads it)
            return
        try:
            value = outcome(result, self._store, self._hold.key)
        except BaseException as exc:  # the task's error, whatever it is
            settle(future.set_exception, exc)
        else:
            settle(future.set_result, value)
        self._settled(future)

    def _settling(self) -> concurrent.futures.Future[Any] | None:
        """Release what the task's arguments held; the future to settle,
        unless it was cancelled (let go of, once settled)."""
        if self._store is not None:
            self._store.release(self._hold)
        future = self._future
        if future is None or future.cancelled():
            return None
        self._future = None
        return future

    def _settled(self, future: concurrent.futures.Future[Any]) -> None:
        if isinstance(future, PoolFuture):
            future._handler = None  # (a done future cancels nothing)
        if self._runner is not None:
            self._runner.forget(future)


def settle(setter: Callable[[Any], None], value: Any) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        setter(value)  # (raises if its owner cancelled it in the meantime)


class LoopThread:
    """A client's loop on a thread of its own, running its connection.

    Holds nothing of the client: the client's finalizer closes it.
    """

    def __init__(self, locator: Locator, max_pending: int | None = None) -> None:
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # for max_pending
        self._max_pending = max_pending
        self._reserved = 0  # room taken by submissions on their way in
        self._inbox: list[tuple[Submission, bytes, FutureHandler]] = []
        self._flush_scheduled = False  # (until the inbox is empty again)
        self._backlog: Iterator[tuple[Submission, bytes, FutureHandler]] | None = None
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
                futures, self.outstanding = list(self.outstanding), set()
                self._room.notify_all()
            for future in futures:
                settle(future.set_exception, crashed)
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

    def reserve(self) -> None:
        """Wait (any thread but the loop's, which a wait would stop) until
        fewer than ``max_pending`` futures are pending or on their way in,
        and take room for one more: :meth:`submit` or :meth:`release` it."""
        if self._max_pending is None:
            return  # (no bound: no room to count, and no lock taken)
        with self._room:
            if not self._on_loop():
                while len(self.outstanding) + self._reserved >= self._max_pending:
                    self._room.wait()
            self._reserved += 1

    def release(self) -> None:
        """Give back room :meth:`reserve` took, for a future not submitted."""
        if self._max_pending is None:
            return
        with self._room:
            self._reserved -= 1
            self._room.notify()

    def slots(self) -> int:
        """The pool's slots now (:meth:`Connection.slots`), from any thread
        but the loop's.

        :raises PoolNotRunning: if the pool stopped.
        """
        if self._connection is None or self._on_loop():
            raise RuntimeError("the pool's slots are asked from the client's loop")
        asked = asyncio.run_coroutine_threadsafe(self._connection.slots(), self._loop)
        try:
            return asked.result()
        except aio.AioRpcError as exc:
            raise PoolNotRunning(
                self._connection.namespace,
                f"its dispatcher did not say its workers: {exc.code().name}",
            ) from None

    def _on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    @property
    def store(self) -> Store | None:
        """Where the client's large data goes (None: in the messages)."""
        return self._connection.store if self._connection is not None else None

    def submit(
        self,
        submission: Submission,
        code: bytes,
        future: PoolFuture,
        hold: Hold = HOLD_NOTHING,
    ) -> None:
        """Send a task whose room :meth:`reserve` took (any thread);
        ``hold`` is what its arguments hold in the store, until answered."""
        handler = FutureHandler(future, self.store, hold, self, submission.task.id)
        with self._lock:
            if self._max_pending is not None:
                self._reserved -= 1
            if (crashed := self._crashed) is None:
                self.outstanding.add(future)
                future._handler = handler
                self._inbox.append((submission, code, handler))
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    self._loop.call_soon_threadsafe(self._flush)
        if crashed is not None:  # (outside the lock: failing it takes the lock)
            handler.fail(crashed)

    def forget(self, future: concurrent.futures.Future[Any]) -> None:
        """Any thread: the future is done (settled or cancelled)."""
        with self._lock:
            self.outstanding.discard(future)
            self._room.notify()

    def on_cancel(
        self, future: concurrent.futures.Future[Any], handler: FutureHandler
    ) -> None:
        """Any thread: the future's owner cancelled it: withdraw its task."""
        self.forget(future)
        with contextlib.suppress(RuntimeError):  # closed: nothing pending there
            self._loop.call_soon_threadsafe(self._cancel, handler)

    def _flush(self) -> None:
        """Hand the connection what callers submitted, at most
        :data:`FLUSH_MAX` a turn of the loop (a burst of a million submits
        would otherwise hold it for seconds: no result read, nothing
        written); the next turn goes on, until the inbox is empty."""
        assert self._connection is not None
        budget = FLUSH_MAX
        while budget:
            if self._backlog is None:
                with self._lock:
                    if not self._inbox:
                        self._flush_scheduled = False
                        return
                    self._backlog, self._inbox = iter(self._inbox), []
            for submission, code, handler in itertools.islice(self._backlog, budget):
                self._connection.submit(submission, handler, code)
                budget -= 1
            if budget:
                self._backlog = None  # (all of it handed over)
        self._loop.call_soon(self._flush)

    def _cancel(self, handler: FutureHandler) -> None:
        assert self._connection is not None
        self._connection.cancel(handler.task_id)
        handler.cancelled()

    def cancel_pending(self) -> None:
        """Cancel every future no worker has started (any thread)."""
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
