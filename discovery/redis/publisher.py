""":class:`RedisPublisher`: a worker's side of a namespace in Redis (see
:mod:`discovery.redis`). It owns one connection and a heartbeat task that
renews its workers' leases.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Self
from uuid import UUID

import redis.asyncio as aioredis

from discovery import paths
from discovery.errors import (
    UnknownEventType,
    WorkerAlreadyRegistered,
    WorkerNotRegistered,
)
from discovery.info import EVENT_TYPES, EventType, WorkerInfo
from discovery.redis.connecting import connect
from discovery.redis.keys import (
    HEARTBEAT_S,
    PUBLISH_SCRIPT,
    STREAM_MAXLEN,
    TTL_S,
    UNAVAILABLE,
    keys_of,
    log,
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
        self._keys = keys_of(self.namespace)
        self._ttl_ms, self._heartbeat_s = int(ttl_s * 1000), heartbeat_s
        self._mine: dict[UUID, bytes] = {}  # what Redis should hold of ours
        self._client: aioredis.Redis | None = None
        self._stack = contextlib.AsyncExitStack()  # holds the heartbeat's group

    async def __aenter__(self) -> Self:
        self._client = connect(self.url)
        self._publish = self._client.register_script(PUBLISH_SCRIPT)
        group = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._beating = group.create_task(self._heartbeat())
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        """Drop what it published, once its heartbeat has ended (an error
        unwinding goes on as itself, unless the heartbeat failed too)."""
        assert self._client is not None
        self._beating.cancel()
        try:
            try:
                await self._stack.__aexit__(*exc_info)
            except BaseExceptionGroup as group:
                if exc_info[1] is None or list(group.exceptions) != [exc_info[1]]:
                    raise
            for uid in list(self._mine):  # a clean exit drops at once
                with contextlib.suppress(*UNAVAILABLE):
                    await self._run(self._publish, "worker-dropped", uid, b"")
        finally:
            self._mine.clear()
            await self._client.aclose()

    async def publish(self, type: EventType, worker_info: WorkerInfo) -> None:
        """Publish one lifecycle event; see :meth:`Publisher.publish`. A
        worker this publisher added and Redis lost is put back by its next
        update, and its drop is no error.

        :raises UnknownEventType: for a type that is not one of the three.
        :raises WorkerAlreadyRegistered: on adding a registered uid.
        :raises WorkerNotRegistered: on updating or dropping an unknown uid.
        """
        if type not in EVENT_TYPES:
            raise UnknownEventType(type)
        if self._client is None:
            raise RuntimeError("use the publisher as `async with` first")
        uid, data = worker_info.uid, worker_info.encode()
        # An update of one of ours that Redis no longer holds (lost in a
        # restart or a failover, or reaped while this host hung) puts it
        # back, as the heartbeat would: that is no caller's mistake.
        kind = "renew" if type == "worker-updated" and uid in self._mine else type
        try:
            code = await self._run(self._publish, kind, uid, data)
        except UNAVAILABLE as exc:
            log.warning("Redis unreachable (%s): %s is kept for later", exc, type)
            if type == "worker-dropped":
                self._mine.pop(uid, None)  # its lease runs out meanwhile
            else:
                self._mine[uid] = data
            return
        if code == -1:
            raise WorkerAlreadyRegistered(self.namespace, uid)
        if code == -2 and uid not in self._mine:
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
                except UNAVAILABLE as exc:
                    log.debug("heartbeat of %s missed: %s", uid, exc)
                    break
