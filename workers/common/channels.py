"""A channel to a pool process: the one way every process opens one.

A dispatcher links its workers, a client (and the command line, the
supervisor, the dashboard) calls a dispatcher: each to an address it found
(``unix:PATH`` or ``HOST:PORT``, from the registry or a runtime file), in
plain text or TLS, always with the pool's options (:data:`GRPC_OPTIONS`:
message bounds, latency first). The caller owns the channel and closes it.
"""

from __future__ import annotations

from typing import Final

import grpc
from grpc import aio

from workers.protocol.codec import MAX_MESSAGE_BYTES

GRPC_OPTIONS: Final = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.optimization_target", "latency"),
)  # (the servers' too)
TLS_EXTRA: Final = "tls"  # in WorkerInfo.extra: "1" when the worker serves TLS


def channel(address: str, tls: grpc.ChannelCredentials | None = None) -> aio.Channel:
    """A grpc.aio channel to ``address``, over TLS checked with ``tls``
    (None: plain text). Create it inside the loop that will use it."""
    if tls is not None:
        return aio.secure_channel(address, tls, options=GRPC_OPTIONS)
    return aio.insecure_channel(address, options=GRPC_OPTIONS)


def blocking_channel(
    address: str, tls: grpc.ChannelCredentials | None = None
) -> grpc.Channel:
    """:func:`channel` for code without an event loop."""
    if tls is not None:
        return grpc.secure_channel(address, tls, options=GRPC_OPTIONS)
    return grpc.insecure_channel(address, options=GRPC_OPTIONS)
