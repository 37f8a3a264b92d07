"""``RedisDiscovery``: a namespace's registry in Redis, for pools that span
machines. Same contract as :class:`~discovery.LocalDiscovery`: publishers
publish ``worker-added``/``-updated``/``-dropped``, subscribers iterate the
same events, so code written against one runs on the other.

Keys of a namespace (``{ns}`` is a Redis Cluster hash tag: one slot):

- ``shmp:{ns}:workers``, a hash: uid -> the worker's encoded ``WorkerInfo``;
- ``shmp:{ns}:leases``, a sorted set: uid -> its lease's deadline (ms on
  Redis's own clock, so no two hosts' clocks are compared);
- ``shmp:{ns}:events``, a stream of changes (``t`` type, ``u`` uid, ``i``
  info), trimmed to about :data:`STREAM_MAXLEN` entries.

Every change is one Lua script, so the hash, the leases and the stream never
disagree. A publisher renews each of its workers' leases every
``heartbeat_s`` (and puts the entry back if Redis lost it: a restart, a
flush); a clean exit drops at once. A worker whose host vanishes stops
renewing: every subscriber runs the reaping script about every
``poll_interval`` seconds, which finds expired deadlines and, atomically,
removes each and appends one ``worker-dropped``, so every subscriber sees
exactly one drop whoever found it.

A subscriber reads the stream from the last id it saw, so a reconnect
resumes without missing an event. It starts from a snapshot (the hash and
the stream's last id read in one transaction) and takes one again every
:data:`RESYNC_EVERY_S` (a trimmed stream) and after each reconnect. When
Redis itself was restarted (its run id changed) and lost its data, the
workers it knew are given one lease period to be put back by their
publishers before they are reported dropped: a restart is not a death.

Callers: the pool, when given ``--discovery redis://...``; tests and
benchmarks. Nothing here imports gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Final, Self, cast
from uuid import UUID, uuid4

try:
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError:
    raise ImportError(
        "RedisDiscovery needs redis-py: pip install 'shm-pool[redis]'"
    ) from None

from discovery import paths
from discovery.errors import (
    UnknownEventType,
    WorkerAlreadyRegistered,
    WorkerNotRegistered,
)
from discovery.info import EVENT_TYPES, DiscoveryEvent, EventType, WorkerInfo

log = logging.getLogger(__name__)

TTL_S: Final = 3.0
HEARTBEAT_S: Final = 1.0
POLL_INTERVAL_S: Final = 0.25
RESYNC_EVERY_S: Final = 10.0
STREAM_MAXLEN: Final = 10_000
RECONNECT_S: Final = (0.05, 1.0)  # first delay, cap
_UNAVAILABLE: Final = (RedisConnectionError, RedisTimeoutError, OSError)

Filter = Callable[[WorkerInfo], bool]

# KEYS: workers, leases, events. ARGV: type, uid, info, ttl ms, maxlen.
# Returns 1 if an event was appended, 0 if nothing changed, -1 if an added
# worker is registered already, -2 if an updated or dropped one is not.
# The type "renew" is a heartbeat: it renews the lease, and puts the entry
# back (added) if Redis lost it, or as it is now (updated) if it differs.
_PUBLISH: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind, uid, info = ARGV[1], ARGV[2], ARGV[3]
local ttl, maxlen = tonumber(ARGV[4]), ARGV[5]
local old = redis.call('HGET', KEYS[1], uid)
if kind == 'worker-dropped' then
  if not old then return -2 end
  redis.call('HDEL', KEYS[1], uid)
  redis.call('ZREM', KEYS[2], uid)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*', 't', kind, 'u', uid)
  return 1
end
if kind == 'renew' then
  if old then kind = 'worker-updated' else kind = 'worker-added' end
elseif kind == 'worker-added' and old then return -1
elseif kind == 'worker-updated' and not old then return -2 end
redis.call('ZADD', KEYS[2], now + ttl, uid)
if old == info then return 0 end
redis.call('HSET', KEYS[1], uid, info)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*', 't', kind, 'u', uid, 'i', info)
return 1
"""

