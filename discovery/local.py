"""``LocalDiscovery``: a namespace's registry in shared memory, and its owner.

Entering a :class:`LocalDiscovery` claims the namespace
(:mod:`discovery.ownership`) and creates its registry, replacing whatever a
dead owner left; or, when a live process owns it, attaches to it. The owner
holds its claim until it exits: then it marks the registry closed
(subscribers report every worker dropped), unlinks the segment and removes
the namespace's runtime files. An attacher only releases its mapping.
Publishers and subscribers need only the namespace string, from any
process.
"""

from __future__ import annotations

import contextlib
from typing import Any, Self
from uuid import uuid4

import discovery.publisher as _pub
import discovery.subscriber as _sub
from discovery import paths
from discovery.errors import NamespaceInUse
from discovery.info import WorkerInfo
from discovery.lock import RegistryLock
from discovery.notify import Notifier
from discovery.ownership import Ownership, owner_pid
from discovery.registry import Registry


class LocalDiscovery:
    """Worker discovery on one machine through a registry in shared memory.

    :param namespace: the registry's name; a fresh one (``pool-<hex>``) if None.
    :param capacity: how many workers may be registered at once.
    :param block_size: bytes for each worker's encoded :class:`WorkerInfo`.
    :param exclusive: refuse a namespace that a live process owns instead of
        attaching to it (a pool's supervisor must own its namespace).
    :raises InvalidNamespace: (a ``ValueError``) for a bad name.
    :raises ValueError: if ``capacity`` or ``block_size`` is out of range.

    Entering raises :class:`NamespaceInUse` if ``exclusive`` and a live
    process owns the namespace, :class:`RegistryMismatch` if the namespace
    exists with another capacity or block size, :class:`RegistryCorrupt` if
    it holds something else, and :class:`LockTimeout` if its lock stays held.
    Entering may wait for that lock: call it off the event loop.
    """

    Publisher = _pub.Publisher
    Subscriber = _sub.Subscriber

    def __init__(
        self,
        namespace: str | None = None,
        *,
        capacity: int = 128,
        block_size: int = 1024,
        exclusive: bool = False,
    ) -> None:
        self._namespace = paths.validate_namespace(
            f"pool-{uuid4().hex[:12]}" if namespace is None else namespace
        )
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self._capacity, self._block_size = capacity, block_size
        self._exclusive = exclusive
        self._registry: Registry | None = None
        self._ownership: Ownership | None = None

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
                ownership = Ownership.claim(self._namespace)
                if ownership is None:
                    self._registry = self._attach()
                else:
                    self._ownership = ownership
                    self._registry = self._create()
        finally:
            lock.close()
        if self._registry.created:
            _notify(self._namespace, self._registry.generation)
        return self

    def _attach(self) -> Registry:
        if self._exclusive:
            raise NamespaceInUse(self._namespace, owner_pid(self._namespace) or 0)
        registry = Registry.attach(self._namespace)
        try:
            registry.check_layout(self._capacity, self._block_size)
        except BaseException:
            registry.close()
            raise
        return registry

    def _create(self) -> Registry:
        """Create the registry as its owner, over what a dead owner left."""
        Registry.unlink_name(self._namespace)  # a dead owner's, if any
        try:
            return Registry.create(
                self._namespace, capacity=self._capacity, block_size=self._block_size
            )
        except BaseException:
            self._release_ownership()
            raise

    def __exit__(self, *exc_info: Any) -> None:
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
            self._release_ownership()

    def _release_ownership(self) -> None:
        if self._ownership is not None:
            self._ownership.release()
            self._ownership = None

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


def _notify(namespace: str, generation: int) -> None:
    notifier = Notifier(namespace)
    try:
        notifier.notify(generation)
    finally:
        notifier.close()
