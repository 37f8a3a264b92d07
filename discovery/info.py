"""What a worker publishes about itself, and the events subscribers see.

:class:`WorkerInfo` is a frozen value; its protobuf form
(``proto/discovery/worker_info.proto``) is what the registry stores. The
encoding is deterministic (tags sorted, map keys sorted), so two equal
infos encode to the same bytes and a publisher can tell a real change from
a repeat.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Final, Literal, Protocol, get_args
from uuid import UUID

from google.protobuf.message import DecodeError

from discovery import worker_info_pb2

EventType = Literal["worker-added", "worker-updated", "worker-dropped"]
EVENT_TYPES: Final[frozenset[str]] = frozenset(get_args(EventType))

Status = Literal["ready", "draining", "stuck"]
STATUSES: Final[frozenset[str]] = frozenset(get_args(Status))
_STATUS_TO_WIRE: Final = {
    "ready": worker_info_pb2.STATUS_READY,
    "draining": worker_info_pb2.STATUS_DRAINING,
    "stuck": worker_info_pb2.STATUS_STUCK,
}
_STATUS_FROM_WIRE: Final = {wire: name for name, wire in _STATUS_TO_WIRE.items()}


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """A worker as the registry knows it.

    :param uid: identity, unique across the pool's lifetime.
    :param address: gRPC target, ``unix:/path`` or ``host:port``.
    :param pid: the worker's process id (in its own pid namespace).
    :param version: the worker's software version.
    :param tags: labels that tasks may require.
    :param extra: free-form string metadata.
    :param status: ``"ready"`` (takes tasks), ``"draining"`` (finishing,
        then leaving) or ``"stuck"`` (every task thread is held by a call
        nobody waits for any more).
    :param capacity: how many tasks the dispatcher may send it at once (>= 1).
    :raises ValueError: if a field is out of range.
    """

    uid: UUID
    address: str
    pid: int
    version: str
    tags: frozenset[str] = frozenset()
    extra: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    status: Status = "ready"
    capacity: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.uid, UUID):
            raise ValueError(f"uid must be a UUID, got {self.uid!r}")
        if self.status not in STATUSES:
            raise ValueError(
                f"status must be one of {sorted(STATUSES)}, got {self.status!r}"
            )
        if self.capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {self.capacity}")
        if self.pid < 0:
            raise ValueError(f"pid must not be negative, got {self.pid}")
        # Freeze the containers too, so an info can be shared without copies.
        object.__setattr__(self, "tags", frozenset(self.tags))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def to_protobuf(self) -> worker_info_pb2.WorkerInfo:
        """The protobuf message of this info."""
        return worker_info_pb2.WorkerInfo(
            uid=self.uid.bytes,
            address=self.address,
            pid=self.pid,
            version=self.version,
            tags=sorted(self.tags),
            extra=dict(self.extra),
            status=_STATUS_TO_WIRE[self.status],
            capacity=self.capacity,
        )

    @classmethod
    def from_protobuf(
        cls, message: worker_info_pb2.WorkerInfo, expect_uid: UUID | None = None
    ) -> WorkerInfo:
        """Build an info from its protobuf message.

        :param expect_uid: the uid the message must hold (then reused).
        :raises ValueError: if the message holds an invalid field, or not
            ``expect_uid``.
        """
        if expect_uid is not None:
            if message.uid != expect_uid.bytes:
                raise ValueError(f"it holds another uid than {expect_uid}")
            uid = expect_uid
        elif len(message.uid) != 16:
            raise ValueError(f"uid must be 16 bytes, got {len(message.uid)}")
        else:
            uid = UUID(bytes=message.uid)
        status = _STATUS_FROM_WIRE.get(message.status)
        if status is None:
            raise ValueError(f"unknown worker status {message.status}")
        if message.capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {message.capacity}")
        if message.pid < 0:
            raise ValueError(f"pid must not be negative, got {message.pid}")
        # The checks of __post_init__ that the wire types leave open were made
        # above; building the instance directly costs a third as much, which
        # a subscriber's first look at thousands of workers feels.
        info = object.__new__(cls)
        info.__dict__.update(
            uid=uid,
            address=message.address,
            pid=message.pid,
            version=message.version,
            tags=frozenset(message.tags),
            extra=MappingProxyType(dict(message.extra)),
            status=status,
            capacity=message.capacity,
        )
        return info

    def encode(self) -> bytes:
        """The deterministic wire bytes of this info."""
        return bytes(self.to_protobuf().SerializeToString(deterministic=True))

    @classmethod
    def decode(cls, data: bytes, expect_uid: UUID | None = None) -> WorkerInfo:
        """Parse wire bytes (that must hold ``expect_uid``, if given).

        :raises ValueError: if the bytes are not a valid info.
        """
        try:
            message = worker_info_pb2.WorkerInfo.FromString(data)
        except DecodeError as exc:
            raise ValueError(f"undecodable WorkerInfo: {exc}") from exc
        return cls.from_protobuf(message, expect_uid)


@dataclasses.dataclass(frozen=True)
class DiscoveryEvent:
    """One step of a worker's life, as a subscriber sees it.

    :param type: ``"worker-added"``, ``"worker-updated"`` or
        ``"worker-dropped"``.
    :param worker_info: the worker's info; for a drop, its last known info.
    """

    type: EventType
    worker_info: WorkerInfo


class Follower(Protocol):
    """One iteration's state of a subscriber: the next events, and an end."""

    async def next_batch(self) -> list[DiscoveryEvent]: ...
    async def aclose(self) -> None: ...


async def events_of(
    start: Callable[[], Follower],
) -> AsyncIterator[DiscoveryEvent]:
    """The events of the follower ``start`` makes (once iterated), one at a
    time, until the caller stops; then its end. Both subscribers iterate so."""
    follower = start()
    try:
        while True:
            for event in await follower.next_batch():
                yield event
    finally:
        await follower.aclose()
