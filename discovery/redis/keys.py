"""A namespace's layout in Redis: its keys, the Lua scripts that change
them together, the timings both sides agree on, and a one-off read of who
is registered (``pool workers``). See :mod:`discovery.redis` for the design.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, cast
from uuid import UUID

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from discovery.info import WorkerInfo

log = logging.getLogger(__name__)

TTL_S: Final = 3.0
HEARTBEAT_S: Final = 1.0
POLL_INTERVAL_S: Final = 0.25
RESYNC_EVERY_S: Final = 10.0
STREAM_MAXLEN: Final = 10_000
RECONNECT_S: Final = (0.05, 1.0)  # first delay, cap
UNAVAILABLE: Final = (RedisConnectionError, RedisTimeoutError, OSError)

Filter = Callable[[WorkerInfo], bool]

# KEYS: workers, leases, events. ARGV: type, uid, info, ttl ms, maxlen.
# Returns 1 if an event was appended, 0 if nothing changed, -1 if an added
# worker is registered already, -2 if an updated or dropped one is not.
# The type "renew" is a heartbeat: it renews the lease, and puts the entry
# back (added) if Redis lost it, or as it is now (updated) if it differs.
PUBLISH_SCRIPT: Final = """
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
REAP_SCRIPT: Final = """
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


def keys_of(namespace: str) -> list[str]:
    return [key(namespace, name) for name in ("workers", "leases", "events")]


def decode_entry(key: bytes, data: bytes) -> WorkerInfo | None:
    try:
        return WorkerInfo.decode(data, expect_uid=UUID(hex=key.decode()))
    except ValueError as exc:
        log.warning("skipping an entry that does not decode: %s", exc)
        return None


def registered(url: str, namespace: str) -> list[WorkerInfo]:
    """The workers of a namespace in Redis whose lease has not run out, read
    once (for ``pool workers``; a subscriber follows them)."""
    from discovery.redis.connecting import connect_sync

    client = connect_sync(url)
    workers, leases, _ = keys_of(namespace)
    try:
        seconds, micros = cast(tuple[int, int], client.time())
        now_ms = seconds * 1000 + micros // 1000
        live = cast(list[bytes], client.zrangebyscore(leases, now_ms, "+inf"))
        entries = cast(dict[bytes, bytes], client.hgetall(workers))
    finally:
        client.close()
    alive = set(live)
    found = (decode_entry(uid, data) for uid, data in entries.items() if uid in alive)
    return [info for info in found if info is not None]


def leased(url: str, namespace: str, uid: UUID) -> bool:
    """Whether the worker ``uid`` of a namespace in Redis holds a lease that
    has not run out, asked once (blocking: for the dispatcher, on a thread,
    before it links a worker again). True when Redis does not answer: who
    cannot tell must not drop, and the worker's drop comes with its lease."""
    from discovery.redis.connecting import connect_sync

    _, leases, _ = keys_of(namespace)
    try:
        client = connect_sync(url)
        try:
            seconds, micros = cast(tuple[int, int], client.time())
            expires = cast(float | None, client.zscore(leases, uid.hex))
        finally:
            client.close()
    except UNAVAILABLE:
        return True
    return expires is not None and expires > seconds * 1000 + micros // 1000
