"""The future a :class:`~pool.client.executor.Client` hands back: :class:`PoolFuture`.

A :class:`concurrent.futures.Future` in every way its users and the
standard library's ``wait`` and ``as_completed`` see, with three changes:

- :meth:`~PoolFuture.cancel` asks the pool, through the task's handler
  (set once the task is sent; no done callback, closure or lock of ours
  per task), and returns its word: True only if the call will never run
  (:mod:`pool.client.cancels`). The loop, not the caller, then sets the
  future cancelled;
- a running call stopped by force (``Client.cancel(futures, force=True)``)
  ends *cancelled* too: :meth:`~PoolFuture.cancelled` is True, and
  ``result()`` and ``exception()`` raise ``CancelledError``, although a
  ``Future`` cannot go from RUNNING to CANCELLED (it ends with that
  exception);
- its condition (a ``threading.Condition``: an ``RLock``, a deque of
  waiters and five bound methods, about 1.2 KB of the 1.6 KB a future
  costs) is made when first needed: a million pending futures nobody
  waits on yet hold none. A thread that finds none makes it under one
  module lock, so two threads never make two.

It relies on ``concurrent.futures.Future`` reaching its condition only
through ``self._condition`` (true of CPython 3.11 to 3.13; the suite runs
CPython's own executor tests on it). Created by
:class:`~pool.client.executor.Client`, driven by
:class:`~pool.client.loop.FutureHandler`.
"""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures._base import PENDING
from typing import Any, Final, Protocol

_MAKING: Final = threading.Lock()  # (held only to make a future's condition)


class Canceller(Protocol):
    def cancel(self) -> bool:
        """Any thread: ask the pool to cancel the task; its word, once the
        future says so."""


class PoolFuture(concurrent.futures.Future[Any]):
    """The future of a task sent to the pool; see the module docstring."""

    _handler: Canceller | None = None  # set once its task is sent
    _made: threading.Condition  # its condition, once made
    _stopped = False  # a running call stopped by force: it ended cancelled

    def __init__(self) -> None:  # (Future's, but for its condition)
        self._state = PENDING
        self._result = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        try:
            return self._made
        except AttributeError:
            with _MAKING:
                if "_made" not in self.__dict__:
                    self._made = threading.Condition()
            return self._made

    def cancel(self) -> bool:
        """Cancel the call if it will never run, as the pool says (a round
        trip to where the task is, at most a few ms; from the client's own
        thread, where done callbacks run, only a task not yet sent is
        cancelled). False if it runs or ran, as ``Future.cancel``."""
        handler = self._handler
        if handler is None or self.done() or self.running():
            return super().cancel()  # (its state decides)
        return handler.cancel()

    def cancelled(self) -> bool:
        return self._stopped or super().cancelled()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        exc = super().exception(timeout)
        if self._stopped:
            raise concurrent.futures.CancelledError()
        return exc

    def stopped(self, exc: BaseException) -> None:
        """The loop: its running call was stopped by force; it ends
        cancelled, raising ``exc`` (a ``CancelledError``)."""
        self._stopped = True
        self.set_exception(exc)
