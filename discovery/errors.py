"""Errors raised by :mod:`discovery`, and :class:`Facts`, the form of
every error of the project that has facts.

Every error derives from :class:`DiscoveryError`. Each leaf names one
condition, keeps its facts as attributes (its fields: see :class:`Facts`)
and says in its message what to do next. Where a builtin category fits
(``ValueError`` for bad input, ``TimeoutError`` for a wait that ran out),
the leaf subclasses it too, so callers may catch either.
"""

from __future__ import annotations

import dataclasses
from typing import Any, dataclass_transform
from uuid import UUID


@dataclass_transform(eq_default=False)
class Facts(Exception):
    """An error with facts (each leaf here, and in
    :mod:`workers.protocol.errors` and :mod:`pool.errors`): it declares them
    as fields, as a dataclass does, and says its message in ``__str__``.
    Each fact is an attribute, and its ``args`` are its facts, which
    pickling replays: an error raised in a task reaches its client as
    itself, facts and message. (Not frozen: raising sets its traceback.)
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(eq=False)(cls)

    def __post_init__(self) -> None:
        # (BaseException's: an OSError's own would read the facts as errno.)
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        BaseException.__init__(self, *(getattr(self, f.name) for f in fields))


class DiscoveryError(Exception):
    """Root of every error this package raises."""


class InvalidNamespace(Facts, DiscoveryError, ValueError):
    """A namespace name is not of the accepted form."""

    namespace: object
    reason: str

    def __str__(self) -> str:
        return (
            f"invalid namespace {self.namespace!r}: {self.reason}; use 1 to 64 ASCII "
            f"letters, digits, '-', '_' or '.'"
        )


class NamespaceNotFound(Facts, DiscoveryError, LookupError):
    """No registry exists for the namespace. A retry helps once one is made."""

    namespace: str

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} has no registry; start the pool (or open "
            f"LocalDiscovery({self.namespace!r})) before publishing to it"
        )


class NamespaceInUse(Facts, DiscoveryError):
    """The namespace's registry belongs to a live process."""

    namespace: str
    pid: int

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} belongs to live process {self.pid}; stop it "
            f"or use another namespace"
        )


class RegistryMismatch(Facts, DiscoveryError, ValueError):
    """The namespace exists with a layout other than the one asked for."""

    namespace: str
    capacity: int
    block_size: int
    found: str

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} already exists with {self.found}, not "
            f"capacity {self.capacity} and block size {self.block_size}; pass the "
            f"existing values or use another namespace"
        )


class RegistryCorrupt(Facts, DiscoveryError):
    """The namespace's segment does not hold a registry this version knows.

    Nothing is written to it. Stop whatever owns the namespace, or use another.
    """

    namespace: str
    reason: str

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} holds no usable registry ({self.reason}); "
            f"it was left untouched: stop the process that owns it or use another "
            f"namespace"
        )


class UnsafeRuntimeDirectory(Facts, DiscoveryError, PermissionError):
    """A runtime path could be redirected or read by another user."""

    path: object
    reason: str
    fix: str

    def __str__(self) -> str:
        return f"refusing {self.path}: {self.reason}; {self.fix}"


class RegistryFull(Facts, DiscoveryError):
    """Every slot of the namespace is taken. A drop frees one."""

    namespace: str
    capacity: int

    def __str__(self) -> str:
        return (
            f"namespace {self.namespace!r} is full ({self.capacity} workers); stop a "
            f"worker or start the pool with a larger --capacity"
        )


class WorkerInfoTooLarge(Facts, DiscoveryError, ValueError):
    """A serialized ``WorkerInfo`` does not fit its slot's block."""

    uid: UUID
    size: int
    block_size: int

    def __str__(self) -> str:
        return (
            f"worker {self.uid} encodes to {self.size} bytes but a block holds "
            f"{self.block_size}; shorten its tags and extra, or create the namespace "
            f"with a larger block_size"
        )


class WorkerNotRegistered(Facts, DiscoveryError, LookupError):
    """An update or drop named a worker that is not in the registry."""

    namespace: str
    uid: UUID

    def __str__(self) -> str:
        return (
            f"worker {self.uid} is not registered in namespace {self.namespace!r}; "
            f"publish 'worker-added' first (it may have been reaped)"
        )


class WorkerAlreadyRegistered(Facts, DiscoveryError, ValueError):
    """A ``worker-added`` named a uid that is already registered."""

    namespace: str
    uid: UUID

    def __str__(self) -> str:
        return (
            f"worker {self.uid} is already registered in namespace {self.namespace!r}; "
            f"publish 'worker-updated' to change it"
        )


class UnknownEventType(Facts, DiscoveryError, ValueError):
    """An event type outside the three lifecycle events."""

    type: object

    def __str__(self) -> str:
        return (
            f"unknown discovery event type {self.type!r}; expected 'worker-added', "
            f"'worker-updated' or 'worker-dropped'"
        )


class LockTimeout(Facts, DiscoveryError, TimeoutError):
    """The registry lock stayed held past the bounded wait. A retry may help."""

    namespace: str
    timeout_s: float

    def __str__(self) -> str:
        return (
            f"the registry lock of namespace {self.namespace!r} was held for more "
            f"than {self.timeout_s:g} s; a process holding it may be stuck (see "
            f"`fuser` on its lock file) or the wait may need raising"
        )
