"""Errors of the pool, under :class:`PoolError`.

The dispatcher raises some of these on behalf of a task and they travel to
the client pickled, so each keeps its constructor's arguments in ``args``
(what pickling replays) and builds its message in ``__str__``.
"""

from __future__ import annotations


class PoolError(Exception):
    """Root of every error this package raises."""


class PoolNotRunning(PoolError, ConnectionError):
    """No pool serves the namespace. Start one, then retry."""

    def __init__(self, namespace: str, detail: str = "") -> None:
        super().__init__(namespace, detail)
        self.namespace, self.detail = namespace, detail

    def __str__(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        return (
            f"no pool is running in namespace {self.namespace!r}{why}; start one "
            f"with `python -m pool up --namespace {self.namespace}`"
        )


class PoolAlreadyRunning(PoolError):
    """A live pool already owns the namespace."""

    def __init__(self, namespace: str, pid: int) -> None:
        super().__init__(namespace, pid)
        self.namespace, self.pid = namespace, pid

    def __str__(self) -> str:
        return (
            f"a pool already runs in namespace {self.namespace!r} (pid {self.pid}); "
            f"stop it with `python -m pool down --namespace {self.namespace}` or "
            f"choose another --namespace"
        )


class NoWorkerAvailable(PoolError, TimeoutError):
    """No ready worker (with the task's tags) appeared within the wait."""

    def __init__(self, tags: tuple[str, ...], waited_s: float) -> None:
        super().__init__(tags, waited_s)
        self.tags, self.waited_s = tags, waited_s

    def __str__(self) -> str:
        needs = f" with tags {', '.join(self.tags)}" if self.tags else ""
        return (
            f"no ready worker{needs} for {self.waited_s:g} s; start workers "
            f"(`python -m pool up --workers N`) or check the task's tags"
        )


class WorkerLost(PoolError):
    """The task's worker died under it too many times: the task may be what
    kills them (a poison task), so it is not run again."""

    def __init__(self, attempts: int, workers: tuple[str, ...]) -> None:
        super().__init__(attempts, workers)
        self.attempts, self.workers = attempts, workers

    def __str__(self) -> str:
        return (
            f"the task was lost with its worker {self.attempts} time(s) "
            f"({'; '.join(self.workers)}); not retrying it"
        )
