"""What every pool process does the same way: serve (the token checked),
bind, say READY, wait to stop.

Shared by the worker (:mod:`workers.process`) and the dispatcher
(:mod:`pool.dispatcher.server`). A child tells its parent it serves by writing
one ``READY {json}`` line (anyio's convention) to ``--ready-fd``; it stops on
SIGTERM, SIGINT or its parent's death, seen at once through a pidfd the
parent opened on itself and passed down (``--parent-fd``): a descriptor
names one process for good, where a pid may be reused.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import logging
import os
import signal
import socket as socket_module
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from discovery.errors import Facts, PoolError
from workers.common.channels import GRPC_OPTIONS
from workers.protocol import auth

LOOPBACK: Final = "127.0.0.1"
WILDCARDS: Final = frozenset({"0.0.0.0", "::"})  # every interface
READY_PREFIX: Final = "READY "

log = logging.getLogger(__name__)


class ParentGone(Facts, PoolError, OSError):
    """The process that started this one stopped waiting for it to start
    (it gave up on a start that took too long, or it exited)."""

    MESSAGE = "its supervisor no longer waits for it to start"


class CannotListen(Facts, PoolError, OSError):
    """A pool process cannot listen where it was told to (``--host``)."""

    where: str
    reason: str

    MESSAGE = "cannot listen on {where}: {reason}"


def check_host(host: str) -> None:
    """:raises CannotListen: unless a TCP port can be bound on ``host`` here
    (it resolves, and to an address of this machine)."""
    try:
        infos = socket_module.getaddrinfo(
            host.strip("[]"), 0, type=socket_module.SOCK_STREAM
        )
        family, kind, proto, _, address = infos[0]
        with socket_module.socket(family, kind, proto) as probe:
            probe.bind(address)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CannotListen(
            repr(host), f"{reason}; give an address of this machine"
        ) from None


def server(token: str) -> aio.Server:
    """A pool process's gRPC server: every call must carry ``token``
    (checked before anything is read), with the pool's options."""
    return aio.server(interceptors=[auth.CallInterceptor(token)], options=GRPC_OPTIONS)


def bind(
    server: aio.Server,
    host: str | None,
    socket: Callable[[], Path],
    *,
    port: int = 0,
    advertise: str | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[str, Path | None]:
    """Listen on ``host:port`` (0: a free port), else on the unix socket
    ``socket()`` names.

    :param advertise: ``HOST[:PORT]`` to publish instead of the bound
        address (NAT, containers; the bound port if none is given). With
        ``host`` a wildcard (``0.0.0.0``, ``::``) and no ``advertise``, this
        machine's host name is published.
    :param credentials: TLS for a TCP server (None: plain text).
    :returns: the gRPC target clients use, and the socket path to remove at
        exit (None for TCP).
    :raises CannotListen: if it cannot.
    """
    if host:
        check_host(host)
        if not is_loopback(host) and credentials is None:
            log.warning(
                "listening on %s: other machines can reach this port; every call "
                "needs the token, but traffic is not encrypted (see SECURITY.md)",
                host,
            )
        where = f"{host}:{port}"
        if credentials is not None:
            bound = server.add_secure_port(where, credentials)
        else:
            bound = server.add_insecure_port(where)
        return _published(host, bound, advertise), None
    path = socket()
    path.unlink(missing_ok=True)  # left by a dead predecessor
    server.add_insecure_port(f"unix:{path}")
    return f"unix:{path}", path


def _published(host: str, port: int, advertise: str | None) -> str:
    """The address to publish for a server bound to ``host:port``."""
    if advertise is None:
        if host.strip("[]") not in WILDCARDS:
            return _target(host, port)
        advertise = socket_module.gethostname()
    name, colon, given = advertise.rpartition(":")
    if colon and given.isdigit() and not name.endswith(":"):  # HOST:PORT
        return advertise
    return _target(advertise, port)


def _target(host: str, port: int) -> str:
    bare_ipv6 = ":" in host and not host.startswith("[")
    return f"[{host}]:{port}" if bare_ipv6 else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True if ``host`` names only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    """TLS for a server, from PEM files (grpc's own credentials).

    :raises CannotListen: if a file cannot be read.
    """
    try:
        with open(cert_file, "rb") as cert, open(key_file, "rb") as key:
            return grpc.ssl_server_credentials([(key.read(), cert.read())])
    except OSError as exc:
        raise CannotListen(
            "TLS", f"cannot read {exc.filename!r}: {exc.strerror}"
        ) from None


def redirect_output(fd: int | None) -> None:
    """Point stdout and stderr at ``fd`` (the supervisor's pipe, which shows
    each line prefixed by who wrote it), written line by line."""
    if fd is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)


def announce_ready(ready_fd: int | None, **fields: Any) -> None:
    """Tell the parent this process serves: one ``READY {json}`` line on
    ``ready_fd`` (then closed), or on stdout when there is none.

    A dedicated descriptor keeps stdout free for what tasks print: a parent
    that stopped reading a stdout pipe would stall a chatty task.
    """
    tell_parent(ready_fd, READY_PREFIX + json.dumps(fields))


def tell_parent(ready_fd: int | None, line: str) -> None:
    """Write ``line`` on ``ready_fd`` (then closed), or on stdout."""
    data = (line + "\n").encode()
    if ready_fd is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        os.write(ready_fd, data)
    except BrokenPipeError as exc:
        raise ParentGone() from exc
    finally:
        os.close(ready_fd)


class Stopper:
    """SIGTERM, SIGINT or the death of the process ``parent_fd`` names (a
    pidfd), caught from creation on.

    Create it first thing in a process's main coroutine: a signal that
    comes before it exists kills the process outright, undrained.
    """

    def __init__(self, parent_fd: int | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(signum, self._stop.set)
        self._parent_fd = parent_fd
        if parent_fd is not None:
            self._loop.add_reader(parent_fd, self._stop.set)  # readable: it exited

    async def wait(self) -> None:
        """Return once told to stop."""
        await self._stop.wait()

    def stop(self) -> None:
        """Stop as if signalled."""
        self._stop.set()

    def close(self) -> None:
        if self._parent_fd is not None:
            self._loop.remove_reader(self._parent_fd)
            os.close(self._parent_fd)
            self._parent_fd = None
