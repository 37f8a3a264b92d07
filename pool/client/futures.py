"""The future a :class:`~pool.client.executor.Client` hands back: :class:`PoolFuture`.

A :class:`concurrent.futures.Future` in every way its users and the
standard library's ``wait`` and ``as_completed`` see, with two changes:

- its successful :meth:`~PoolFuture.cancel` tells the client's loop to
  withdraw the task (through its handler, set once the task is sent; no
  done callback, closure or lock of ours per task);
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
    def owner_cancelled(self) -> None:
        """Any thread: the future's owner cancelled it."""


class PoolFuture(concurrent.futures.Future[Any]):
    """The future of a task sent to the pool; see the module docstring."""

    _handler: Canceller | None = None  # set once its task is sent
    _made: threading.Condition  # its condition, once made

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
        if not super().cancel():
            return False
        handler, self._handler = self._handler, None
        if handler is not None:
            handler.owner_cancelled()
        return True
