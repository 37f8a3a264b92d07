"""The pool's token: made by the supervisor, required on every call.

The token is 32 random bytes, kept as hex in ``<namespace dir>/token``
(0600, inside the private runtime directory), so only the user who runs
the pool can read it. Every gRPC call carries ``authorization: Bearer
<hex>``; :class:`TokenInterceptor` refuses any call without it, compared
in constant time, before a byte of the request is read, because tasks are
unpickled and unpickling is code execution.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
from grpc import aio

from discovery import paths

METADATA_KEY: Final = "authorization"
TOKEN_FILE: Final = "token"


class MissingToken(PermissionError):
    """The namespace has no token: no pool runs there."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        super().__init__(
            f"namespace {namespace!r} has no pool token; start the pool with "
            f"`python -m pool up --namespace {namespace}`"
        )


def create_token(namespace: str) -> str:
    """Make the namespace's token file (replacing a stale one); return it."""
    token = secrets.token_hex(32)
    path = paths.namespace_dir(namespace) / TOKEN_FILE
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
    fd = paths.open_private_file(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


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


def call_metadata(token: str) -> tuple[tuple[str, str]]:
    """The metadata every call to a pool process carries."""
    return ((METADATA_KEY, f"Bearer {token}"),)


_HANDLER_OF_KIND: Final = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


async def _refuse(request: Any, context: aio.ServicerContext[Any, Any]) -> None:
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        "missing or wrong pool token: read it from the pool's runtime directory "
        "(pool.Client does this for you)",
    )


class TokenInterceptor(aio.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call without the pool's token."""

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
        if self._allows(handler_call_details.invocation_metadata or ()):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        kind = (False, False)
        if handler is not None:
            kind = (handler.request_streaming, handler.response_streaming)
        return _HANDLER_OF_KIND[kind](_refuse)

    def _allows(self, metadata: Any) -> bool:
        for key, value in metadata:
            if key == METADATA_KEY:
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False
