"""Every error a user of shm-pool can meet, importable by name from here;
all of them derive from :class:`PoolError` (defined in
:mod:`discovery.errors`, the lowest layer, so that :mod:`discovery` and
:mod:`workers` derive from it too).

The errors of the pool itself are defined here. The dispatcher raises some
of them on behalf of a task and they travel to the client pickled: each
with facts is a :class:`~discovery.errors.Facts`, which pickling rebuilds
whole. The rest are those of :mod:`discovery.errors` (namespaces and
registries) and :mod:`workers.protocol.errors` (a task itself).
"""

from __future__ import annotations

from collections.abc import Iterator

from discovery.errors import (
    DiscoveryError,
    Facts,
    InvalidNamespace,
    LockTimeout,
    NamespaceInUse,
    NamespaceNotFound,
    PoolError,
    RegistryCorrupt,
    RegistryFull,
    RegistryMismatch,
    RegistryUnreachable,
    UnknownEventType,
    UnsafeRuntimeDirectory,
    WorkerAlreadyRegistered,
    WorkerInfoTooLarge,
    WorkerNotRegistered,
)
from workers.protocol.errors import (
    ArgumentsTooLarge,
    BadTask,
    DataGone,
    FunctionNotFound,
    InitializerFailed,
    NotCallable,
    RemoteError,
    RemoteTraceback,
    SharedMemoryFull,
    TaskError,
    TaskIdReused,
    TaskTimeout,
    TransferLost,
)


class PoolNotRunning(Facts, PoolError, ConnectionError):
    """No pool serves the namespace. Start one, then retry."""

    namespace: str
    detail: str = ""
    hint: str = ""

    def __str__(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        hint = self.hint or (
            f"start one with `python -m pool up --namespace {self.namespace}`"
        )
        return f"no pool is running in namespace {self.namespace!r}{why}; {hint}"


class PoolStopping(PoolNotRunning):
    """The pool is stopping: the task was never run, or its worker stopped
    before it finished. Submit it again to a pool that runs."""

    def __str__(self) -> str:
        why = self.detail or "this task was never sent to a worker"
        return (
            f"the pool in namespace {self.namespace!r} is stopping ({why}); "
            f"submit the task again once a pool runs there"
        )


class PoolRefused(PoolNotRunning):
    """The pool cannot be used by this client: it refused its token, or the
    client has none for it. Give it the token the pool was started with."""

    def __str__(self) -> str:
        where = f"the pool in namespace {self.namespace!r}"
        return f"{where} refused this client: {self.detail}"


class ProtocolMismatch(Facts, PoolError):
    """The pool and this client speak different versions of the wire
    protocol: install the same shm-pool version on both sides."""

    namespace: str
    detail: str

    MESSAGE = "the pool in namespace {namespace!r} refused us: {detail}"


class PoolAlreadyRunning(Facts, PoolError):
    """A live pool already owns the namespace."""

    namespace: str
    pid: int

    MESSAGE = (
        "a pool already runs in namespace {namespace!r} (pid {pid}); "
        "stop it with `python -m pool down --namespace {namespace}` or "
        "choose another --namespace"
    )


class NoWorkerAvailable(Facts, PoolError, TimeoutError):
    """No ready worker (with the task's tags) appeared within the wait; or,
    once every worker of the pool has started, none has the task's tags
    (``known`` then says which tags the pool's workers have)."""

    tags: tuple[str, ...]
    waited_s: float
    known: tuple[str, ...] | None = None

    def __str__(self) -> str:
        needs = f" with tags {', '.join(self.tags)}" if self.tags else ""
        if self.known is not None:
            have = ", ".join(self.known) if self.known else "none"
            return (
                f"no worker of the pool has tags {', '.join(self.tags)} (the tags "
                f"its workers have: {have}); start workers with them (`pool up "
                f"--tags ...`) or change the task's tags"
            )
        return (
            f"no ready worker{needs} for {self.waited_s:g} s; start workers "
            f"(`python -m pool up --workers N`) or check the task's tags"
        )


class WorkerLost(Facts, PoolError):
    """The task's worker died under it too many times: the task may be what
    kills them (a poison task), so it is not run again.

    ``attempts`` counts the workers that had taken the task when they died;
    ``workers`` says, for each, its pid, uid and how it ended.
    """

    attempts: int
    workers: tuple[str, ...]

    def __str__(self) -> str:
        if not self.workers:
            return (
                f"the task was sent to {self.attempts} workers that each died "
                f"before taking it; not retrying it"
            )
        return (
            f"the task was lost with its worker {self.attempts} time(s) "
            f"({'; '.join(self.workers)}); not retrying it"
        )


def leaves(error: BaseException) -> Iterator[BaseException]:
    """The errors an exception group holds, however nested (or the error)."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from leaves(inner)
    else:
        yield error


__all__ = [
    "ArgumentsTooLarge",
    "BadTask",
    "DataGone",
    "DiscoveryError",
    "FunctionNotFound",
    "InitializerFailed",
    "InvalidNamespace",
    "LockTimeout",
    "NamespaceInUse",
    "NamespaceNotFound",
    "NoWorkerAvailable",
    "NotCallable",
    "PoolAlreadyRunning",
    "PoolError",
    "PoolNotRunning",
    "PoolRefused",
    "PoolStopping",
    "ProtocolMismatch",
    "RegistryCorrupt",
    "RegistryFull",
    "RegistryMismatch",
    "RegistryUnreachable",
    "RemoteError",
    "RemoteTraceback",
    "SharedMemoryFull",
    "TaskError",
    "TaskIdReused",
    "TaskTimeout",
    "TransferLost",
    "UnknownEventType",
    "UnsafeRuntimeDirectory",
    "WorkerAlreadyRegistered",
    "WorkerInfoTooLarge",
    "WorkerLost",
    "WorkerNotRegistered",
    "leaves",
]
