"""The pool's token and wire protocol version, checked on every call.

The token is 32 random bytes, kept as hex in ``<namespace dir>/token``
(0600, inside the private runtime directory), so only the user who runs
the pool can read it. Every gRPC call carries ``authorization: Bearer
<hex>`` and ``shmpool-protocol: <version>``. :class:`CallInterceptor`
refuses a call without the token (UNAUTHENTICATED), compared in constant
time, before a byte of the request is read, because tasks are unpickled
and unpickling is code execution; then a call of another protocol version
(FAILED_PRECONDITION, with a message that says what to do), so that a
client and a pool of different versions fail at connect time instead of
misreading each other's messages.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
from grpc import aio

from discovery import paths
from discovery.errors import Facts, PoolError

METADATA_KEY: Final = "authorization"
PROTOCOL_KEY: Final = "shmpool-protocol"
# The wire contract's version: the `v1` of the proto packages. Bump both
# together on any change a peer of the old version would misread.
PROTOCOL_VERSION: Final = "5"
TOKEN_FILE: Final = "token"
TOKEN_ENV: Final = "SHMPOOL_TOKEN"
MIN_TOKEN_CHARS: Final = 32


class BadToken(PoolError, PermissionError):
    """A token given to this process cannot be used: say where it came from."""


class MissingToken(Facts, PoolError, PermissionError):
    """The namespace has no token: no pool runs there."""

    namespace: str

    MESSAGE = (
        "namespace {namespace!r} has no pool token; start the pool with "
        "`python -m pool up --namespace {namespace}`"
    )


def create_token(namespace: str, token: str | None = None) -> str:
    """Make the namespace's token file (replacing a stale one), with
    ``token`` (one shared with workers on other hosts) or a fresh one;
    return it."""
    token = secrets.token_hex(32) if token is None else token
    path = paths.namespace_dir(namespace) / TOKEN_FILE
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
    fd = paths.open_private_file(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def pool_token(namespace: str, token_file: str | None = None) -> str:
    """The token of a pool that starts: the one given (``token_file``, else
    ``$SHMPOOL_TOKEN``), else a fresh one; written to the namespace's token
    file either way (see :func:`create_token`, :func:`token_for`)."""
    given = None
    if token_file or os.environ.get(TOKEN_ENV):
        given = token_for(namespace, token_file)
    return create_token(namespace, given)


def read_token(namespace: str) -> str:
    """The namespace's token.

    :raises MissingToken: if no pool has made one.
    """
    path = paths.namespace_dir(namespace, create=False) / TOKEN_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MissingToken(namespace) from None
    try:
        return os.read(fd, 256).decode().strip()
    finally:
        os.close(fd)


def token_for(namespace: str, token_file: str | None = None) -> str:
    """The token a pool process uses: the one in ``token_file`` if given,
    else ``$SHMPOOL_TOKEN`` if set (a worker on another host: never on its
    command line, where ``ps`` shows it), else this host's pool's.

    :raises BadToken: for a file that cannot be read, or a token too short.
    :raises MissingToken: if none is given and no pool here made one.
    """
    if token_file is not None:
        return read_secret(token_file, "token", "run code in the pool")
    if (given := os.environ.get(TOKEN_ENV)) is not None:
        return _checked(given.strip(), f"${TOKEN_ENV}")
    return read_token(namespace)


def read_secret(path: str, what: str, grants: str) -> str:
    """The secret (``what``: the token, or the dashboard's key) in the file
    ``path``; a warning, as ssh gives of a key, when others may read it
    (whoever reads it may ``grants``).

    :raises BadToken: for a file that cannot be read, or a secret too short.
    """
    try:
        with open(path, encoding="ascii") as source:
            mode = os.fstat(source.fileno()).st_mode
            if mode & 0o077:
                logging.getLogger("shm-pool").warning(
                    "warning: the %s file %s can be read by others (mode %04o): "
                    "whoever reads it can %s; chmod 600 %s",
                    *(what, path, stat.S_IMODE(mode), grants, path),
                )
            return _checked(source.read().strip(), path, what)
    except (OSError, UnicodeDecodeError) as exc:
        raise BadToken(f"cannot read the {what} file {path!r}: {exc}") from None


def _checked(token: str, source: str, what: str = "token") -> str:
    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        raise BadToken(
            f"the {what} in {source} must be at least {MIN_TOKEN_CHARS} printable "
            f"ASCII characters (make one with `openssl rand -hex 32`)"
        )
    return token


def call_metadata(
    token: str, protocol: str | None = None
) -> tuple[tuple[str, str], ...]:
    """The metadata every call to a pool process carries (``protocol``:
    this version's, unless a test plays another)."""
    version = PROTOCOL_VERSION if protocol is None else protocol
    return ((METADATA_KEY, f"Bearer {token}"), (PROTOCOL_KEY, version))


def protocol_mismatch(theirs: str | None) -> str:
    """What a pool says to a caller of another protocol version."""
    return (
        f"protocol mismatch: this pool speaks shm-pool protocol "
        f"{PROTOCOL_VERSION}, the caller {theirs or 'none'}; use the same "
        f"shm-pool version for the pool and its clients"
    )


_HANDLER_OF_KIND: Final = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _refusal(code: grpc.StatusCode, details: str) -> Any:
    async def refuse(request: Any, context: aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, details)

    return refuse


_UNAUTHENTICATED: Final = _refusal(
    grpc.StatusCode.UNAUTHENTICATED,
    "missing or wrong pool token: read it from the pool's runtime directory "
    "(pool.Client does this for you)",
)


class CallInterceptor(aio.ServerInterceptor):
    """Refuses every call without the pool's token (UNAUTHENTICATED), then
    every call of another protocol version (FAILED_PRECONDITION)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails],
            Awaitable[grpc.RpcMethodHandler[Any, Any] | None],
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        metadata = dict(handler_call_details.invocation_metadata or ())
        refusal = None
        if not self._allows(metadata.get(METADATA_KEY)):
            refusal = _UNAUTHENTICATED
        elif (protocol := metadata.get(PROTOCOL_KEY)) != PROTOCOL_VERSION:
            text = protocol.decode() if isinstance(protocol, bytes) else protocol
            refusal = _refusal(
                grpc.StatusCode.FAILED_PRECONDITION, protocol_mismatch(text)
            )
        handler = await continuation(handler_call_details)
        if refusal is None:
            return handler
        kind = (False, False)
        if handler is not None:
            kind = (handler.request_streaming, handler.response_streaming)
        return _HANDLER_OF_KIND[kind](refusal)

    def _allows(self, given: str | bytes | None) -> bool:
        if given is None:
            return False
        given = given.encode() if isinstance(given, str) else given
        return hmac.compare_digest(given, self._expected)
