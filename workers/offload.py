"""Running a blocking call off the event loop without holding up the exit.

``asyncio.to_thread`` uses the loop's default executor, whose threads the
interpreter joins at exit and which refuses work once the interpreter has
begun to exit. :func:`in_daemon_thread` runs one call in a daemon thread of
its own instead: an import that never returns does not keep a worker
alive, and an embedded pool can still close its registry from an atexit
hook. Callers: :mod:`workers.service`, :mod:`pool.supervisor.orchestration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a new daemon thread, awaited on this loop.

    Unlike ``asyncio.to_thread``, a call that never returns (an import that
    hangs) does not hold up the process's exit.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, whatever it is
            deliver = functools.partial(_set_exception, future, exc)
        else:
            deliver = functools.partial(_set_result, future, value)
        with contextlib.suppress(RuntimeError):  # the loop is gone
            loop.call_soon_threadsafe(deliver)

    threading.Thread(target=run, name="offload", daemon=True).start()
    return await future


def _set_result(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
