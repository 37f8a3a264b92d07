"""Errors raised by :mod:`discovery`.

Every error derives from :class:`DiscoveryError`. Each leaf names one
condition, keeps its facts as attributes and says in its message what to do
next. Where a builtin category fits (``ValueError`` for bad input,
``TimeoutError`` for a wait that ran out), the leaf subclasses it too, so
callers may catch either.
"""

from __future__ import annotations

from uuid import UUID


class DiscoveryError(Exception):
    """Root of every error this package raises."""


class InvalidNamespace(DiscoveryError, ValueError):
    """A namespace name is not of the accepted form."""

    def __init__(self, namespace: object, reason: str) -> None:
        self.namespace, self.reason = namespace, reason
        super().__init__(
            f"invalid namespace {namespace!r}: {reason}; use 1 to 64 ASCII "
            f"letters, digits, '-', '_' or '.'"
        )


class NamespaceNotFound(DiscoveryError, LookupError):
    """No registry exists for the namespace. A retry helps once one is made."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        super().__init__(
            f"namespace {namespace!r} has no registry; start the pool (or open "
            f"LocalDiscovery({namespace!r})) before publishing to it"
        )


class NamespaceInUse(DiscoveryError):
    """The namespace's registry belongs to a live process."""

    def __init__(self, namespace: str, pid: int) -> None:
        self.namespace, self.pid = namespace, pid
        super().__init__(
            f"namespace {namespace!r} belongs to live process {pid}; stop it "
            f"or use another namespace"
        )


class RegistryMismatch(DiscoveryError, ValueError):
    """The namespace exists with a layout other than the one asked for."""

    def __init__(
        self, namespace: str, *, capacity: int, block_size: int, found: str
    ) -> None:
        self.namespace, self.capacity, self.block_size = namespace, capacity, block_size
        super().__init__(
            f"namespace {namespace!r} already exists with {found}, not capacity "
            f"{capacity} and block size {block_size}; pass the existing values "
            f"or use another namespace"
        )


class RegistryCorrupt(DiscoveryError):
    """The namespace's segment does not hold a registry this version knows.

    Nothing is written to it. Stop whatever owns the namespace, or use another.
    """

    def __init__(self, namespace: str, reason: str) -> None:
        self.namespace, self.reason = namespace, reason
        super().__init__(
            f"namespace {namespace!r} holds no usable registry ({reason}); it was "
            f"left untouched: stop the process that owns it or use another namespace"
        )


class UnsafeRuntimeDirectory(DiscoveryError, PermissionError):
    """A runtime path could be redirected or read by another user."""

    def __init__(self, path: object, reason: str, fix: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"refusing {path}: {reason}; {fix}")


class RegistryFull(DiscoveryError):
    """Every slot of the namespace is taken. A drop frees one."""

    def __init__(self, namespace: str, capacity: int) -> None:
        self.namespace, self.capacity = namespace, capacity
        super().__init__(
            f"namespace {namespace!r} is full ({capacity} workers); stop a "
            f"worker or start the pool with a larger --capacity"
        )


class WorkerInfoTooLarge(DiscoveryError, ValueError):
    """A serialized ``WorkerInfo`` does not fit its slot's block."""

    def __init__(self, uid: UUID, size: int, block_size: int) -> None:
        self.uid, self.size, self.block_size = uid, size, block_size
        super().__init__(
            f"worker {uid} encodes to {size} bytes but a block holds "
            f"{block_size}; shorten its tags and extra, or create the namespace "
            f"with a larger block_size"
        )


class WorkerNotRegistered(DiscoveryError, LookupError):
    """An update or drop named a worker that is not in the registry."""

    def __init__(self, namespace: str, uid: UUID) -> None:
        self.namespace, self.uid = namespace, uid
        super().__init__(
            f"worker {uid} is not registered in namespace {namespace!r}; "
            f"publish 'worker-added' first (it may have been reaped)"
        )


class WorkerAlreadyRegistered(DiscoveryError, ValueError):
    """A ``worker-added`` named a uid that is already registered."""

    def __init__(self, namespace: str, uid: UUID) -> None:
        self.namespace, self.uid = namespace, uid
        super().__init__(
            f"worker {uid} is already registered in namespace {namespace!r}; "
            f"publish 'worker-updated' to change it"
        )


class UnknownEventType(DiscoveryError, ValueError):
    """An event type outside the three lifecycle events."""

    def __init__(self, type: object) -> None:
        self.type = type
        super().__init__(
            f"unknown discovery event type {type!r}; expected 'worker-added', "
            f"'worker-updated' or 'worker-dropped'"
        )


class LockTimeout(DiscoveryError, TimeoutError):
    """The registry lock stayed held past the bounded wait. A retry may help."""

    def __init__(self, namespace: str, timeout_s: float) -> None:
        self.namespace, self.timeout_s = namespace, timeout_s
        super().__init__(
            f"the registry lock of namespace {namespace!r} was held for more "
            f"than {timeout_s:g} s; a process holding it may be stuck (see "
            f"`fuser` on its lock file) or the wait may need raising"
        )
