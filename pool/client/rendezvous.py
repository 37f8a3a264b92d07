"""Where a pool's dispatcher is, for its clients.

On its machine, the supervisor writes the dispatcher's address in the
namespace's runtime directory (``address``, private to the user) beside the
token, and a client reads both (:func:`locate`).

For clients of other machines, a pool on Redis discovery (``pool up
--discovery redis://...``) also announces the address in Redis, under a
lease (:mod:`pool.client.announcements`); several hosts may each run a
dispatcher of the same pool. A client given the same URL finds them there
(:class:`Locator`), takes the least loaded of them (:mod:`pool.client.loads`),
another when that one goes, and its
token from a file or ``$SHMPOOL_TOKEN``, never from Redis: whoever can read
Redis must not be able to run code in the pool.

Callers: the supervisor, the clients and the command line.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Final

import grpc
from grpc import aio

from discovery import owner_pid, paths
from pool.client import announcements, loads
from pool.client.announcements import Announced
from pool.errors import PoolNotRunning, PoolRefused
from workers.common import channels
from workers.common.offload import Offload
from workers.protocol import auth

ADDRESS_FILE: Final = "address"
DATA_FILE: Final = "data-plane"
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


@dataclass(frozen=True)
class DataPlane:
    """How clients hand a pool large data: through shared memory, from the
    machine ``host`` names (:func:`workers.protocol.segments.host_id`), at
    most ``limit_bytes`` at once (``--shm-limit``; None: what /dev/shm has).
    A pool on shared-memory discovery says it in the ``data-plane`` file
    beside its address; one on Redis (workers anywhere) does not."""

    host: str
    limit_bytes: int | None = None

    def encode(self) -> str:
        return json.dumps({"host": self.host, "limit_bytes": self.limit_bytes})

    @classmethod
    def read(cls, namespace: str) -> DataPlane | None:
        """This machine's pool's, if it says one (None if unreadable)."""
        path = paths.namespace_dir(namespace, create=False) / DATA_FILE
        try:
            fields = json.loads(path.read_text())
            limit = fields.get("limit_bytes")
            return cls(str(fields["host"]), limit if isinstance(limit, int) else None)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class Target:
    """A dispatcher to call: its address, the token, and whether it serves TLS."""

    address: str
    token: str
    tls: bool = False
    data: DataPlane | None = None  # (only this machine's pool's)
    id: str = ""  # (only an announced one's: see pool.client.announcements)


def _here(namespace: str) -> Target:
    return Target(*locate(namespace), data=DataPlane.read(namespace))


@dataclass(frozen=True)
class Locator:
    """How a client finds its pool: on this machine by default; through the
    Redis at ``discovery_url`` if given, with the token in ``token_file``
    (else ``$SHMPOOL_TOKEN``, else this machine's pool's), and ``tls_ca``,
    the CA of a dispatcher that serves TLS (else the system's roots)."""

    namespace: str
    discovery_url: str | None = None
    token_file: str | None = None
    tls_ca: str | None = None

    async def locate(
        self, offload: Offload | None = None, avoid: frozenset[str] = frozenset()
    ) -> Target:
        """The dispatcher to call. This machine's pool is looked up (files
        read, a lock probed) on a thread: ``offload``'s, else asyncio's. Of
        the dispatchers announced in Redis, the least loaded by what each
        answers (:mod:`pool.client.loads`), not one whose id is in
        ``avoid`` while another is announced.

        :raises PoolNotRunning: if no live pool announces it.
        :raises PoolRefused: if there is no token to call it with.
        """
        if self.discovery_url is None:
            run = offload.run if offload is not None else asyncio.to_thread
            return await run(_here, self.namespace)
        try:
            found = await announcements.live(self.discovery_url, self.namespace)
        except announcements.unavailable() as exc:
            raise self._unreachable(exc) from None
        targets = self._targets([a for a in found if a.id not in avoid] or found)
        return await loads.least_loaded(
            targets, lambda target: self.channel(target, offload)
        )

    async def channel(
        self, target: Target, offload: Offload | None = None
    ) -> aio.Channel:
        """A channel to the dispatcher ``target`` (TLS if it serves it, the
        CA read on ``offload``'s thread, else asyncio's).

        :raises PoolRefused: if the CA file cannot be read.
        """
        if target.tls:
            run = offload.run if offload is not None else asyncio.to_thread
            return channels.channel(target.address, await run(self.credentials))
        return channels.channel(target.address)

    def blocking_channel(self, target: Target) -> grpc.Channel:
        """:meth:`channel` for code without an event loop.

        :raises PoolRefused: if the CA file cannot be read.
        """
        tls = self.credentials() if target.tls else None
        return channels.blocking_channel(target.address, tls)

    def all_now(self) -> list[Target]:
        """Every dispatcher of the pool: this machine's, or each one
        announced in Redis.

        :raises PoolNotRunning: if there is none.
        :raises PoolRefused: if there is no token to call them with.
        """
        if self.discovery_url is None:
            return [_here(self.namespace)]
        try:
            found = announcements.live_sync(self.discovery_url, self.namespace)
        except announcements.unavailable() as exc:
            raise self._unreachable(exc) from None
        return self._targets(found)

    def locate_now(self) -> Target:
        """:meth:`locate` for code without an event loop."""
        if self.discovery_url is None:
            return _here(self.namespace)
        return asyncio.run(self.locate())

    def credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials for a dispatcher that serves it.

        :raises PoolRefused: if ``tls_ca`` cannot be read.
        """
        if self.tls_ca is None:
            return grpc.ssl_channel_credentials()
        try:
            with open(self.tls_ca, "rb") as source:
                return grpc.ssl_channel_credentials(source.read())
        except OSError as exc:
            raise PoolRefused(
                self.namespace, f"cannot read the CA file {self.tls_ca!r}: {exc}"
            ) from None

    def _unreachable(self, exc: BaseException) -> PoolNotRunning:
        return PoolNotRunning(
            self.namespace,
            f"cannot reach the registry at {self.discovery_url}: {exc}",
            "check that Redis runs there and that the URL is right",
        )

    def _targets(self, found: list[Announced]) -> list[Target]:
        """The announced dispatchers, as a client calls them.

        :raises PoolNotRunning: if there is none, or one listens on a unix
            socket of another machine.
        """
        if not found:
            raise PoolNotRunning(
                self.namespace, f"no dispatcher is announced in {self.discovery_url}"
            )
        for where in found:
            socket = where.address.removeprefix("unix:")
            if socket != where.address and not os.path.exists(socket):
                raise PoolNotRunning(
                    self.namespace,
                    "its dispatcher listens on a unix socket of another machine; "
                    "start the pool with `pool up --host 0.0.0.0`",
                )
        token = self._token()
        return [Target(a.address, token, a.tls, id=a.id) for a in found]

    def _token(self) -> str:
        try:
            return auth.token_for(self.namespace, self.token_file)
        except auth.MissingToken:
            raise PoolRefused(self.namespace, NO_TOKEN) from None
