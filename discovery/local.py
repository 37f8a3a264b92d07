"""``LocalDiscovery``: a namespace's registry in shared memory, and its owner.

Entering a :class:`LocalDiscovery` creates the namespace's registry, or
attaches to it when it already exists. The process that created it owns
it: on exit the owner marks it closed (subscribers report every worker
dropped), unlinks the segment and removes the namespace's runtime files.
An attacher only releases its mapping. Publishers and subscribers need
only the namespace string, from any process.
"""

from __future__ import annotations

import contextlib
import os
from types import TracebackType
from typing import Self
from uuid import uuid4

import discovery.publisher as _pub
import discovery.subscriber as _sub
from discovery import paths
from discovery.errors import NamespaceInUse, NamespaceNotFound, RegistryCorrupt
from discovery.info import WorkerInfo
from discovery.notify import Notifier
from discovery.registry import Registry, RegistryLock


class LocalDiscovery:
    """Worker discovery on one machine through a registry in shared memory.

    :param namespace: the registry's name; a fresh one (``pool-<hex>``) if None.
    :param capacity: how many workers may be registered at once.
    :param block_size: bytes for each worker's encoded :class:`WorkerInfo`.
    :raises InvalidNamespace: (a ``ValueError``) for a bad name.
    :raises ValueError: if ``capacity`` or ``block_size`` is out of range.

    Entering raises :class:`RegistryMismatch` if the namespace exists with
    another capacity or block size, :class:`RegistryCorrupt` if it holds
    something else, and :class:`LockTimeout` if its lock stays held.
    """

    Publisher = _pub.Publisher
    Subscriber = _sub.Subscriber

    def __init__(
        self,
        namespace: str | None = None,
        *,
        capacity: int = 128,
        block_size: int = 1024,
    ) -> None:
        self._namespace = paths.validate_namespace(
            namespace or f"pool-{uuid4().hex[:12]}"
        )
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self._capacity, self._block_size = capacity, block_size
        self._registry: Registry | None = None

    @property
    def namespace(self) -> str:
        """The namespace's name."""
        return self._namespace

    @property
    def created(self) -> bool:
        """True if this instance created the registry (and so owns it)."""
        return self._registry is not None and self._registry.created

    def __enter__(self) -> Self:
        lock = RegistryLock(self._namespace)
        try:
            with lock.hold():
                try:
                    registry = Registry.create(
                        self._namespace,
                        capacity=self._capacity,
                        block_size=self._block_size,
                    )
                except FileExistsError:
                    registry = Registry.attach(self._namespace)
                    try:
                        registry.check_layout(self._capacity, self._block_size)
                    except BaseException:
                        registry.close()
                        raise
            self._registry = registry
            if registry.created:
                _notify(self._namespace, registry.generation)
        finally:
            lock.close()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the registry; the owner also closes and removes it.

        Never raises: teardown must not hide the error that is unwinding.
        """
        registry, self._registry = self._registry, None
        if registry is None:
            return
        try:
            if registry.created:
                lock = RegistryLock(self._namespace)
                try:
                    with lock.hold():
                        registry.mark_closed()
                        registry.unlink()
                    _notify(self._namespace, registry.generation)
                finally:
                    lock.close()
                    paths.remove_namespace_dir(self._namespace)
        except Exception:  # the segment is unlinked below all the same
            registry.unlink()
            paths.remove_namespace_dir(self._namespace)
        finally:
            registry.close()

    @property
    def publisher(self) -> _pub.Publisher:
        """A new publisher for this namespace."""
        return _pub.Publisher(self._namespace)

    @property
    def subscriber(self) -> _sub.Subscriber:
        """A new subscriber to every worker of this namespace."""
        return self.subscribe()

    def subscribe(
        self, filter: _sub.Filter | None = None, *, poll_interval: float | None = None
    ) -> _sub.Subscriber:
        """A new subscriber, optionally filtered.

        :param filter: keep only workers for which it returns True.
        :param poll_interval: seconds between looks without a notification.
        """
        return _sub.Subscriber(self._namespace, filter, poll_interval=poll_interval)


def list_workers(namespace: str) -> list[WorkerInfo]:
    """The workers registered in ``namespace`` now, read from shared memory.

    Slots that are mid-write or do not decode are left out.

    :raises NamespaceNotFound: if the namespace has no registry.
    """
    registry = Registry.attach(namespace)
    try:
        found = []
        for index in range(registry.capacity):
            if registry.slot_version(index) == 0:
                continue
            read = registry.read_slot(index)
            if read is None or read.uid is None or read.data is None:
                continue
            with contextlib.suppress(ValueError):
                found.append(WorkerInfo.decode(read.data))
        return found
    finally:
        registry.close()


def reclaim(namespace: str) -> bool:
    """Remove what a dead owner left of ``namespace``: its segment and files.

    The caller must hold whatever proves it the namespace's next owner.

    :returns: True if a segment was removed (an unreadable one is, too).
    :raises NamespaceInUse: if the registry's creator is still alive.
    """
    try:
        registry = Registry.attach(namespace)
    except NamespaceNotFound:
        return False
    except RegistryCorrupt:
        Registry.unlink_name(namespace)
        return True
    try:
        owner = registry.owner_pid
        if owner != os.getpid() and _alive(owner):
            raise NamespaceInUse(namespace, owner)
        registry.unlink()
    finally:
        registry.close()
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _notify(namespace: str, generation: int) -> None:
    notifier = Notifier(namespace)
    try:
        notifier.notify(generation)
    finally:
        notifier.close()
