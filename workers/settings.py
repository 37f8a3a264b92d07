"""The settings of a worker (:class:`WorkerSettings`, ``python -m
workers``), each declared once as a :class:`~workers.common.spec.Spec`
(:mod:`workers.common.spec` says how); ``pool up`` takes the same ones and
hands them to its workers. Those other processes take too are
:mod:`workers.common.options`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from workers.common.options import (
    DISCOVERY,
    NAMESPACE,
    REDIS_URLS,
    TLS_CERT,
    TOKEN_FILE,
    FromParent,
    Listening,
    check_tcp,
)
from workers.common.spec import Group, Spec, check
from workers.limits import parse_size
from workers.protocol.codec import MAX_ARGS_BYTES, MAX_ARGS_LIMIT

CONCURRENCY: Final = Spec(
    1, "tasks each worker runs at once: threads for plain functions", low=1
)
TAGS: Final = Spec((), "comma-separated labels that tasks may require", form="csv")
GRACE_S: Final = Spec(
    30.0,
    "on SIGTERM, how long a draining worker may finish its tasks",
    low=0,
    metavar="SECONDS",
)
MAX_ARGS_BYTES_SPEC: Final = Spec(
    MAX_ARGS_BYTES,
    "refuse a task whose arguments carried in its message are larger, with "
    "RESOURCE_EXHAUSTED (large ones from clients of this machine go through "
    "shared memory instead, and are not counted)",
    flag="--max-args-bytes",
    low=0,
    high=MAX_ARGS_LIMIT,
)
MAX_TASKS_PER_CHILD: Final = Spec(
    0,
    "retire a worker once it has run N tasks: it hands back what it holds, "
    "finishes, exits, and is replaced (0: never)",
    low=0,
)
MAX_MEMORY: Final = Spec(
    None,
    "retire a worker whose resident memory is over SIZE (2GB, 512MiB) after "
    "a task; a task that takes it past 1.5 x SIZE while it runs ends the "
    "worker (an attempt of that task, as any death)",
    metavar="SIZE",
    check=parse_size,
)
SHM_LIMIT: Final = Spec(
    None,
    "the most that large arguments and results may hold in shared memory at "
    "once, over all of the pool's clients and workers (2GB, 512MiB): past it a "
    "task fails with SharedMemoryFull (default: what /dev/shm has)",
    metavar="SIZE",
    check=lambda value: parse_size(value, "shm_limit"),
)
INITIALIZER: Final = Spec(
    None,
    "run MODULE:FUNCTION in each worker before its first task, and in each "
    "replacement; after 3 failures in a row the pool starts no more workers, "
    "and every task fails with InitializerFailed",
    metavar="MODULE:FUNCTION",
)
INITARGS: Final = Spec(
    (),
    "an argument for --initializer, a string (repeatable, in order)",
    flag="--initarg",
    form="append",
    metavar="ARG",
)
PATHS: Final = Spec(
    (),
    "import task modules from DIR first (repeatable)",
    flag="--path",
    form="append",
    metavar="DIR",
)
RELOAD: Final = Spec(
    False,
    "import a task's module again when its source file has changed (only that "
    "module, not the ones it imports)",
    form="switch",
)


@dataclass(frozen=True)
class Limits(Group):
    """What a worker takes and holds before it refuses or retires; ``pool
    up`` takes the same and gives them to its workers."""

    TITLE = "each worker's limits"

    max_args_bytes: int = MAX_ARGS_BYTES_SPEC.field()
    max_tasks_per_child: int = MAX_TASKS_PER_CHILD.field()
    max_memory: str | int | None = MAX_MEMORY.field()
    shm_limit: str | int | None = SHM_LIMIT.field()

    @property
    def shm_limit_bytes(self) -> int | None:
        """:attr:`shm_limit` in bytes (None: no limit but /dev/shm's)."""
        return parse_size(self.shm_limit, "shm_limit") if self.shm_limit else None


@dataclass(frozen=True)
class WorkerSettings(FromParent, Listening, Limits):
    """One worker's settings (``python -m workers``)."""

    namespace: str = NAMESPACE.field()
    concurrency: int = CONCURRENCY.field(
        help="tasks run at once: threads for plain functions"
    )
    tags: tuple[str, ...] = TAGS.field()
    grace_s: float = GRACE_S.field()
    initializer: str | None = INITIALIZER.field()
    initargs: tuple[str, ...] = INITARGS.field()
    initializer_pickle: str | None = Spec(
        None, "the Pool(initializer=...) given, pickled, in base64", metavar="TEXT"
    ).field()
    paths: tuple[str, ...] = PATHS.field()
    reload: bool = RELOAD.field()
    discovery_url: str | None = DISCOVERY.field(
        help=f"publish into the registry at {REDIS_URLS}, not shared memory"
    )
    token_file: str | None = TOKEN_FILE.field()
    # Fields of the groups, in a worker's words (each keeps its group's place).
    shm_limit: str | int | None = SHM_LIMIT.field(
        help="the most this worker's large results may make the namespace's "
        "shared memory hold (pool up passes its --shm-limit)"
    )
    tls_cert: str | None = TLS_CERT.field(
        help=TLS_CERT.help + "; the dispatcher checks it against its --tls-ca"
    )

    def __post_init__(self) -> None:
        check(self)
        check_tcp(self)
        object.__setattr__(self, "paths", tuple(map(os.path.abspath, self.paths)))
