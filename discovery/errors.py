"""Errors raised by :mod:`discovery`, and :class:`Facts`, the form of
every error of the project that has facts.

Every error derives from :class:`DiscoveryError`, and that from
:class:`PoolError`, the root of every error of the project. Each leaf names one
condition, keeps its facts as attributes (its fields: see :class:`Facts`)
and says in its message what to do next. Where a builtin category fits
(``ValueError`` for bad input, ``TimeoutError`` for a wait that ran out),
the leaf subclasses it too, so callers may catch either.
"""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Any, ClassVar, dataclass_transform
from uuid import UUID


@dataclass_transform(eq_default=False)
class Facts(Exception):
    """An error with facts (each leaf here, and in
    :mod:`workers.protocol.errors` and :mod:`pool.errors`): it declares them
    as fields, as a dataclass does, and its message as :attr:`MESSAGE`, a
    :meth:`str.format` template of them (a leaf whose message depends on
    its facts' values says it in ``__str__`` instead). Each fact is an
    attribute, and its ``args`` are its facts, which pickling replays: an
    error raised in a task reaches its client as itself, facts and message.
    (Not frozen: raising sets its traceback.)
    """

    MESSAGE: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(eq=False)(cls)
        if not cls.MESSAGE and cls.__str__ is Facts.__str__:
            raise TypeError(
                f"{cls.__name__} says nothing: give it a MESSAGE or a __str__"
            )
        facts = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for _, field, _, _ in string.Formatter().parse(cls.MESSAGE):
            name = None if field is None else re.split(r"[.\[]", field)[0]
            if name is not None and name not in facts:  # (at import, not raise)
                raise TypeError(
                    f"{cls.__name__}.MESSAGE names {{{name}}}, which is not "
                    f"one of its facts ({', '.join(sorted(facts)) or 'none'})"
                )

    def __post_init__(self) -> None:
        # (BaseException's: an OSError's own would read the facts as errno.)
        BaseException.__init__(self, *self._facts().values())

    def __str__(self) -> str:
        return self.MESSAGE.format_map(self._facts())

    def _facts(self) -> dict[str, Any]:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {f.name: getattr(self, f.name) for f in fields}


class PoolError(Exception):
    """Root of every error that shm-pool raises, in :mod:`pool`,
    :mod:`workers` and :mod:`discovery` alike: ``except pool.PoolError``
    catches each of them (``pool.PoolError`` is this class). Each leaf
    keeps a builtin base where one fits, so ``except TimeoutError`` still
    catches a :class:`~workers.protocol.errors.TaskTimeout`."""


class DiscoveryError(PoolError):
    """Root of every error this package raises."""


class InvalidNamespace(Facts, DiscoveryError, ValueError):
    """A namespace name is not of the accepted form."""

    namespace: object
    reason: str

    MESSAGE = (
        "invalid namespace {namespace!r}: {reason}; use 1 to 64 ASCII "
        "letters, digits, '-', '_' or '.'"
    )


class NamespaceNotFound(Facts, DiscoveryError, LookupError):
    """No registry exists for the namespace. A retry helps once one is made."""

    namespace: str

    MESSAGE = (
        "namespace {namespace!r} has no registry; start the pool (or open "
        "LocalDiscovery({namespace!r})) before publishing to it"
    )


class NamespaceInUse(Facts, DiscoveryError):
    """The namespace's registry belongs to a live process."""

    namespace: str
    pid: int

    MESSAGE = (
        "namespace {namespace!r} belongs to live process {pid}; stop it "
        "or use another namespace"
    )


class RegistryMismatch(Facts, DiscoveryError, ValueError):
    """The namespace exists with a layout other than the one asked for."""

    namespace: str
    capacity: int
    block_size: int
    found: str

    MESSAGE = (
        "namespace {namespace!r} already exists with {found}, not "
        "capacity {capacity} and block size {block_size}; pass the "
        "existing values or use another namespace"
    )


class RegistryCorrupt(Facts, DiscoveryError):
    """The namespace's segment does not hold a registry this version knows.

    Nothing is written to it. Stop whatever owns the namespace, or use another.
    """

    namespace: str
    reason: str

    MESSAGE = (
        "namespace {namespace!r} holds no usable registry ({reason}); "
        "it was left untouched: stop the process that owns it or use another "
        "namespace"
    )


class UnsafeRuntimeDirectory(Facts, DiscoveryError, PermissionError):
    """A runtime path could be redirected or read by another user."""

    path: object
    reason: str
    fix: str

    MESSAGE = "refusing {path}: {reason}; {fix}"


class RegistryFull(Facts, DiscoveryError):
    """Every slot of the namespace is taken. A drop frees one."""

    namespace: str
    capacity: int

    MESSAGE = (
        "namespace {namespace!r} is full ({capacity} workers); stop a "
        "worker or start the pool with a larger --capacity"
    )


class WorkerInfoTooLarge(Facts, DiscoveryError, ValueError):
    """A serialized ``WorkerInfo`` does not fit its slot's block."""

    uid: UUID
    size: int
    block_size: int

    MESSAGE = (
        "worker {uid} encodes to {size} bytes but a block holds "
        "{block_size}; shorten its tags and extra, or create the namespace "
        "with a larger block_size"
    )


class WorkerNotRegistered(Facts, DiscoveryError, LookupError):
    """An update or drop named a worker that is not in the registry."""

    namespace: str
    uid: UUID

    MESSAGE = (
        "worker {uid} is not registered in namespace {namespace!r}; "
        "publish 'worker-added' first (it may have been reaped)"
    )


class WorkerAlreadyRegistered(Facts, DiscoveryError, ValueError):
    """A ``worker-added`` named a uid that is already registered."""

    namespace: str
    uid: UUID

    MESSAGE = (
        "worker {uid} is already registered in namespace {namespace!r}; "
        "publish 'worker-updated' to change it"
    )


class UnknownEventType(Facts, DiscoveryError, ValueError):
    """An event type outside the three lifecycle events."""

    type: object

    MESSAGE = (
        "unknown discovery event type {type!r}; expected 'worker-added', "
        "'worker-updated' or 'worker-dropped'"
    )


class LockTimeout(Facts, DiscoveryError, TimeoutError):
    """The registry lock stayed held past the bounded wait. A retry may help."""

    namespace: str
    timeout_s: float

    MESSAGE = (
        "the registry lock of namespace {namespace!r} was held for more "
        "than {timeout_s:g} s; a process holding it may be stuck (see "
        "`fuser` on its lock file) or the wait may need raising"
    )


class RegistryUnreachable(Facts, DiscoveryError, ConnectionError):
    """The registry a pool was told to use does not answer."""

    url: str
    reason: str

    MESSAGE = (
        "cannot reach the registry at {url}: {reason}; start Redis there, "
        "or give another --discovery"
    )
