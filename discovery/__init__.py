"""Worker discovery: a registry of workers that processes on one machine share.

Workers publish their :class:`WorkerInfo`; subscribers follow a stream of
:class:`DiscoveryEvent`. See ``discovery/README.md`` for the design.

Names load on first use, so that a worker, which only publishes, does not
pay for the subscriber's file watching (every worker start imports this).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from discovery.errors import (
        DiscoveryError,
        InvalidNamespace,
        LockTimeout,
        NamespaceInUse,
        NamespaceNotFound,
        RegistryCorrupt,
        RegistryFull,
        RegistryMismatch,
        UnknownEventType,
        UnsafeRuntimeDirectory,
        WorkerAlreadyRegistered,
        WorkerInfoTooLarge,
        WorkerNotRegistered,
    )
    from discovery.info import DiscoveryEvent, EventType, Status, WorkerInfo
    from discovery.local import LocalDiscovery, list_workers
    from discovery.ownership import (
        NamespaceEntry,
        namespaces,
        owner_pid,
        reap_registries,
        reclaim,
        sweep_dead,
    )
    from discovery.publisher import Publisher
    from discovery.redis import RedisDiscovery
    from discovery.subscriber import Subscriber, SubscriberStats

_HOMES = {
    "DiscoveryError": "discovery.errors",
    "DiscoveryEvent": "discovery.info",
    "EventType": "discovery.info",
    "InvalidNamespace": "discovery.errors",
    "LocalDiscovery": "discovery.local",
    "LockTimeout": "discovery.errors",
    "NamespaceInUse": "discovery.errors",
    "NamespaceNotFound": "discovery.errors",
    "Publisher": "discovery.publisher",
    "RedisDiscovery": "discovery.redis",
    "RegistryCorrupt": "discovery.errors",
    "RegistryFull": "discovery.errors",
    "RegistryMismatch": "discovery.errors",
    "Status": "discovery.info",
    "Subscriber": "discovery.subscriber",
    "SubscriberStats": "discovery.subscriber",
    "UnknownEventType": "discovery.errors",
    "UnsafeRuntimeDirectory": "discovery.errors",
    "WorkerAlreadyRegistered": "discovery.errors",
    "WorkerInfo": "discovery.info",
    "WorkerInfoTooLarge": "discovery.errors",
    "WorkerNotRegistered": "discovery.errors",
    "NamespaceEntry": "discovery.ownership",
    "list_workers": "discovery.local",
    "namespaces": "discovery.ownership",
    "owner_pid": "discovery.ownership",
    "reap_registries": "discovery.ownership",
    "reclaim": "discovery.ownership",
    "sweep_dead": "discovery.ownership",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'discovery' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "DiscoveryError",
    "DiscoveryEvent",
    "EventType",
    "InvalidNamespace",
    "LocalDiscovery",
    "LockTimeout",
    "NamespaceEntry",
    "NamespaceInUse",
    "NamespaceNotFound",
    "Publisher",
    "RedisDiscovery",
    "RegistryCorrupt",
    "RegistryFull",
    "RegistryMismatch",
    "Status",
    "Subscriber",
    "SubscriberStats",
    "UnknownEventType",
    "UnsafeRuntimeDirectory",
    "WorkerAlreadyRegistered",
    "WorkerInfo",
    "WorkerInfoTooLarge",
    "WorkerNotRegistered",
    "list_workers",
    "namespaces",
    "owner_pid",
    "reap_registries",
    "reclaim",
    "sweep_dead",
]
