"""The loop of a :class:`~pool.client.executor.Client`, on a thread of its own.

:class:`LoopThread` runs a uvloop loop that runs the client's
:class:`~pool.client.connection.Connection`; it holds nothing of the
client, so that an unreferenced client is finalized like the standard
executors. Callers hand it submissions from any thread (one wake-up of the
loop per burst), and cancels (:meth:`LoopThread.cancel`: asked on the
loop, the pool's word waited for by the caller, :mod:`pool.client.cancels`);
a :class:`~pool.client.handlers.FutureHandler` drives each future from its
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
from collections.abc import Iterator
from typing import Any, Final

import uvloop
from grpc import aio

from pool.client.cancels import CANCEL_WAIT_S, Ask, wait_all
from pool.client.connection import Connection
from pool.client.futures import PoolFuture
from pool.client.handlers import FutureHandler, handler_of, settle
from pool.client.rendezvous import Locator
from pool.client.store import HOLD_NOTHING, Hold, Store
from pool.dispatcher_pb2 import Submission
from pool.errors import PoolError, PoolNotRunning
from workers.protocol.stream import Withdraw

CONNECT_TIMEOUT_S: Final = 30.0
FLUSH_MAX: Final = 4096  # submissions handed to the connection a turn


log = logging.getLogger("pool.client")

# Like concurrent.futures.thread: once the interpreter starts to exit, every
# client's pending futures are waited for and no new one is accepted. The
# standard executors hook the exit through a private function of threading;
# a thread of ours that is not a daemon waits for the main thread to end
# instead: the interpreter joins it, while our daemon loop threads still run.
_loops: weakref.WeakSet[LoopThread] = weakref.WeakSet()
_shutting_down = False
_watching = threading.Lock()  # (held to start the one watcher)
_watcher: threading.Thread | None = None


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


def _watch_exit() -> None:
    threading.main_thread().join()
    _python_exit()


def _watch_for_exit() -> None:
    """Start the thread that runs :func:`_python_exit` once the main thread
    has ended (once per process; a forked child starts its own)."""
    global _watcher
    with _watching:
        exiting = not threading.main_thread().is_alive()  # (it runs no hook)
        if not exiting and (_watcher is None or not _watcher.is_alive()):
            _watcher = threading.Thread(target=_watch_exit, name="pool-exit")
            _watcher.start()


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
        _watch_for_exit()

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

    def cancel(
        self,
        handlers: list[FutureHandler],
        kind: Withdraw = "cancel",
        *,
        wait: bool = True,
    ) -> list[bool]:
        """Any thread: ask the pool to withdraw these tasks (``kind``:
        :data:`~workers.protocol.stream.Withdraw`); with ``wait``, wait for
        its word on each (the list), else return at once (``[]``), each
        future settling as its word comes. Waited for on the loop's own
        thread (a done callback), which cannot wait: only a task not yet
        written is cancelled, at once.

        :raises RuntimeError: for a ``stop`` waited for on the loop's thread.
        """
        on_loop = self._on_loop()
        if on_loop and wait:
            if kind == "stop":
                raise RuntimeError(
                    "cancel(force=True) waits for the pool's word: call it from "
                    "a thread of yours, not a done callback (they run on the "
                    "client's own thread)"
                )
            return [self._withdraw_unsent(handler) for handler in handlers]
        asks = [Ask(kind) for _ in handlers]
        asked = threading.Event()  # the loop has asked them all
        if on_loop:
            self._ask(handlers, asks, asked)
            return []
        try:
            self._loop.call_soon_threadsafe(self._ask, handlers, asks, asked)
        except RuntimeError:  # the loop closed: every future is done
            return [h._future is not None and h._future.cancelled() for h in handlers]
        if not wait:
            return []
        # (Asking takes the loop a turn; the deadline is for the words. An
        # ask the loop never takes is given up with the rest: it runs.)
        asked.wait(CANCEL_WAIT_S)
        return wait_all(asks)

    def _ask(
        self, handlers: list[FutureHandler], asks: list[Ask], asked: threading.Event
    ) -> None:
        """Hold each ask in its handler and ask the pool, all in one turn of
        the loop: else the sender would write, between turns, tasks that
        were to be withdrawn unwritten. A task still in the inbox is
        withdrawn when the flush meets it."""
        assert self._connection is not None
        for handler, ask in zip(handlers, asks, strict=True):
            if handler.ask(ask):
                self._connection.cancel(handler.task_id, ask.kind)
        asked.set()

    def _withdraw_unsent(self, handler: FutureHandler) -> bool:
        """On the loop: cancel a task not yet written (certain here)."""
        assert self._connection is not None
        ask = Ask()
        if handler.ask(ask):
            self._connection.ledger.withdraw_unsent(handler.task_id)
        return ask.wait(0)  # (its answer, or given up: the task runs)

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
                if not (handler.asked and handler.withdrawn()):  # (cancelled here)
                    self._connection.submit(submission, handler, code)
                budget -= 1
            if budget:
                self._backlog = None  # (all of it handed over)
        self._loop.call_soon(self._flush)

    def cancel_pending(self) -> None:
        """Cancel every future no worker has started (any thread)."""
        with self._lock:
            futures = list(self.outstanding)
        handlers = [h for f in futures if (h := handler_of(f)) is not None]
        self.cancel(handlers)

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
