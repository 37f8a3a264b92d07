"""Publishing workers into a namespace's registry.

:class:`Publisher` is what a worker (or anything announcing workers) uses;
it needs only the namespace string. It writes slots under the registry lock
(see :mod:`discovery.registry`) and then wakes subscribers by writing to the
namespace's notification file (:class:`Notifier`). It holds each added
worker's liveness lock (:mod:`discovery.liveness`) until the worker is
dropped, so a killed publisher's workers are reaped by subscribers. It
drops, when it closes, every worker it added and did not drop, so a clean
exit leaves nothing behind. It owns its lock and notification descriptors,
its liveness locks and its mapping; nothing else.
"""

from __future__ import annotations

import os
from typing import Any, Self, assert_never
from uuid import UUID

from discovery import paths
from discovery.errors import (
    NamespaceNotFound,
    RegistryFull,
    UnknownEventType,
    WorkerAlreadyRegistered,
    WorkerInfoTooLarge,
    WorkerNotRegistered,
)
from discovery.info import EVENT_TYPES, EventType, WorkerInfo
from discovery.liveness import Liveness, forget, pid_namespace
from discovery.lock import LOCK_TIMEOUT_S, RegistryLock
from discovery.notify import Notifier
from discovery.registry import Registry


class Publisher:
    """Publishes :class:`WorkerInfo` lifecycle events into a namespace.

    Use as ``async with Publisher(ns) as publisher: await publisher.publish(...)``.

    :param namespace: the namespace to publish into; its registry must exist.
    :param lock_timeout_s: the longest wait for the registry lock.
    :raises InvalidNamespace: if ``namespace`` is not a valid name.
    """

    def __init__(self, namespace: str, *, lock_timeout_s: float = LOCK_TIMEOUT_S):
        self._namespace = paths.validate_namespace(namespace)
        if lock_timeout_s <= 0:
            raise ValueError(f"lock_timeout_s must be positive, got {lock_timeout_s}")
        self._lock_timeout_s = lock_timeout_s
        self._lock: RegistryLock | None = None
        self._registry: Registry | None = None
        self._notifier: Notifier | None = None
        self._added: dict[UUID, int] = {}  # workers this publisher added -> slot
        self._liveness: dict[UUID, Liveness] = {}

    @property
    def namespace(self) -> str:
        """The namespace this publisher writes to."""
        return self._namespace

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def _open(self) -> tuple[RegistryLock, Registry]:
        if self._lock is not None and self._registry is not None:
            return self._lock, self._registry
        lock = RegistryLock(self._namespace, self._lock_timeout_s)
        try:
            async with lock.hold_async():
                registry = Registry.attach(self._namespace)
            self._notifier = Notifier(self._namespace)
        except BaseException:
            lock.close()
            raise
        self._lock, self._registry = lock, registry
        return lock, registry

    async def publish(self, type: EventType, worker_info: WorkerInfo) -> None:
        """Publish one lifecycle event of a worker.

        :param type: ``"worker-added"``, ``"worker-updated"`` or
            ``"worker-dropped"``.
        :param worker_info: the worker; a drop needs only its ``uid``.
        :raises UnknownEventType: for any other ``type``.
        :raises NamespaceNotFound: if the namespace has no registry (or its
            owner closed it).
        :raises WorkerInfoTooLarge: if the info does not fit a block.
        :raises RegistryFull: if no slot is free for an added worker.
        :raises WorkerAlreadyRegistered: on adding a registered uid.
        :raises WorkerNotRegistered: on updating or dropping an unknown uid.
        :raises LockTimeout: if the registry lock stayed held too long.
        """
        if type not in EVENT_TYPES:
            raise UnknownEventType(type)
        lock, registry = await self._open()
        data = worker_info.encode()
        if len(data) > registry.block_size:
            raise WorkerInfoTooLarge(worker_info.uid, len(data), registry.block_size)
        async with lock.hold_async():
            if registry.closed:
                raise NamespaceNotFound(self._namespace)
            changed = self._apply(registry, type, worker_info, data)
            generation = registry.generation
        if changed and self._notifier is not None:
            self._notifier.notify(generation)

    def _apply(
        self, registry: Registry, type: EventType, info: WorkerInfo, data: bytes
    ) -> bool:
        """Write one event under the lock; False when nothing changed."""
        uid = info.uid
        index = registry.find(uid, self._added.get(uid))
        match type:
            case "worker-added":
                if index is not None:
                    raise WorkerAlreadyRegistered(self._namespace, uid)
                index = registry.find_free()
                if index is None:
                    raise RegistryFull(self._namespace, registry.capacity)
                # Lock before the slot exists: a death from here on is seen.
                self._liveness[uid] = Liveness.hold(self._namespace, uid)
                registry.write_slot(index, uid, data, os.getpid(), pid_namespace())
                self._added[uid] = index
            case "worker-updated":
                if index is None:
                    raise WorkerNotRegistered(self._namespace, uid)
                current = registry.read_slot(index)
                if current is None or current.data == data:
                    return False  # unchanged (None: never, under the lock)
                registry.write_slot(index, uid, data, current.pid, current.pidns)
            case "worker-dropped":
                if index is None:
                    raise WorkerNotRegistered(self._namespace, uid)
                registry.write_slot(index, None, b"")
                self._added.pop(uid, None)
                self._release(uid)
            case _:
                assert_never(type)
        return True

    def _release(self, uid: UUID) -> None:
        """Let go of a dropped worker's liveness (or forget a dead one's)."""
        held = self._liveness.pop(uid, None)
        if held is not None:
            held.release()
        else:
            forget(self._namespace, uid)

    async def aclose(self) -> None:
        """Drop the workers this publisher added and still holds; release all.

        Never raises over an error already unwinding; a registry that is
        gone or closed has nothing left to drop.
        """
        lock, registry, notifier = self._lock, self._registry, self._notifier
        self._lock = self._registry = self._notifier = None
        try:
            if lock is not None and registry is not None and self._added:
                async with lock.hold_async():
                    if not registry.closed:
                        for uid, hint in self._added.items():
                            index = registry.find(uid, hint)
                            if index is not None:
                                registry.write_slot(index, None, b"")
                    generation = registry.generation
                if notifier is not None:
                    notifier.notify(generation)
        finally:
            self._added.clear()
            for uid in list(self._liveness):
                self._release(uid)
            for resource in (registry, notifier, lock):
                if resource is not None:
                    resource.close()
