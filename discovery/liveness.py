"""Is a registered worker's publisher still alive? Told at once, however it died.

A killed process cannot drop its own workers, so each registration is tied
to a liveness file, ``<namespace dir>/live-<uid>``, on which the publishing
process holds an exclusive flock from before it writes the slot until after
it clears it. The kernel releases the lock when the process dies, however
it dies, before its death is announced; so "lock free" means "publisher
gone" (pids are reused; a lock is not).

Subscribers learn of a death at once through a pidfd on the publisher's pid
(:class:`PidWatches`) when they share its pid namespace, and otherwise by
testing the lock on each poll (:func:`is_alive`); the first to see a death
clears the slot (:class:`Reaper`). Callers: the publisher (:class:`Liveness`)
and the subscriber (the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Self
from uuid import UUID

import portalocker

from discovery import paths
from discovery.lock import RegistryLock
from discovery.notify import Notifier
from discovery.registry import Registry

_EXCLUSIVE_NOW = portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING


def liveness_path(namespace: str, uid: UUID) -> Path:
    """The liveness file of a worker."""
    return paths.namespace_dir(namespace, create=False) / _file_name(uid)


def _file_name(uid: UUID) -> str:
    return f"live-{uid.hex}"


@cache
def pid_namespace() -> int:
    """This process's pid namespace (an inode number); 0 if unknown.

    Cached: a process never changes its own pid namespace (a fork keeps it).
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


