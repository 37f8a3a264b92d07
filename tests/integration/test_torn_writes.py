"""A publisher SIGKILLed in the middle of writing its slot, at every line of
the write in turn: readers are never stuck and the slot is reaped."""

from __future__ import annotations

import signal
import uuid
from functools import partial

import pytest

from discovery import (
    DiscoveryEvent,
    LocalDiscovery,
    Publisher,
    Subscriber,
    list_workers,
)
from discovery.liveness import liveness_path
from discovery.registry import Registry
from tests.support.helpers import agent
from tests.support.streams import collecting, eventually, make_info

pytestmark = pytest.mark.integration

# The registry's slot write runs fewer lines than this: the last kills come
# just after the write.
LINES = 24


def _reaped(namespace: str, uid: uuid.UUID) -> bool:
    """Whether no slot is mid-write or holds ``uid``."""
    registry = Registry.attach(namespace)
    try:
        return not any(
            registry.slot_version(i) & 1 or registry._slot_uid(i) == uid.bytes
            for i in range(registry.capacity)
        )
    finally:
        registry.close()


def _swept(namespace: str, uid: uuid.UUID) -> bool:
    return not liveness_path(namespace, uid).exists()


LIVES: list[list[str]] = [
    [],
    ["worker-added", "worker-dropped"],
    ["worker-added", "worker-updated", "worker-dropped"],
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("phase", ["add", "update"])
async def test_writer_killed_mid_write_is_reaped(namespace: str, phase: str) -> None:
    """For each line of the slot write, a publisher dies there: the slot ends
    neither torn nor held, a subscriber reports the worker dropped if it
    ever reported it added, and the namespace takes new workers after."""
    with LocalDiscovery(namespace, capacity=2):
        async with (
            Publisher(namespace) as publisher,
            collecting(Subscriber(namespace, poll_interval=0.05)) as events,
        ):
            for line in range(LINES):
                with agent("die-writing", namespace, phase, str(line)) as writer:
                    uid = uuid.UUID(writer.expect("ready")["uid"])
                    writer.send(op="go")
                    assert writer.proc.wait(10) == -signal.SIGKILL
                await eventually(partial(_reaped, namespace, uid))
                marker = make_info()  # every event before its own has come
                await publisher.publish("worker-added", marker)
                await eventually(partial(_reported, events, marker.uid))
                await publisher.publish("worker-dropped", marker)
                assert _life(events, uid) in LIVES, (line, _life(events, uid))
                # A torn first write leaves its liveness file to the sweep.
                await eventually(partial(_swept, namespace, uid))
        assert list_workers(namespace) == []


def _life(events: list[DiscoveryEvent], uid: uuid.UUID) -> list[str]:
    return [e.type for e in events if e.worker_info.uid == uid]


def _reported(events: list[DiscoveryEvent], uid: uuid.UUID) -> bool:
    return bool(_life(events, uid))
