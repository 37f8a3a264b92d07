"""Where a pool's dispatcher is, for its clients.

On its machine, the supervisor writes the dispatcher's address in the
namespace's runtime directory (``address``, private to the user) beside the
token, and a client reads both (:func:`locate`).

For clients of other machines, a pool on Redis discovery (``pool up
--discovery redis://...``) also announces the address in Redis, under a
lease that the supervisor renews (:func:`announce`: ``shmp:{ns}:dispatcher``,
:data:`LEASE_S`, renewed every :data:`RENEW_S`, deleted at stop, so a dead
pool's address runs out). A client given the same URL reads it there
(:class:`Locator`), and takes its token from a file or ``$SHMPOOL_TOKEN``,
never from Redis: whoever can read Redis must not be able to run code in
the pool.

Callers: the supervisor, the clients and the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from discovery import owner_pid, paths
from pool.errors import PoolNotRunning, PoolRefused
from workers import auth

ADDRESS_FILE: Final = "address"
LEASE_S: Final = 3.0
RENEW_S: Final = 1.0
_GIVE: Final = (
    "give the one the pool was started with "
    f"(`--token-file PATH`, `token_file=`, or ${auth.TOKEN_ENV})"
)
NO_TOKEN: Final = f"this machine has no token for it; {_GIVE}"
WRONG_TOKEN: Final = f"it does not take our token; {_GIVE}"


def locate(namespace: str) -> tuple[str, str]:
    """The dispatcher address and token of this machine's pool of
    ``namespace``.

    :raises PoolNotRunning: if no live pool serves it.
    """
    directory = paths.namespace_dir(namespace, create=False)
    try:
        address = (directory / ADDRESS_FILE).read_text().strip()
        token = auth.read_token(namespace)
    except (FileNotFoundError, auth.MissingToken):
        raise PoolNotRunning(namespace) from None
    if owner_pid(namespace) is None:  # files a dead pool left
        raise PoolNotRunning(namespace, "its last pool died")
    return address, token


# redis is imported when it is used: the shared-memory path never pays for it.


def _dispatcher_key(namespace: str) -> str:
    from discovery.remote import key

    return key(namespace, "dispatcher")


def _unavailable() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.ConnectionError, redis.TimeoutError, OSError)


async def announce(url: str, namespace: str, address: Callable[[], str]) -> None:
    """Keep the dispatcher's ``address()`` in Redis until cancelled, then
    remove it. While Redis is unreachable, it tries again at each renewal."""
    import redis.asyncio as aioredis

    unavailable = _unavailable()
    client = aioredis.Redis.from_url(url, socket_connect_timeout=1.0)
    name = _dispatcher_key(namespace)
    try:
        while True:
            with contextlib.suppress(*unavailable):
                await client.set(name, address(), px=int(LEASE_S * 1000))
            await asyncio.sleep(RENEW_S)  # the lease's heartbeat
    finally:
        with contextlib.suppress(*unavailable):
            await asyncio.shield(client.delete(name))
        await client.aclose()


@dataclass(frozen=True)
class Locator:
    """How a client finds its pool: on this machine by default; through the
    Redis at ``discovery_url`` if given, with the token in ``token_file``
    (else ``$SHMPOOL_TOKEN``, else this machine's pool's)."""

    namespace: str
    discovery_url: str | None = None
    token_file: str | None = None

    async def locate(self) -> tuple[str, str]:
        """The dispatcher's address and the token to call it with.

        :raises PoolNotRunning: if no live pool announces it.
        """
        if self.discovery_url is None:
            return locate(self.namespace)
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.discovery_url, socket_connect_timeout=1.0)
        try:
            found = await client.get(_dispatcher_key(self.namespace))
        except _unavailable() as exc:
            raise PoolNotRunning(
                self.namespace, f"cannot reach {self.discovery_url}: {exc}"
            ) from None
        finally:
            await client.aclose()
        return self._checked(found), self._token()

    def locate_now(self) -> tuple[str, str]:
        """:meth:`locate` for code without an event loop."""
        if self.discovery_url is None:
            return locate(self.namespace)
        import redis

        client = redis.Redis.from_url(self.discovery_url, socket_connect_timeout=1.0)
        try:
            found = client.get(_dispatcher_key(self.namespace))
        except _unavailable() as exc:
            raise PoolNotRunning(
                self.namespace, f"cannot reach {self.discovery_url}: {exc}"
            ) from None
        finally:
            client.close()
        return self._checked(found), self._token()

    def _checked(self, found: object) -> str:
        if not isinstance(found, bytes):
            raise PoolNotRunning(
                self.namespace, f"no dispatcher is announced in {self.discovery_url}"
            )
        address = found.decode()
        if address.startswith("unix:") and not os.path.exists(address[5:]):
            raise PoolNotRunning(
                self.namespace,
                "its dispatcher listens on a unix socket of another machine; "
                "start the pool with `pool up --host 0.0.0.0`",
            )
        return address

    def _token(self) -> str:
        try:
            return auth.token_for(self.namespace, self.token_file)
        except auth.MissingToken:
            raise PoolRefused(self.namespace, NO_TOKEN) from None
