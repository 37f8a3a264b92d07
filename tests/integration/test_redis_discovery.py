"""RedisDiscovery against a real redis-server: the same contract as the
shared-memory registry, leases that drop a vanished worker once, and a
Redis restart survived without spurious events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from discovery import DiscoveryEvent, WorkerInfo
from discovery.backends import liveness_for
from discovery.errors import WorkerAlreadyRegistered, WorkerNotRegistered
from discovery.redis import RedisDiscovery, RedisSubscriber
from tests.support.helpers import python_module
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TTL_S, HEARTBEAT_S = 1.0, 0.25  # short leases: the tests wait for them


def _info(**changes: object) -> WorkerInfo:
    fields: dict[str, object] = {
        "uid": uuid.uuid4(),
        "address": "127.0.0.2:5000",
        "pid": 1,
        "version": "1",
    }
    fields.update(changes)
    return WorkerInfo(**fields)  # type: ignore[arg-type]


class Events:
    """A subscriber's events, read by a task of their own into a queue, and
    taken with a deadline (a timed-out wait must not end the stream)."""

    def __init__(self, subscriber: RedisSubscriber) -> None:
        self._queue: asyncio.Queue[DiscoveryEvent] = asyncio.Queue()
        self._subscriber = subscriber

    async def pump(self) -> None:
        async for event in self._subscriber:
            await self._queue.put(event)

    async def next(self, timeout_s: float = 10.0) -> DiscoveryEvent:
        return await asyncio.wait_for(self._queue.get(), timeout_s)

    async def none_within(self, seconds: float) -> None:
        """No event for ``seconds`` (a bounded wait that must run out)."""
        with contextlib.suppress(TimeoutError):
            event = await asyncio.wait_for(self._queue.get(), seconds)
            raise AssertionError(f"unexpected {event}")


@contextlib.asynccontextmanager
async def following(
    discovery: RedisDiscovery, **options: object
) -> AsyncIterator[Events]:
    events = Events(discovery.subscribe(**options))  # type: ignore[arg-type]
    async with asyncio.TaskGroup() as group:
        pumping = group.create_task(events.pump())
        try:
            yield events
        finally:
            pumping.cancel()


def _discovery(server: RedisServer) -> RedisDiscovery:
    return RedisDiscovery(server.url, ttl_s=TTL_S, heartbeat_s=HEARTBEAT_S)


async def test_the_same_three_events_as_shared_memory(
    redis_server: RedisServer,
) -> None:
    """Added, updated only when it changed, dropped at a clean exit; a
    late subscriber starts from a snapshot; a filter hides what it must."""
    discovery = _discovery(redis_server)
    worker, other = _info(tags=frozenset({"gpu"})), _info()
    async with following(discovery) as events:
        async with following(discovery, filter=lambda i: "gpu" in i.tags) as gpus:
            async with discovery.publisher as publisher:
                await publisher.publish("worker-added", worker)
                await publisher.publish("worker-added", other)
                assert (await events.next()) == DiscoveryEvent("worker-added", worker)
                assert (await events.next()) == DiscoveryEvent("worker-added", other)
                assert (await gpus.next()).worker_info == worker
                with pytest.raises(WorkerAlreadyRegistered):
                    await publisher.publish("worker-added", worker)
                await publisher.publish("worker-updated", worker)  # unchanged
                busy = WorkerInfo(**{**worker.__dict__, "status": "draining"})
                await publisher.publish("worker-updated", busy)
                assert (await events.next()) == DiscoveryEvent("worker-updated", busy)
                async with following(discovery) as late:
                    firsts = {(await late.next()).worker_info for _ in range(2)}
                    assert firsts == {busy, other}
                await publisher.publish("worker-dropped", other)
                assert (await events.next()) == DiscoveryEvent("worker-dropped", other)
                with pytest.raises(WorkerNotRegistered):
                    await publisher.publish("worker-dropped", other)
            # The publisher's exit drops what it still had, at once.
            assert (await events.next()) == DiscoveryEvent("worker-dropped", busy)
            assert (await gpus.next()).type == "worker-updated"
            assert (await gpus.next()).type == "worker-dropped"
        await events.none_within(TTL_S + 0.5)  # no second drop from a lease


@contextlib.contextmanager
def agent(
    server: RedisServer, discovery: RedisDiscovery
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A publisher in another process, with the discovery's leases; its
    worker's uid."""
    proc = python_module(
        *("tests.support.redis_agent", server.url, discovery.namespace),
        *(str(discovery.ttl_s), str(discovery.heartbeat_s)),
        stdin=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        yield proc, line.split()[1]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


async def test_a_killed_publisher_drops_once_when_its_lease_runs_out(
    redis_server: RedisServer,
) -> None:
    """SIGKILL: the worker drops once its lease runs out, and each of two
    subscribers sees exactly one drop (whichever reaped it)."""
    discovery = RedisDiscovery(redis_server.url, ttl_s=3.0, heartbeat_s=1.0)
    async with following(discovery) as first, following(discovery) as second:
        with agent(redis_server, discovery) as (proc, uid):
            for events in (first, second):
                added = await events.next()
                assert (added.type, str(added.worker_info.uid)) == ("worker-added", uid)
            proc.kill()
            for events in (first, second):
                dropped = await events.next(timeout_s=3.0 + 5.0)
                assert (dropped.type, str(dropped.worker_info.uid)) == (
                    "worker-dropped",
                    uid,
                )
        await first.none_within(1.0)
        await second.none_within(0.1)


async def test_a_hung_host_drops_then_comes_back(redis_server: RedisServer) -> None:
    """SIGSTOP (a hung host): dropped once the lease runs out; SIGCONT: its
    heartbeat puts it back, added again."""
    discovery = _discovery(redis_server)
    async with following(discovery) as events:
        with agent(redis_server, discovery) as (proc, uid):
            assert (await events.next()).type == "worker-added"
            os.kill(proc.pid, signal.SIGSTOP)
            dropped = await events.next(timeout_s=TTL_S + 5.0)
            assert (dropped.type, str(dropped.worker_info.uid)) == (
                "worker-dropped",
                uid,
            )
            os.kill(proc.pid, signal.SIGCONT)
            back = await events.next()
            assert (back.type, str(back.worker_info.uid)) == ("worker-added", uid)
            proc.stdin.close()  # type: ignore[union-attr]  # a clean exit
            gone = await events.next()
            assert (gone.type, str(gone.worker_info.uid)) == ("worker-dropped", uid)


async def test_a_redis_restart_is_not_a_death(redis_server: RedisServer) -> None:
    """Redis restarts with its data lost: the live worker's publisher puts it
    back, and the subscriber reports nothing (no drop, no second add); a
    worker added after the restart is seen, and a worker that died during
    the outage is dropped once the grace is over."""
    discovery = _discovery(redis_server)
    async with following(discovery) as events:
        with agent(redis_server, discovery) as (_, live):
            with agent(redis_server, discovery) as (doomed, dead):
                added = {str((await events.next()).worker_info.uid) for _ in range(2)}
                assert added == {live, dead}
                redis_server.stop()
                doomed.kill()
                doomed.wait()
                redis_server.start()
                gone = await events.next(timeout_s=TTL_S + HEARTBEAT_S + 10.0)
                assert (gone.type, str(gone.worker_info.uid)) == (
                    "worker-dropped",
                    dead,
                )
            await events.none_within(TTL_S + HEARTBEAT_S)
            async with discovery.publisher as publisher:
                late = _info()
                await publisher.publish("worker-added", late)
                assert (await events.next()) == DiscoveryEvent("worker-added", late)


async def test_an_update_after_redis_lost_the_entry_puts_it_back(
    redis_server: RedisServer,
) -> None:
    """A worker whose entry Redis lost (a restart without data, a failover
    to a replica that never had it) and that publishes an update before its
    heartbeat has put it back is put back by that update; its drop is no
    error either. (Regression: the update raised WorkerNotRegistered, and
    the worker died of it.)"""
    discovery = RedisDiscovery(redis_server.url, ttl_s=60.0, heartbeat_s=30.0)
    store = redis.Redis(port=redis_server.port)
    worker = _info()
    try:
        async with following(discovery) as events:
            async with discovery.publisher as publisher:
                await publisher.publish("worker-added", worker)
                assert (await events.next()).type == "worker-added"
                store.flushall()  # (the heartbeat is 30 s away)
                busy = WorkerInfo(**{**worker.__dict__, "status": "draining"})
                await publisher.publish("worker-updated", busy)
                assert (await events.next()) == DiscoveryEvent("worker-updated", busy)
                entries = f"shmp:{{{discovery.namespace}}}:workers"
                assert store.hexists(entries, worker.uid.hex)
                store.flushall()
                await publisher.publish("worker-dropped", busy)
                with pytest.raises(WorkerNotRegistered):
                    await publisher.publish("worker-updated", busy)
    finally:
        store.close()


async def test_the_dispatchers_liveness_check_on_redis_reads_the_lease(
    redis_server: RedisServer,
) -> None:
    """What the dispatcher asks before it links a worker again: true while
    the worker holds a lease, false once it is dropped or for a worker never
    registered, and true when Redis does not answer (who cannot tell must
    not drop). Regression: it was true whatever Redis said."""
    discovery = _discovery(redis_server)
    alive = liveness_for(redis_server.url)
    worker = _info()
    async with discovery.publisher as publisher:
        await publisher.publish("worker-added", worker)
        assert await asyncio.to_thread(alive, discovery.namespace, worker.uid)
        unknown = uuid.uuid4()
        assert not await asyncio.to_thread(alive, discovery.namespace, unknown)
        await publisher.publish("worker-dropped", worker)
        assert not await asyncio.to_thread(alive, discovery.namespace, worker.uid)
    nobody = liveness_for("redis://127.0.0.1:1")  # (no Redis listens there)
    assert await asyncio.to_thread(nobody, discovery.namespace, worker.uid)
