"""Following subscriber streams in tests (always with a deadline), and
writing slots directly to test what readers make of them."""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

from discovery import DiscoveryEvent, Subscriber, WorkerInfo
from discovery.layout import SLOT_HEADER_BYTES
from discovery.lock import RegistryLock
from discovery.notify import Notifier
from discovery.registry import Registry

DEADLINE_S = 10.0


async def next_event(
    stream: AsyncIterator[DiscoveryEvent], timeout_s: float = DEADLINE_S
) -> DiscoveryEvent:
    """The stream's next event; fails past the deadline."""
    return await asyncio.wait_for(anext(stream), timeout_s)


async def eventually(
    predicate: Callable[[], bool], timeout_s: float = DEADLINE_S
) -> None:
    """Wait, without blocking the loop, until ``predicate`` holds."""
    async with asyncio.timeout(timeout_s):
        delay = 0.001
        while not predicate():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)


async def events_until(
    stream: AsyncIterator[DiscoveryEvent], marker: WorkerInfo
) -> list[DiscoveryEvent]:
    """Events up to (not including) the ``worker-added`` of ``marker``."""
    seen = []
    while (event := await next_event(stream)).worker_info.uid != marker.uid:
        seen.append(event)
    assert event.type == "worker-added"
    return seen


@asynccontextmanager
async def collecting(
    subscriber: Subscriber,
) -> AsyncIterator[list[DiscoveryEvent]]:
    """The events of a stream of ``subscriber``, gathered in the background
    into the list yielded; on exit the stream is closed, and whatever it
    raised is raised."""
    events: list[DiscoveryEvent] = []

    async def gather() -> None:
        async for event in subscriber:
            events.append(event)

    task = asyncio.create_task(gather())
    try:
        yield events
    finally:
        if task.done():
            task.result()  # raises what the stream raised
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


def make_info(**fields: Any) -> WorkerInfo:
    defaults: dict[str, Any] = {
        "uid": uuid.uuid4(),
        "address": "unix:/run/w.sock",
        "pid": os.getpid(),
        "version": "1.0",
    }
    return WorkerInfo(**{**defaults, **fields})


@asynccontextmanager
async def follow(
    subscriber: Subscriber,
) -> AsyncIterator[AsyncIterator[DiscoveryEvent]]:
    """A stream of ``subscriber`` that is closed however the test ends."""
    stream = subscriber.__aiter__()
    try:
        yield stream
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


class RawWriter:
    """Writes slots directly under the lock, as a publisher (or a broken one)
    would, for tests of what readers do with what they find."""

    def __init__(self, namespace: str) -> None:
        self.lock = RegistryLock(namespace)
        self.registry = Registry.attach(namespace)
        self.notifier = Notifier(namespace)

    def write(
        self,
        index: int,
        uid: uuid.UUID,
        data: bytes,
        notify: bool = True,
        *,
        pid: int = 0,
        pidns: int = 0,
    ) -> None:
        """Write a slot as published by process ``pid`` (0: none a pidfd can
        watch) of pid namespace ``pidns``."""
        with self.lock.hold():
            self.registry.write_slot(index, uid, data, pid, pidns)
        if notify:
            self.notifier.notify(self.registry.generation)

    def tear(self, index: int, uid: uuid.UUID, data: bytes) -> None:
        """Leave a slot as a writer stopped half-way would: version odd, the
        entry half written."""
        self.write(index, uid, data, notify=False)
        registry = self.registry
        offset = registry._slots_at + index * registry._stride
        with self.lock.hold():
            version = registry.slot_version(index)
            struct.pack_into("<Q", registry._view, offset, version + 1)
            torn = offset + SLOT_HEADER_BYTES
            registry._view[torn : torn + 8] = b"\xff" * 8
        self.notifier.notify(registry.generation)

    def slot_offset(self, index: int) -> int:
        """Where slot ``index`` starts in the segment."""
        return self.registry._slots_at + index * self.registry._stride

    def poke(self, offset: int, data: bytes) -> None:
        """Overwrite bytes anywhere in the segment, announcing nothing."""
        self.registry._view[offset : offset + len(data)] = data

    def corrupt(self, index: int, at: int, data: bytes) -> None:
        """Overwrite bytes of slot ``index`` from its byte ``at`` on and
        announce it as a (broken) writer would: a new even version unless
        the bytes hit the version itself, a new generation, a notification."""
        registry = self.registry
        offset = self.slot_offset(index)
        with self.lock.hold():
            version = registry.slot_version(index)
            self.poke(offset + at, data[: registry._stride - at])
            if at >= 8:
                struct.pack_into("<Q", registry._view, offset, version + 2)
            registry._bump(index)
        self.notifier.notify(registry.generation)

    def snapshot(self) -> bytes:
        """Every byte of the segment."""
        return bytes(self.registry._view)

    def close(self) -> None:
        self.registry.close()
        self.lock.close()
        self.notifier.close()


@contextmanager
def raw_writer(namespace: str) -> Iterator[RawWriter]:
    writer = RawWriter(namespace)
    try:
        yield writer
    finally:
        writer.close()
