"""Blocking calls off the event loop, on threads their owner bounds and ends.

``asyncio.to_thread`` uses the loop's default executor, whose threads the
interpreter joins at exit and which refuses work once the interpreter has
begun to exit. An :class:`Offload` runs each call on a daemon thread of its
own instead, at most ``max_threads`` at once, counting those whose caller
was cancelled and that still run (a further call waits on the loop): an
import that never returns does not keep a worker alive, and an embedded
pool can still close its registry from an atexit hook. Its owner
ends it with :meth:`Offload.aclose`, which waits a bounded time for the
calls still running and joins their threads. Owners: the worker's service
(imports, large arguments), the supervisor (the registry, sweeps) and a
client's connection (finding its pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

T = TypeVar("T")

MAX_THREADS: Final = 8
JOIN_S: Final = 1.0


class Offload:
    """Runs blocking calls on threads it owns; see the module docstring."""

    def __init__(self, name: str = "offload", max_threads: int = MAX_THREADS) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, got {max_threads}")
        self._name = name
        self._slots = asyncio.Semaphore(max_threads)
        self._running: dict[threading.Thread, asyncio.Future[None]] = {}
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a thread of this offload, awaited here.

        :raises RuntimeError: once closed.
        """
        if self._closed:
            raise RuntimeError(f"{self._name} is closed")
        await self._slots.acquire()  # (released once the thread returns)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        ended: asyncio.Future[None] = loop.create_future()
        thread = threading.Thread(
            target=_call, args=(loop, answer, ended, fn, args), daemon=True
        )
        thread.name = self._name
        try:
            thread.start()
        except BaseException:
            self._slots.release()
            raise
        self._running[thread] = ended
        ended.add_done_callback(lambda _: self._forget(thread))
        # A caller cancelled here leaves its call running: its thread keeps
        # its place among max_threads until it returns.
        return await answer

    def _forget(self, thread: threading.Thread) -> None:
        """A thread has returned from its call: join it (at once), and give
        its place to the next call."""
        self._running.pop(thread, None)
        thread.join()
        self._slots.release()

    async def aclose(self, join_s: float = JOIN_S) -> None:
        """Take no more calls; wait up to ``join_s`` for those running, and
        join their threads (one still stuck stays a daemon). Never raises."""
        self._closed = True
        if self._running:
            await asyncio.wait(list(self._running.values()), timeout=join_s)


def _call(
    loop: asyncio.AbstractEventLoop,
    answer: asyncio.Future[Any],
    ended: asyncio.Future[None],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """The thread: run the call, then hand its outcome to the loop."""
    try:
        value = fn(*args)
    except BaseException as exc:  # handed to the awaiting task, whatever it is
        outcome: tuple[Any, BaseException | None] = (None, exc)
    else:
        outcome = (value, None)
    with contextlib.suppress(RuntimeError):  # the loop is gone
        loop.call_soon_threadsafe(_settle, answer, ended, outcome)


def _settle(
    answer: asyncio.Future[Any],
    ended: asyncio.Future[None],
    outcome: tuple[Any, BaseException | None],
) -> None:
    value, error = outcome
    if not answer.done():
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(value)
    if not ended.done():
        ended.set_result(None)