# Remove every worker whose lease has run out, one drop each. ARGV: maxlen.
_REAP: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
local dropped = 0
for _, uid in ipairs(expired) do
  redis.call('ZREM', KEYS[2], uid)
  if redis.call('HDEL', KEYS[1], uid) == 1 then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[1], '*',
               't', 'worker-dropped', 'u', uid)
    dropped = dropped + 1
  end
end
return dropped
"""


def key(namespace: str, name: str) -> str:
    """The Redis key ``name`` of a namespace (``{ns}`` keeps them in one
    Redis Cluster slot)."""
    return f"shmp:{{{namespace}}}:{name}"


def _keys(namespace: str) -> list[str]:
    return [key(namespace, name) for name in ("workers", "leases", "events")]


def _client(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, socket_connect_timeout=1.0)


class RedisDiscovery:
    """Worker discovery through Redis; see the module docstring.

    :param url: the Redis server, ``redis://host:port[/db]``.
    :param namespace: the registry's name; a fresh one if None.
    :param ttl_s: how long a worker stays registered without a heartbeat.
    :param heartbeat_s: how often publishers renew their workers' leases.
    :raises InvalidNamespace: (a ``ValueError``) for a bad name.
    :raises ValueError: for a URL that is not ``redis://`` or ``rediss://``,
        or a heartbeat not shorter than the lease.
    """

    def __init__(
        self,
        url: str,
        namespace: str | None = None,
        *,
        ttl_s: float = TTL_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"not a Redis URL: {url!r}; use redis://host:port")
        if not 0 < heartbeat_s < ttl_s:
            raise ValueError(
                f"heartbeat_s must be above 0 and below ttl_s ({ttl_s}), "
                f"got {heartbeat_s}"
            )
        self.url = url
        self._namespace = paths.validate_namespace(
            f"pool-{uuid4().hex[:12]}" if namespace is None else namespace
        )
        self.ttl_s, self.heartbeat_s = ttl_s, heartbeat_s

    @property
    def namespace(self) -> str:
        return self._namespace

    def __enter__(self) -> Self:
        return self  # nothing to create: the keys appear with the first worker

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: each publisher and subscriber owns its
        connection. (Workers drop when their publishers exit.)"""

    @property
    def publisher(self) -> RedisPublisher:
        return RedisPublisher(
            self.url, self._namespace, ttl_s=self.ttl_s, heartbeat_s=self.heartbeat_s
        )

    @property
    def subscriber(self) -> RedisSubscriber:
        return self.subscribe()

    def subscribe(
        self, filter: Filter | None = None, *, poll_interval: float | None = None
    ) -> RedisSubscriber:
        return RedisSubscriber(
            self.url,
            self._namespace,
            filter,
            poll_interval=poll_interval,
            ttl_s=self.ttl_s,
            heartbeat_s=self.heartbeat_s,
        )


