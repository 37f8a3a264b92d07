"""Worker discovery: a registry of workers that processes on one machine share.

Workers publish their :class:`WorkerInfo`; subscribers follow a stream of
:class:`DiscoveryEvent`. See ``discovery/README.md`` for the design.
"""

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
from discovery.local import LocalDiscovery, list_workers, reclaim
from discovery.publisher import Publisher
from discovery.subscriber import Subscriber, SubscriberStats

__all__ = [
    "DiscoveryError",
    "DiscoveryEvent",
    "EventType",
    "InvalidNamespace",
    "LocalDiscovery",
    "LockTimeout",
    "NamespaceInUse",
    "NamespaceNotFound",
    "Publisher",
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
    "reclaim",
]
