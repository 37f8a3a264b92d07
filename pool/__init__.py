"""shm-pool: run tasks in a pool of worker processes that find each other
through shared memory.

``python -m pool up`` starts a pool; :class:`Client` (an Executor) and
:class:`AsyncClient` use one; :class:`Pool` starts one inside this process.
"""

from pool.client import AsyncClient, Client
from pool.embedded import Pool
from pool.errors import (
    NoWorkerAvailable,
    PoolAlreadyRunning,
    PoolError,
    PoolNotRunning,
    WorkerLost,
)
from workers.tasks import BadTask, RemoteError, RemoteTraceback

__all__ = [
    "AsyncClient",
    "BadTask",
    "Client",
    "NoWorkerAvailable",
    "Pool",
    "PoolAlreadyRunning",
    "PoolError",
    "PoolNotRunning",
    "RemoteError",
    "RemoteTraceback",
    "WorkerLost",
]
