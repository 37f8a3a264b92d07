"""shm-pool: run tasks in a pool of worker processes that find each other
through shared memory.

``python -m pool up`` starts a pool; :class:`Client` (an Executor) and
:class:`AsyncClient` use one; :class:`Pool` starts one inside this process.
"""

import os

# gRPC's fork handlers crash children forked while its threads run (seen
# here as a SIGSEGV in a worker started from a process with a live client);
# pool processes are forked from the zygote, never from this one. Must
# precede any grpc import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from pool.client import AsyncClient, Client
from pool.embedded import Pool
from pool.errors import (
    NoWorkerAvailable,
    PoolAlreadyRunning,
    PoolError,
    PoolNotRunning,
    PoolStopping,
    ProtocolMismatch,
    WorkerLost,
)
from workers.tasks import (
    ArgumentsTooLarge,
    BadTask,
    FunctionNotFound,
    NotCallable,
    RemoteError,
    RemoteTraceback,
    TaskIdReused,
    TaskTimeout,
)

__all__ = [
    "ArgumentsTooLarge",
    "AsyncClient",
    "BadTask",
    "Client",
    "FunctionNotFound",
    "NoWorkerAvailable",
    "NotCallable",
    "Pool",
    "PoolAlreadyRunning",
    "PoolError",
    "PoolNotRunning",
    "PoolStopping",
    "ProtocolMismatch",
    "RemoteError",
    "RemoteTraceback",
    "TaskIdReused",
    "TaskTimeout",
    "WorkerLost",
]