class RedisPublisher:
    """Publishes workers into a namespace in Redis and keeps their leases.

    Use as ``async with``; on exit every worker it added and did not drop is
    dropped. While Redis is unreachable, ``publish`` keeps what it was asked
    in memory (with a warning) and the heartbeat puts it in Redis once it is
    back; meanwhile the lease may run out, and the worker is dropped and then
    added again.
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        ttl_s: float = TTL_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.url, self.namespace = url, paths.validate_namespace(namespace)
        self._keys = _keys(self.namespace)
        self._ttl_ms, self._heartbeat_s = int(ttl_s * 1000), heartbeat_s
        self._mine: dict[UUID, bytes] = {}  # what Redis should hold of ours
        self._client: aioredis.Redis | None = None
        self._group: asyncio.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        self._client = _client(self.url)
        self._publish = self._client.register_script(_PUBLISH)
        group = asyncio.TaskGroup()
        await group.__aenter__()
        self._group = group
        self._beating = group.create_task(self._heartbeat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._group is not None and self._client is not None
        self._beating.cancel()
        try:
            await self._group.__aexit__(None, None, None)
            for uid in list(self._mine):  # a clean exit drops at once
                with contextlib.suppress(*_UNAVAILABLE):
                    await self._run(self._publish, "worker-dropped", uid, b"")
        finally:
            self._mine.clear()
            await self._client.aclose()

    async def publish(self, type: EventType, worker_info: WorkerInfo) -> None:
        """Publish one lifecycle event; see :meth:`Publisher.publish`.

        :raises UnknownEventType: for a type that is not one of the three.
        :raises WorkerAlreadyRegistered: on adding a registered uid.
        :raises WorkerNotRegistered: on updating or dropping an unknown uid.
        """
        if type not in EVENT_TYPES:
            raise UnknownEventType(type)
        if self._client is None:
            raise RuntimeError("use the publisher as `async with` first")
        uid, data = worker_info.uid, worker_info.encode()
        try:
            code = await self._run(self._publish, type, uid, data)
        except _UNAVAILABLE as exc:
            log.warning("Redis unreachable (%s): %s is kept for later", exc, type)
            if type == "worker-dropped":
                self._mine.pop(uid, None)  # its lease runs out meanwhile
            else:
                self._mine[uid] = data
            return
        if code == -1:
            raise WorkerAlreadyRegistered(self.namespace, uid)
        if code == -2:
            raise WorkerNotRegistered(self.namespace, uid)
        if type == "worker-dropped":
            self._mine.pop(uid, None)
        else:
            self._mine[uid] = data

    async def _run(self, script: Any, type: str, uid: UUID, data: bytes) -> int:
        args: list[str | bytes | int] = [
            type,
            uid.hex,
            data,
            self._ttl_ms,
            STREAM_MAXLEN,
        ]
        return int(await script(keys=self._keys, args=args))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)  # the beat itself
            for uid, data in list(self._mine.items()):
                try:
                    await self._run(self._publish, "renew", uid, data)
                except _UNAVAILABLE as exc:
                    log.debug("heartbeat of %s missed: %s", uid, exc)
                    break


class RedisSubscriber:
    """The events of a namespace in Redis, as an async iterable (each
    iteration a stream of its own, with its own connection).

    :param filter: keep only workers for which it returns True; a worker
        that stops matching is reported dropped, one that starts, added.
    :param poll_interval: how long a read of the stream waits, and so how
        often this subscriber looks for expired leases.
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        filter: Filter | None = None,
        *,
        poll_interval: float | None = None,
        ttl_s: float = TTL_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.url, self.namespace = url, paths.validate_namespace(namespace)
        self.filter = filter
        self.poll_interval = POLL_INTERVAL_S if poll_interval is None else poll_interval
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval must be above 0, got {poll_interval}")
        self.grace_s = ttl_s + heartbeat_s  # for workers lost in a Redis restart

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[DiscoveryEvent]:
        follower = _Follower(self)
        try:
            while True:
                for event in await follower.next_batch():
                    yield event
        finally:
            await follower.aclose()


