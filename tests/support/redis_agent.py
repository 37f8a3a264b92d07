"""A worker's publisher on Redis, in a process of its own, for tests::

    python -m tests.support.redis_agent URL NAMESPACE TTL_S HEARTBEAT_S [ADDRESS [TAGS]]

Publishes one worker (its uid on stdout as ``READY <uid>``), with ADDRESS
(default 127.0.0.1:1, where nothing listens) and comma-separated TAGS, then
keeps its lease until stdin closes (a clean exit: the worker drops) or it is
killed. Nothing serves the address: it stands for whatever anyone who can
write to Redis might publish.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import uvloop

from discovery import WorkerInfo
from discovery.redis import RedisPublisher


async def main(
    url: str,
    namespace: str,
    ttl_s: float,
    heartbeat_s: float,
    address: str = "127.0.0.1:1",
    tags: str = "",
) -> None:
    labels = frozenset(t for t in tags.split(",") if t)
    info = WorkerInfo(uuid.uuid4(), address, os.getpid(), "1", tags=labels)
    leases = RedisPublisher(url, namespace, ttl_s=ttl_s, heartbeat_s=heartbeat_s)
    async with leases as publisher:
        await publisher.publish("worker-added", info)
        print(f"READY {info.uid}", flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until stdin closes


if __name__ == "__main__":
    url, namespace, ttl_s, heartbeat_s, *rest = sys.argv[1:]
    uvloop.run(main(url, namespace, float(ttl_s), float(heartbeat_s), *rest))
