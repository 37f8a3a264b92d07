"""Errors raised by :mod:`discovery`.

Every error derives from :class:`DiscoveryError`. Each leaf names one
condition, keeps its facts as attributes and says in its message what to do
next. The facts are also its ``args``, what pickling replays, and the
message is made in ``__str__``, so that an error raised in a task reaches
its client as itself. Where a builtin category fits (``ValueError`` for
bad input, ``TimeoutError`` for a wait that ran out), the leaf subclasses
it too, so callers may catch either.
"""

from __future__ import annotations

from uuid import UUID


class DiscoveryError(Exception):
    """Root of every error this package raises."""


class InvalidNamespace(DiscoveryError, ValueError):
    """A namespace name is not of the accepted form."""

    def __init__(self, namespace: object, reason: str) -> None:
        super().__init__(namespace, reason)
        self.namespace, self.reason = namespace, reason

    def __str__(self) -> str:
        return (
            f"invalid namespace {self.namespace!r}: {self.reason}; use 1 to 64 ASCII "
            f"letters, digits, '-', '_' or '.'"
        )


class NamespaceNotFound(DiscoveryError, LookupError):
    """No registry exists for the namespace. A retry helps once one is made."""

    def __init__(self, namespace: str) -> None:
        super().__init__(namespace)
        self.namespace = namespace

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} has no registry; start the pool (or open "
            f"LocalDiscovery({self.namespace!r})) before publishing to it"
        )


class NamespaceInUse(DiscoveryError):
    """The namespace's registry belongs to a live process."""

    def __init__(self, namespace: str, pid: int) -> None:
        super().__init__(namespace, pid)
        self.namespace, self.pid = namespace, pid

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} belongs to live process {self.pid}; stop it "
            f"or use another namespace"
        )


class RegistryMismatch(DiscoveryError, ValueError):
    """The namespace exists with a layout other than the one asked for."""

    def __init__(
        self, namespace: str, capacity: int, block_size: int, found: str
    ) -> None:
        super().__init__(namespace, capacity, block_size, found)
        self.namespace, self.capacity, self.block_size, self.found = (
            namespace,
            capacity,
            block_size,
            found,
        )

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} already exists with {self.found}, not "
            f"capacity {self.capacity} and block size {self.block_size}; pass the "
            f"existing values or use another namespace"
        )


class RegistryCorrupt(DiscoveryError):
    """The namespace's segment does not hold a registry this version knows.

    Nothing is written to it. Stop whatever owns the namespace, or use another.
    """

    def __init__(self, namespace: str, reason: str) -> None:
        super().__init__(namespace, reason)
        self.namespace, self.reason = namespace, reason

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} holds no usable registry ({self.reason}); "
            f"it was left untouched: stop the process that owns it or use another "
            f"namespace"
        )


class UnsafeRuntimeDirectory(DiscoveryError, PermissionError):
    """A runtime path could be redirected or read by another user."""

    def __init__(self, path: object, reason: str, fix: str) -> None:
        super().__init__(path, reason, fix)
        self.path, self.reason, self.fix = path, reason, fix

    def __str__(self) -> str:
        return f"refusing {self.path}: {self.reason}; {self.fix}"


class RegistryFull(DiscoveryError):
    """Every slot of the namespace is taken. A drop frees one."""

    def __init__(self, namespace: str, capacity: int) -> None:
        super().__init__(namespace, capacity)
        self.namespace, self.capacity = namespace, capacity

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} is full ({self.capacity} workers); stop a "
            f"worker or start the pool with a larger --capacity"
        )


class WorkerInfoTooLarge(DiscoveryError, ValueError):
    """A serialized ``WorkerInfo`` does not fit its slot's block."""

    def __init__(self, uid: UUID, size: int, block_size: int) -> None:
        super().__init__(uid, size, block_size)
        self.uid, self.size, self.block_size = uid, size, block_size

    def __str__(self) -> str:
        return (
            f"worker {self.uid} encodes to {self.size} bytes but a block holds "
            f"{self.block_size}; shorten its tags and extra, or create the namespace "
            f"with a larger block_size"
        )


class WorkerNotRegistered(DiscoveryError, LookupError):
    """An update or drop named a worker that is not in the registry."""

    def __init__(self, namespace: str, uid: UUID) -> None:
        super().__init__(namespace, uid)
        self.namespace, self.uid = namespace, uid

    def __str__(self) -> str:
        return (
            f"worker {self.uid} is not registered in namespace {self.namespace!r}; "
            f"publish 'worker-added' first (it may have been reaped)"
        )


class WorkerAlreadyRegistered(DiscoveryError, ValueError):
    """A ``worker-added`` named a uid that is already registered."""

    def __init__(self, namespace: str, uid: UUID) -> None:
        super().__init__(namespace, uid)
        self.namespace, self.uid = namespace, uid

    def __str__(self) -> str:
        return (
            f"worker {self.uid} is already registered in namespace {self.namespace!r}; "
            f"publish 'worker-updated' to change it"
        )


class UnknownEventType(DiscoveryError, ValueError):
    """An event type outside the three lifecycle events."""

    def __init__(self, type: object) -> None:
        super().__init__(type)
        self.type = type

    def __str__(self) -> str:
        return (
            f"unknown discovery event type {self.type!r}; expected 'worker-added', "
            f"'worker-updated' or 'worker-dropped'"
        )


class LockTimeout(DiscoveryError, TimeoutError):
    """The registry lock stayed held past the bounded wait. A retry may help."""

    def __init__(self, namespace: str, timeout_s: float) -> None:
        super().__init__(namespace, timeout_s)
        self.namespace, self.timeout_s = namespace, timeout_s

    def __str__(self) -> str:
        return (
            f"the registry lock of namespace {self.namespace!r} was held for more "
            f"than {self.timeout_s:g} s; a process holding it may be stuck (see "
            f"`fuser` on its lock file) or the wait may need raising"
        )