class _Follower:
    """One subscription's connection and what it has reported."""

    def __init__(self, subscriber: RedisSubscriber) -> None:
        self._sub = subscriber
        self._keys = _keys(subscriber.namespace)
        self._client = _client(subscriber.url)
        self._reap = self._client.register_script(_REAP)
        self._shown: dict[UUID, WorkerInfo] = {}  # reported, not dropped
        self._known: dict[UUID, WorkerInfo] = {}  # in Redis, filtered or not
        self._last_id = "0-0"
        self._run_id: str | None = None
        self._synced_at = float("-inf")
        self._reaped_at = float("-inf")
        self._missing_since: dict[UUID, float] = {}  # lost in a Redis restart
        self._delay = RECONNECT_S[0]

    async def aclose(self) -> None:
        await self._client.aclose()

    async def next_batch(self) -> list[DiscoveryEvent]:
        """The next events (maybe none, after a poll with nothing new)."""
        try:
            events = await self._step()
        except _UNAVAILABLE as exc:
            log.info("Redis unreachable (%s); retrying in %.2f s", exc, self._delay)
            await asyncio.sleep(self._delay)  # back-off between reconnects
            self._delay = min(self._delay * 2, RECONNECT_S[1])
            self._synced_at = float("-inf")  # resync once back
            return []
        self._delay = RECONNECT_S[0]
        return events

    async def _step(self) -> list[DiscoveryEvent]:
        now = time.monotonic()
        if now - self._synced_at >= RESYNC_EVERY_S:
            return await self._resync(now)
        if now - self._reaped_at >= self._sub.poll_interval:
            self._reaped_at = now
            await self._reap(keys=self._keys, args=[STREAM_MAXLEN])
        events = self._expire_missing(now)
        block_ms = max(1, int(self._sub.poll_interval * 1000))
        reply: Any = await self._client.xread(
            {self._keys[2]: self._last_id}, count=1000, block=block_ms
        )
        for _, entries in reply or ():
            for entry_id, fields in entries:
                self._last_id = entry_id.decode()
                events += self._on_entry(fields)
        return events

    async def _resync(self, now: float) -> list[DiscoveryEvent]:
        """Compare a snapshot with what was reported; continue from it."""
        run_id = str((await self._client.info("server"))["run_id"])
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.xrevrange(self._keys[2], count=1)
            pipe.hgetall(self._keys[0])
            last, entries = await pipe.execute()
        restarted = self._run_id is not None and run_id != self._run_id
        self._run_id, self._synced_at, self._reaped_at = run_id, now, float("-inf")
        self._last_id = last[0][0].decode() if last else "0-0"
        seen: dict[UUID, WorkerInfo] = {}
        for key, data in entries.items():
            info = _decode(key, data)
            if info is not None:
                seen[info.uid] = info
        events = []
        for uid in list(self._known):
            if uid in seen:
                self._missing_since.pop(uid, None)
            elif restarted or uid in self._missing_since:
                # Lost with Redis's data: its publisher puts it back.
                self._missing_since.setdefault(uid, now)
            else:
                events += self._change(uid, None)
        for uid, info in seen.items():
            events += self._change(uid, info)
        return events

    def _expire_missing(self, now: float) -> list[DiscoveryEvent]:
        """Drop the workers lost in a restart that were not put back."""
        events = []
        for uid, since in list(self._missing_since.items()):
            if now - since >= self._sub.grace_s:
                del self._missing_since[uid]
                events += self._change(uid, None)
        return events

    def _on_entry(self, fields: dict[bytes, bytes]) -> list[DiscoveryEvent]:
        kind = fields.get(b"t", b"").decode(errors="replace")
        try:
            uid = UUID(hex=fields.get(b"u", b"").decode())
        except ValueError:
            log.warning("skipping a stream entry without a valid uid: %r", fields)
            return []
        if kind == "worker-dropped":
            return self._change(uid, None)
        info = _decode(uid.hex.encode(), fields.get(b"i", b""))
        if info is None or kind not in EVENT_TYPES:
            return []
        self._missing_since.pop(uid, None)
        return self._change(uid, info)

    def _change(self, uid: UUID, info: WorkerInfo | None) -> list[DiscoveryEvent]:
        """The event, if any, that takes the consumer from what it was shown
        of ``uid`` to ``info`` (None: gone)."""
        if info is None:
            self._known.pop(uid, None)
        else:
            self._known[uid] = info
        shown = self._shown.get(uid)
        visible = info is not None and (
            self._sub.filter is None or self._sub.filter(info)
        )
        if not visible:
            if shown is None:
                return []
            del self._shown[uid]
            return [DiscoveryEvent("worker-dropped", shown)]
        assert info is not None
        self._shown[uid] = info
        if shown is None:
            return [DiscoveryEvent("worker-added", info)]
        if shown != info:
            return [DiscoveryEvent("worker-updated", info)]
        return []


def _decode(key: bytes, data: bytes) -> WorkerInfo | None:
    try:
        return WorkerInfo.decode(data, expect_uid=UUID(hex=key.decode()))
    except ValueError as exc:
        log.warning("skipping an entry that does not decode: %s", exc)
        return None


def registered(url: str, namespace: str) -> list[WorkerInfo]:
    """The workers of a namespace in Redis whose lease has not run out, read
    once (for ``pool workers``; a subscriber follows them)."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1.0)
    workers, leases, _ = _keys(namespace)
    try:
        seconds, micros = cast(tuple[int, int], client.time())
        now_ms = seconds * 1000 + micros // 1000
        live = cast(list[bytes], client.zrangebyscore(leases, now_ms, "+inf"))
        entries = cast(dict[bytes, bytes], client.hgetall(workers))
    finally:
        client.close()
    alive = set(live)
    found = (_decode(uid, data) for uid, data in entries.items() if uid in alive)
    return [info for info in found if info is not None]
