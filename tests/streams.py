"""Reading subscriber streams in tests, always with a deadline."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from discovery import DiscoveryEvent, WorkerInfo

DEADLINE_S = 10.0


async def next_event(
    stream: AsyncIterator[DiscoveryEvent], timeout_s: float = DEADLINE_S
) -> DiscoveryEvent:
    """The stream's next event; fails past the deadline."""
    return await asyncio.wait_for(anext(stream), timeout_s)


async def events_until(
    stream: AsyncIterator[DiscoveryEvent], marker: WorkerInfo
) -> list[DiscoveryEvent]:
    """Events up to (not including) the ``worker-added`` of ``marker``."""
    seen = []
    while (event := await next_event(stream)).worker_info.uid != marker.uid:
        seen.append(event)
    assert event.type == "worker-added"
    return seen


def make_info(**fields: Any) -> WorkerInfo:
    defaults: dict[str, Any] = {
        "uid": uuid.uuid4(),
        "address": "unix:/run/w.sock",
        "pid": os.getpid(),
        "version": "1.0",
    }
    return WorkerInfo(**{**defaults, **fields})