class Liveness:
    """A publisher's hold on one worker's liveness lock."""

    def __init__(self, path: Path, fd: int) -> None:
        self._path, self._fd = path, fd

    @classmethod
    def hold(cls, namespace: str, uid: UUID) -> Self:
        """Create the worker's liveness file, locked by this process.

        It is locked under a temporary name and renamed into place, so a
        ``live-*`` file is locked from the moment it can be seen.
        """
        path = liveness_path(namespace, uid)
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        fd = paths.open_private_file(draft)
        try:
            portalocker.lock(fd, _EXCLUSIVE_NOW)  # a new file: nobody else has it
            os.rename(draft, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(draft)
            raise
        return cls(path, fd)

    def release(self) -> None:
        """Remove the file and release the lock. Never raises."""
        with contextlib.suppress(OSError):
            os.unlink(self._path)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def is_alive(namespace: str, uid: UUID) -> bool:
    """True while some process holds the worker's liveness lock."""
    return lock_held(liveness_path(namespace, uid))


def lock_held(path: str | Path) -> bool:
    """True while some process holds the liveness lock of the file ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        portalocker.lock(fd, _EXCLUSIVE_NOW)
    except portalocker.AlreadyLocked:
        return True
    finally:
        os.close(fd)  # closing releases the lock we may have taken
    return False


def sweep(namespace: str, registered: set[UUID]) -> int:
    """Remove the liveness files of publishers that died before their worker
    was registered (no slot names the uid, and no process holds the lock).

    :returns: how many were removed.
    """
    directory = paths.namespace_dir(namespace, create=False)
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if not entry.name.startswith("live-"):
                continue
            try:
                uid = UUID(hex=entry.name[len("live-") :])
            except ValueError:
                continue
            if uid not in registered and not is_alive(namespace, uid):
                forget(namespace, uid)
                removed += 1
    return removed


def forget(namespace: str, uid: UUID) -> None:
    """Remove a dead worker's liveness file. Never raises."""
    with contextlib.suppress(OSError):
        os.unlink(liveness_path(namespace, uid))


class PidWatch:
    """One process watched by a :class:`PidWatches`; :meth:`close` stops it."""

    __slots__ = ("_fd", "_group")

    def __init__(self, fd: int, group: PidWatches) -> None:
        self._fd, self._group = fd, group

    def close(self) -> None:
        if self._fd >= 0:
            self._group._forget(self._fd)
            self._fd = -1


class PidWatches:
    """Calls a process's ``on_exit`` on the loop as soon as it exits, for
    any number of processes.

    Their pidfds sit in one epoll set, and the loop watches that one
    descriptor: a subscriber's first look at 4,096 workers then costs one
    ``epoll_ctl`` per worker, not a loop reader each (four times as much).
    :meth:`open` returns None where a pidfd cannot serve: another pid
    namespace (a container sees its worker as pid 1) or an old kernel.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._epoll = select.epoll()
        self._on_exit: dict[int, Callable[[], None]] = {}
        self._loop.add_reader(self._epoll.fileno(), self._ready)

    def open(
        self, pid: int, pidns: int, on_exit: Callable[[], None]
    ) -> PidWatch | None:
        if pid <= 0 or pidns != pid_namespace() or not hasattr(os, "pidfd_open"):
            return None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._loop.call_soon(on_exit)  # gone already
            return None
        except (OSError, OverflowError):  # not a pid we can watch: poll it
            return None
        self._epoll.register(fd, select.EPOLLIN)
        self._on_exit[fd] = on_exit
        return PidWatch(fd, self)

    def _ready(self) -> None:
        for fd, _ in self._epoll.poll(0):
            on_exit = self._on_exit.get(fd)
            if on_exit is not None:
                on_exit()

    def _forget(self, fd: int) -> None:
        del self._on_exit[fd]
        self._epoll.unregister(fd)
        os.close(fd)

    def close(self) -> None:
        """Stop every watch (they need not be closed one by one)."""
        if self._epoll.closed:
            return
        self._loop.remove_reader(self._epoll.fileno())
        for fd in self._on_exit:
            os.close(fd)
        self._on_exit.clear()
        self._epoll.close()


class Reaper:
    """Clears the slots of workers whose publisher died, for one subscriber.

    Whoever sees a death first reaps the slot under the registry lock and
    notifies; the others find the slot already cleared (or the lock busy,
    and look again when notified), so every subscriber emits one
    ``worker-dropped``. It never waits for the lock.
    """

    def __init__(self, namespace: str, registry: Registry) -> None:
        self._namespace, self._registry = namespace, registry
        # (Found and checked once: each poll tests every worker's lock.)
        self._directory = paths.namespace_dir(namespace, create=False)
        self._lock: RegistryLock | None = None
        self._notifier: Notifier | None = None

    def reap(self, index: int, uid: UUID) -> bool | None:
        """Clear slot ``index`` if it still holds ``uid`` and its publisher
        is dead.

        :returns: True if this call cleared it, False if there is nothing to
            clear, None if the registry lock is busy (most often another
            subscriber reaping the same death): look again on the next wake.
        """
        registry = self._registry
        read = registry.read_slot(index)
        if read is not None and read.uid != uid:
            return False  # reaped (or reused) already
        if lock_held(self._directory / _file_name(uid)):
            return False
        with self._hold() as held:
            if not held:
                return None
            read = registry.read_slot(index)
            if registry.closed:
                reaped = False
            elif read is None:  # torn: its writer died in the middle of a write
                reaped = registry.repair(index)
            elif reaped := read.uid == uid:
                registry.write_slot(index, None, b"")
        forget(self._namespace, uid)
        if reaped:
            self._notify()
        return reaped

    def repair(self, index: int) -> bool | None:
        """Clear slot ``index`` if its writer died in the middle of a write.

        :returns: True if this call cleared it, False if it is not torn, None
            if the registry lock is busy (a write may be under way).
        """
        with self._hold() as held:
            if not held:
                return None
            repaired = not self._registry.closed and self._registry.repair(index)
        if repaired:
            self._notify()
        return repaired

    @contextlib.contextmanager
    def _hold(self) -> Iterator[bool]:
        if self._lock is None:
            self._lock = RegistryLock(self._namespace)
        with self._lock.hold_if_free() as held:
            yield held

    def _notify(self) -> None:
        if self._notifier is None:
            self._notifier = Notifier(self._namespace)
        self._notifier.notify(self._registry.generation)

    def close(self) -> None:
        """Close the lock and notification files. Never raises."""
        for resource in (self._lock, self._notifier):
            if resource is not None:
                resource.close()
        self._lock = self._notifier = None
