"""Which registry a process publishes to and follows: the namespace's
shared memory by default, or Redis when given a ``redis://`` URL, or the
primary a set of Sentinels names with ``redis+sentinel://`` (the
``--discovery`` option of ``pool up``, ``python -m workers`` and the
dispatcher; the forms: :mod:`discovery.urls`). Both sides give the same
events (see :mod:`discovery.redis`).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, Self
from uuid import UUID

from discovery.errors import RegistryUnreachable
from discovery.info import DiscoveryEvent, EventType, WorkerInfo
from discovery.liveness import is_alive as _holds_liveness_lock
from discovery.urls import SCHEMES, SENTINEL_FORM, is_sentinel, parse_sentinel


class AnyPublisher(Protocol):
    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, *exc_info: Any) -> None: ...
    async def publish(self, type: EventType, worker_info: WorkerInfo) -> None: ...


def check_url(url: str | None) -> str | None:
    """``url`` if it names a registry we know (None: shared memory).

    :raises ValueError: for anything else, saying what is accepted, for a
        Sentinel URL that is not well formed, and for a Redis URL when
        redis-py (the ``redis`` extra) is missing.
    """
    if url is None:
        return None
    if is_sentinel(url):
        parse_sentinel(url)
    if url.startswith(SCHEMES):
        if importlib.util.find_spec("redis") is None:
            raise ValueError(
                f"--discovery {url!r} needs redis-py, which is not installed: "
                f"pip install 'shm-pool[redis]'"
            )
        return url
    raise ValueError(
        f"--discovery {url!r} is not a registry this pool knows; give "
        f"redis://HOST:PORT or {SENTINEL_FORM} (or leave it out for shared "
        f"memory)"
    )


def check_reachable(url: str | None, timeout_s: float = 3.0) -> None:
    """:raises RegistryUnreachable: if the registry at ``url`` does not
    answer a PING within ``timeout_s`` (shared memory always does)."""
    if url is None:
        return
    import redis
    from redis.sentinel import MasterNotFoundError

    from discovery.redis.connecting import connect_sync

    client = connect_sync(
        url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
    )
    try:
        client.ping()
    except MasterNotFoundError:  # (its text is a dump of a client)
        service = parse_sentinel(url).service
        reason = f"no Sentinel there answers with a primary for {service!r}"
        raise RegistryUnreachable(url, reason) from None
    except (redis.RedisError, OSError) as exc:
        raise RegistryUnreachable(url, str(exc).rstrip(".")) from None
    finally:
        client.close()


def publisher_for(namespace: str, url: str | None) -> AnyPublisher:
    if url is None:
        from discovery.publisher import Publisher

        return Publisher(namespace)
    from discovery.redis import RedisPublisher

    return RedisPublisher(url, namespace)


def subscriber_for(namespace: str, url: str | None) -> AsyncIterator[DiscoveryEvent]:
    if url is None:
        from discovery.subscriber import Subscriber

        return aiter(Subscriber(namespace))
    from discovery.redis import RedisSubscriber

    return aiter(RedisSubscriber(url, namespace))


def liveness_for(url: str | None) -> Callable[[str, UUID], bool]:
    """Whether a registered worker is alive, as the dispatcher asks (on a
    thread: both block) before linking it again: its liveness lock for
    shared memory; for Redis, a lease that has not run out."""
    if url is None:
        return _holds_liveness_lock
    from discovery.redis.keys import leased

    return functools.partial(leased, url)
