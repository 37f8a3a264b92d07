"""shm-pool: run tasks in a pool of worker processes that find each other
through shared memory.

``python -m pool up`` starts a pool; :class:`Client` (an Executor) and
:class:`AsyncClient` use one; :class:`Pool` starts one inside this process.
"""

import importlib
from typing import TYPE_CHECKING, Any

import workers  # noqa: F401  (first: it turns gRPC's fork handlers off)

# Each name is imported from its module on first use (PEP 562): the zygote
# imports the dispatcher without the clients, the supervisor and rich.
_HOMES: dict[str, str] = {
    "__version__": "discovery",
    "AsyncClient": "pool.client.async_client",
    "Client": "pool.client.executor",
    "Pool": "pool.client.embedded",
    "ObjectRef": "pool.client.refs",
    "as_completed": "pool.client.progress",
    # The errors a user reaches for first; every other one is in pool.errors.
    "NoWorkerAvailable": "pool.errors",
    "PoolError": "pool.errors",
    "PoolNotRunning": "pool.errors",
    "RemoteError": "pool.errors",
    "TaskTimeout": "pool.errors",
    "WorkerLost": "pool.errors",
}

if TYPE_CHECKING:
    from discovery import __version__
    from pool.client.async_client import AsyncClient
    from pool.client.embedded import Pool
    from pool.client.executor import Client
    from pool.client.progress import as_completed
    from pool.client.refs import ObjectRef
    from pool.errors import (
        NoWorkerAvailable,
        PoolError,
        PoolNotRunning,
        RemoteError,
        TaskTimeout,
        WorkerLost,
    )


def __getattr__(name: str) -> Any:
    if name == "errors":  # (`import pool` then `pool.errors.DataGone`)
        return importlib.import_module("pool.errors")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pool' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next look finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "AsyncClient",
    "Client",
    "NoWorkerAvailable",
    "ObjectRef",
    "Pool",
    "PoolError",
    "PoolNotRunning",
    "RemoteError",
    "TaskTimeout",
    "WorkerLost",
    "__version__",
    "as_completed",
]
