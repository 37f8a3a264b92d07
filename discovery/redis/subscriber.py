""":class:`RedisSubscriber`: follows a namespace in Redis as a stream of
:class:`~discovery.DiscoveryEvent` (see :mod:`discovery.redis`). Each
iteration owns one connection, through a :class:`_Follower`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from discovery import paths
from discovery.info import EVENT_TYPES, DiscoveryEvent, WorkerInfo, events_of
from discovery.redis.connecting import connect
from discovery.redis.keys import (
    HEARTBEAT_S,
    POLL_INTERVAL_S,
    REAP_SCRIPT,
    RECONNECT_S,
    RESYNC_EVERY_S,
    STREAM_MAXLEN,
    TTL_S,
    UNAVAILABLE,
    Filter,
    decode_entry,
    keys_of,
    log,
)


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
        return events_of(lambda: _Follower(self))


class _Follower:
    """One subscription's connection and what it has reported."""

    def __init__(self, subscriber: RedisSubscriber) -> None:
        self._sub = subscriber
        self._keys = keys_of(subscriber.namespace)
        self._client = connect(subscriber.url)
        self._reap = self._client.register_script(REAP_SCRIPT)
        self._shown: dict[UUID, WorkerInfo] = {}  # reported, not dropped
        self._known: dict[UUID, WorkerInfo] = {}  # in Redis, filtered or not
        self._last_id = "0-0"
        self._run_id: str | None = None
        self._synced_at = float("-inf")
        self._reaped_at = float("-inf")
        self._reap_from = float("-inf")  # (after a new Redis: see _resync)
        self._missing_since: dict[UUID, float] = {}  # lost in a Redis restart
        self._delay = RECONNECT_S[0]

    async def aclose(self) -> None:
        await self._client.aclose()

    async def next_batch(self) -> list[DiscoveryEvent]:
        """The next events (maybe none, after a poll with nothing new)."""
        try:
            events = await self._step()
        except UNAVAILABLE as exc:
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
        if now >= self._reap_from and now - self._reaped_at >= self._sub.poll_interval:
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
        if restarted:
            # A restart, or a replica promoted by a failover that outlasted
            # the leases: their publishers renew them once they reconnect,
            # so a lease that ran out meanwhile is no death until then.
            self._reap_from = now + self._sub.grace_s
        self._last_id = last[0][0].decode() if last else "0-0"
        seen: dict[UUID, WorkerInfo] = {}
        for key, data in entries.items():
            info = decode_entry(key, data)
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
        info = decode_entry(uid.hex.encode(), fields.get(b"i", b""))
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
