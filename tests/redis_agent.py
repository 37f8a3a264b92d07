"""A worker's publisher on Redis, in a process of its own, for tests:
``python -m tests.redis_agent URL NAMESPACE TTL_S HEARTBEAT_S``.

Publishes one worker (its uid on stdout as ``READY <uid>``), then keeps its
lease until stdin closes (a clean exit: the worker drops) or it is killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import uvloop

from discovery import WorkerInfo
from discovery.remote import RedisPublisher


async def main(url: str, namespace: str, ttl_s: float, heartbeat_s: float) -> None:
    info = WorkerInfo(uuid.uuid4(), "127.0.0.1:1", os.getpid(), "1")
    leases = RedisPublisher(url, namespace, ttl_s=ttl_s, heartbeat_s=heartbeat_s)
    async with leases as publisher:
        await publisher.publish("worker-added", info)
        print(f"READY {info.uid}", flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until stdin closes


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
