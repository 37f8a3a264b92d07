"""What drives a :class:`~pool.client.executor.Client`'s futures:
:class:`FutureHandler`, one per task, on the client's loop.

The connection's ledger (:class:`~pool.client.ledger.Handler`) tells it
what becomes of its task (started, withdrawn as asked, answered); it sets
its future's state from that, and only from that: a future is RUNNING once
a worker started its call, CANCELLED once the pool withdrew it (the asks
it holds, :mod:`pool.client.cancels`, hear the word), FINISHED with its
value or exception, which a value in shared memory is mapped for. Made by
:class:`~pool.client.loop.LoopThread`, its ``runner``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from pool.client.cancels import NO_ASKS, Ask
from pool.client.core import dropped, outcome
from pool.client.futures import PoolFuture
from pool.client.store import HOLD_NOTHING, Hold, Store
from workers.protocol.stream import Withdraw
from workers.protocol.worker_pb2 import Result


class Runner(Protocol):
    """The client's loop, as a handler uses it."""

    def cancel(
        self,
        handlers: list[FutureHandler],
        kind: Withdraw = "cancel",
        *,
        wait: bool = True,
    ) -> list[bool]: ...

    def forget(self, future: concurrent.futures.Future[Any]) -> None: ...


class FutureHandler:
    """Drives one :class:`concurrent.futures.Future` from its task's answers,
    on the client's loop: RUNNING once a worker started it, then its result,
    or CANCELLED once the pool withdrew it as asked (:class:`Asks`). A
    cancelled future is told to its waiters once (see
    ``Future.set_running_or_notify_cancel``). With ``runner``, tells it
    when the future is settled, and asks it to cancel the task."""

    __slots__ = (
        "_asks",
        "_future",
        "_hold",
        "_notified",
        "_store",
        "_withdrawn",
        "runner",
        "task_id",
    )

    def __init__(
        self,
        future: concurrent.futures.Future[Any],
        store: Store | None = None,
        hold: Hold = HOLD_NOTHING,
        runner: Runner | None = None,
        task_id: int = 0,
    ) -> None:
        # (Let go of once it is settled: the future holds this handler until
        # it is cancelled, and a cycle would keep a large value until a GC.)
        self._future: concurrent.futures.Future[Any] | None = future
        self._notified = False  # set_running_or_notify_cancel was called
        self._store, self._hold = store, hold  # its arguments' shared memory
        self.runner, self.task_id = runner, task_id
        self._asks = NO_ASKS
        self._withdrawn = False  # its future ended cancelled (it is let go of)

    def started(self) -> None:
        self._asks.started()
        if not self._notified and self._future is not None:
            self._notified = True
            self._future.set_running_or_notify_cancel()

    def cancel(self) -> bool:
        """Any thread: ask the pool to cancel the task; its word."""
        if self.runner is None:
            return False
        return self.runner.cancel([self])[0]

    def ask(self, ask: Ask) -> bool:
        """The loop: hold ``ask`` (True: ask the pool), or answer it from
        the future's state."""
        future = self._future
        ended = future is None or future.done()
        cancelled = self._withdrawn or (future is not None and future.cancelled())
        running = future is not None and future.running()
        self._asks = self._asks.of()
        return self._asks.hold(ask, ended=ended, cancelled=cancelled, running=running)

    @property
    def asked(self) -> bool:
        """Whether an ask waits for the pool's word."""
        return bool(self._asks)

    def withdrawn(self) -> bool:
        """The pool withdrew the task as asked (or stopped it running): the
        future ends cancelled, unless every ask was given up."""
        return self._asks.withdrawn(self._cancel_future)

    def _cancel_future(self) -> None:
        self._withdrawn = True
        if (future := self._settling()) is not None:
            if not future.running():
                concurrent.futures.Future.cancel(future)  # (not ours: that asks)
                future.set_running_or_notify_cancel()  # wakes its waiters
            elif isinstance(future, PoolFuture):
                future.stopped(concurrent.futures.CancelledError())
            else:
                settle(future.set_exception, concurrent.futures.CancelledError())
            self._settled(future)

    def undecided(self) -> None:
        self._asks.ended()

    def fail(self, exc: BaseException) -> None:
        """The task was never sent: its future fails with ``exc``."""
        if (future := self._settling()) is not None:
            settle(future.set_exception, exc)
            self._settled(future)

    def resolve(self, result: Result) -> None:
        self._asks.ended()
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
        unless it was cancelled (let go of, once settled): not by the
        pool, but a plain ``Future`` given to :meth:`LoopThread.submit`
        may be by its owner."""
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
        if self.runner is not None:
            self.runner.forget(future)


def handler_of(future: concurrent.futures.Future[Any]) -> FutureHandler | None:
    """The handler of a client's pending future (None: not one, or done)."""
    handler = getattr(future, "_handler", None)
    return handler if isinstance(handler, FutureHandler) else None


def settle(setter: Callable[[Any], None], value: Any) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        setter(value)  # (raises if its owner cancelled it in the meantime)


def withdraw(
    futures: list[concurrent.futures.Future[Any]], kind: Withdraw, *, wait: bool = True
) -> list[bool]:
    """Ask the pool to withdraw the tasks of ``futures`` (``kind``: see
    :data:`~workers.protocol.stream.Withdraw`), all at once for each client
    they are of; with ``wait``, each one's word, in order (else ``[]``)."""
    answers = [False] * len(futures)
    mine: dict[Runner, list[tuple[int, FutureHandler]]] = {}
    for i, future in enumerate(futures):
        handler = handler_of(future)
        if handler is None or handler.runner is None:
            answers[i] = future.cancel()  # (done, or not a pool's)
        else:
            mine.setdefault(handler.runner, []).append((i, handler))
    for runner, handlers in mine.items():
        said = runner.cancel([h for _, h in handlers], kind, wait=wait)
        if wait:
            for (i, _), cancelled in zip(handlers, said, strict=True):
                answers[i] = cancelled
    return answers if wait else []
