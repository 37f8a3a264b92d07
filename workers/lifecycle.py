"""What every pool process does the same way: bind, say READY, wait to stop.

Shared by the worker (:mod:`workers.process`) and the dispatcher
(:mod:`pool.dispatcher`). A child tells its parent it serves by printing
one ``READY {json}`` line on stdout (anyio's convention); it stops on
SIGTERM, SIGINT or its parent's death, seen at once through a pidfd.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Final

from grpc import aio

MAX_MESSAGE_BYTES: Final = 128 * 1024 * 1024
GRPC_OPTIONS: Final = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.optimization_target", "latency"),
)
READY_PREFIX: Final = "READY "


def bind(server: aio.Server, host: str | None, socket: Path) -> tuple[str, Path | None]:
    """Listen on ``host:<free port>``, else on the unix ``socket``.

    :returns: the gRPC target clients use, and the socket path to remove at
        exit (None for TCP).
    """
    if host:
        port = server.add_insecure_port(f"{host}:0")
        return f"{f'[{host}]' if ':' in host else host}:{port}", None
    socket.unlink(missing_ok=True)  # left by a dead predecessor
    server.add_insecure_port(f"unix:{socket}")
    return f"unix:{socket}", socket


def announce_ready(**fields: Any) -> None:
    """Tell the parent this process serves."""
    sys.stdout.write(READY_PREFIX + json.dumps(fields) + "\n")
    sys.stdout.flush()


async def until_stopped(parent: int | None) -> None:
    """Return on SIGTERM, SIGINT or the death of ``parent``."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    parent_fd = None
    if parent is not None:
        try:
            parent_fd = os.pidfd_open(parent)
        except ProcessLookupError:
            return  # gone already
        loop.add_reader(parent_fd, stop.set)
    try:
        await stop.wait()
    finally:
        if parent_fd is not None:
            loop.remove_reader(parent_fd)
            os.close(parent_fd)
