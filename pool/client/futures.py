"""The future a :class:`~pool.client.executor.Client` hands back: :class:`PoolFuture`.

A :class:`concurrent.futures.Future` in every way its users and the
standard library's ``wait`` and ``as_completed`` see, with two changes:

- :meth:`~PoolFuture.cancel` asks the pool, through the task's handler
  (set once the task is sent; no done callback, closure or lock of ours
  per task), and returns its word: True only if the call will never run
  (:mod:`pool.client.cancels`). The loop, not the caller, then sets the
  future cancelled;
- a running call stopped by force (``Client.cancel(futures, force=True)``)
  ends *cancelled* too: :meth:`~PoolFuture.cancelled` is True, and
  ``result()`` and ``exception()`` raise ``CancelledError``, although a
  ``Future`` cannot go from RUNNING to CANCELLED (it ends with that
  exception).

It keeps to ``Future``'s public surface: it overrides three public
methods and adds two attributes of its own, and leaves ``Future``'s
state, condition and waiters to ``Future``. (A pending future costs what
the standard library's does, about 1.6 KB; an earlier version made the
condition lazily, through ``Future``'s private names, to save 1.4 KB of
it, which no release of CPython promises to keep working.) Created by
:class:`~pool.client.executor.Client`, driven by
:class:`~pool.client.handlers.FutureHandler`.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Protocol


class Canceller(Protocol):
    def cancel(self) -> bool:
        """Any thread: ask the pool to cancel the task; its word, once the
        future says so."""


class PoolFuture(concurrent.futures.Future[Any]):
    """The future of a task sent to the pool; see the module docstring."""

    _handler: Canceller | None = None  # set once its task is sent
    _stopped = False  # a running call stopped by force: it ended cancelled

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
