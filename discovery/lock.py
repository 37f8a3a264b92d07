"""The registry lock: a namespace's one cross-process writer lock.

A flock on ``<namespace dir>/lock`` (portalocker), released by the kernel
when its holder dies, however it dies. Held around every write of the
segment (:mod:`discovery.registry`) by :mod:`discovery.local`,
:mod:`discovery.publisher`, the reaper of :mod:`discovery.liveness` and
:mod:`discovery.ownership`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Final

import portalocker

from discovery import paths
from discovery.errors import LockTimeout

LOCK_TIMEOUT_S: Final = 30.0


class RegistryLock:
    """The namespace's exclusive cross-process writer lock.

    A flock on ``<namespace dir>/lock`` through portalocker. The kernel
    releases it when the holder dies, however it dies. Waits are
    non-blocking attempts with capped exponential back-off (never a spin,
    never a blocking flock in a thread) bounded by ``timeout_s``.
    """

    def __init__(self, namespace: str, timeout_s: float = LOCK_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.namespace, self.timeout_s = namespace, timeout_s
        self._path = paths.namespace_dir(namespace) / paths.LOCK_FILE
        self._fd: int | None = paths.open_private_file(self._path)

    def close(self) -> None:
        """Close the lock file (releasing the lock if held). Never raises."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _try(self) -> bool:
        if self._fd is None:
            raise ValueError(f"lock of {self.namespace!r} is closed")
        flags = portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING
        try:
            portalocker.lock(self._fd, flags)
        except portalocker.AlreadyLocked:
            return False
        if paths.same_file(self._fd, self._path) is not False:
            return True  # (None: removed, and nobody made a new one to guard)
        # A new owner made a new lock file after the old one was removed
        # while we waited for it: the old one guards nothing. Take the new
        # one instead, on the next try.
        os.close(self._fd)
        self._fd = paths.open_private_file(self._path)
        return False

    def _release(self) -> None:
        if self._fd is not None:
            portalocker.unlock(self._fd)

    def _delays(self) -> Iterator[float]:
        """Back-off delays until the deadline, then :class:`LockTimeout`."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.0002
        while (left := deadline - time.monotonic()) > 0:
            yield min(delay, left)
            delay = min(delay * 2, 0.02)
        raise LockTimeout(self.namespace, self.timeout_s)

    @contextmanager
    def hold_if_free(self) -> Iterator[bool]:
        """Hold the lock if no one else does; yields whether it is held."""
        held = self._try()
        try:
            yield held
        finally:
            if held:
                self._release()

    def _waits(self) -> Iterator[float]:
        """The sleeps between attempts until the lock is taken (none if it is
        free now), then :class:`LockTimeout` at the deadline."""
        if self._try():
            return
        for delay in self._delays():
            yield delay
            if self._try():
                return

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the lock, waiting (blocking this thread) up to ``timeout_s``."""
        for delay in self._waits():
            time.sleep(delay)
        try:
            yield
        finally:
            self._release()

    @asynccontextmanager
    async def hold_async(self) -> AsyncIterator[None]:
        """Hold the lock, waiting on the event loop up to ``timeout_s``."""
        for delay in self._waits():
            await asyncio.sleep(delay)
        try:
            yield
        finally:
            self._release()
