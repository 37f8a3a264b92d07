"""Hypothesis writes arbitrary bytes into a live namespace's segment: its
header, its ring, its slots and their blocks. Subscribers never raise or
hang and keep reporting the good workers; publishers refuse a header they do
not recognise and leave it as they found it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery import (
    DiscoveryError,
    DiscoveryEvent,
    LocalDiscovery,
    NamespaceNotFound,
    Publisher,
    RegistryCorrupt,
    Subscriber,
    WorkerInfo,
)
from discovery.layout import ring_size_for
from discovery.registry import Registry
from tests.support.streams import collecting, eventually, make_info, raw_writer

CAPACITY, BLOCK = 4, 256
POLL_S = 0.05
HEADER_AND_RING = 64 + ring_size_for(CAPACITY) * 8
SLOT_BYTES = 40 + BLOCK

fuzz = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def skipped(caplog: pytest.LogCaptureFixture) -> int:
    return sum("skipping slot" in r.getMessage() for r in caplog.records)


@fuzz
@given(at=st.integers(0, SLOT_BYTES - 1), data=st.binary(min_size=1, max_size=24))
def test_corrupt_slot_is_skipped_and_good_workers_keep_flowing(
    make_namespace: Callable[[], str],
    caplog: pytest.LogCaptureFixture,
    at: int,
    data: bytes,
) -> None:
    """Bytes written over one worker's slot (any field, its block, its
    version), and announced: the subscriber logs at most one warning for it
    and goes on reporting the other worker's changes."""
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="discovery")
    asyncio.run(_corrupt_slot(make_namespace(), at, data))
    assert skipped(caplog) <= 1


async def _corrupt_slot(namespace: str, at: int, data: bytes) -> None:
    good, bad = make_info(), make_info()
    with LocalDiscovery(namespace, capacity=CAPACITY, block_size=BLOCK):
        async with Publisher(namespace) as publisher:
            subscriber = Subscriber(namespace, poll_interval=POLL_S)
            async with collecting(subscriber) as events:
                await publisher.publish("worker-added", good)
                await publisher.publish("worker-added", bad)
                await eventually(lambda: len(events) == 2)
                with raw_writer(namespace) as writer:
                    index = writer.registry.find(bad.uid)
                    assert index is not None
                    writer.corrupt(index, at, data)
                    before = len(events)
                    for n in range(3):  # each change of the good worker is seen
                        changed = replace(good, extra={"n": str(n)})
                        await publisher.publish("worker-updated", changed)
                        await eventually(partial(_seen, changed, events))
                    assert all(
                        e.worker_info.uid != good.uid or e.type == "worker-updated"
                        for e in events[before:]
                    )


def _infos(events: list[DiscoveryEvent]) -> list[WorkerInfo]:
    return [e.worker_info for e in events]


def _seen(info: WorkerInfo, events: list[DiscoveryEvent]) -> bool:
    return info in _infos(events)


@fuzz
@given(at=st.integers(0, HEADER_AND_RING - 1), data=st.binary(min_size=1, max_size=24))
def test_corrupt_header_never_breaks_a_subscriber_and_is_never_overwritten(
    make_namespace: Callable[[], str], at: int, data: bytes
) -> None:
    """Bytes written over the header or the ring: a running and a new
    subscriber never raise or hang, and a publisher or a second
    LocalDiscovery either works (the bytes were harmless) or refuses with
    a typed error and writes nothing."""
    asyncio.run(_corrupt_header(make_namespace(), at, data))


async def _corrupt_header(namespace: str, at: int, data: bytes) -> None:
    good = make_info()
    with LocalDiscovery(namespace, capacity=CAPACITY, block_size=BLOCK):
        async with Publisher(namespace) as publisher:
            await publisher.publish("worker-added", good)
            running = Subscriber(namespace, poll_interval=POLL_S)
            async with collecting(running) as events:
                await eventually(lambda: len(events) == 1)
                with raw_writer(namespace) as writer:
                    writer.poke(at, data)
                    with suppress(DiscoveryError):  # refused, or it worked
                        await publisher.publish("worker-updated", replace(good, pid=1))
                    async with collecting(Subscriber(namespace, poll_interval=POLL_S)):
                        before = writer.snapshot()
                        try:
                            async with Publisher(namespace) as second:
                                await second.publish("worker-added", make_info())
                        except (RegistryCorrupt, NamespaceNotFound):
                            assert writer.snapshot() == before
                        before = writer.snapshot()
                        try:
                            with LocalDiscovery(
                                namespace, capacity=CAPACITY, block_size=BLOCK
                            ):
                                pass
                        except DiscoveryError:
                            assert writer.snapshot() == before
                        for _ in range(3):  # a few polls of both subscribers
                            await asyncio.sleep(POLL_S)


def test_publisher_refuses_an_unknown_header_and_leaves_it(namespace: str) -> None:
    """Bad magic, an unknown layout version or an impossible capacity: a
    publisher and LocalDiscovery raise RegistryCorrupt naming the cause and
    write nothing."""
    cases = [(0, b"NOTAREG\x00", "bad magic"), (8, b"\x63\x00", "layout version 99")]
    cases.append((12, b"\x00\x00\x00\x00", "capacity 0"))
    for at, data, reason in cases:
        with LocalDiscovery(namespace, capacity=CAPACITY, block_size=BLOCK):
            with raw_writer(namespace) as writer:
                writer.poke(at, data)
                before = writer.snapshot()
                with pytest.raises(RegistryCorrupt, match=reason) as refused:
                    asyncio.run(_publish_once(namespace))
                assert "left untouched" in str(refused.value)
                with pytest.raises(RegistryCorrupt, match=reason):
                    LocalDiscovery(namespace).__enter__()
                assert writer.snapshot() == before
                Registry.unlink_name(namespace)  # the owner cannot close it


async def _publish_once(namespace: str) -> None:
    async with Publisher(namespace) as publisher:
        await publisher.publish("worker-added", make_info())


async def test_ring_entry_past_the_capacity_is_not_followed(namespace: str) -> None:
    """A ring entry that names a slot past the capacity, with a matching
    generation, makes the subscriber compare every slot instead of reading
    past the end of the segment."""
    good = make_info()
    with LocalDiscovery(namespace, capacity=CAPACITY, block_size=BLOCK):
        async with Publisher(namespace) as publisher:
            async with collecting(Subscriber(namespace, poll_interval=30)) as events:
                with raw_writer(namespace) as writer:
                    generation = writer.registry.generation + 1
                    entry = generation << 24 | 10_000
                    at = 64 + generation % ring_size_for(CAPACITY) * 8
                    writer.poke(at, entry.to_bytes(8, "little"))
                    writer.poke(32, generation.to_bytes(8, "little"))
                    writer.notifier.notify(generation)
                    await publisher.publish("worker-added", good)
                    await eventually(lambda: _infos(events) == [good])
