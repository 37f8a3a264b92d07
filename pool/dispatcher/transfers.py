"""The dispatcher's ``Transfers`` service: payloads between a client and a
worker of another machine, relayed (:mod:`workers.protocol.transfer`).

A client's fetch of a value goes to the worker that answered, as the
dispatcher named it in the answer (``Transfer.source``, the worker's
uid); a client's upload of a task's arguments goes to the worker its
``Want`` named (:meth:`pool.routing.links.WorkerLink.send`). Either
way the relay reads one chunk and writes it on before it reads the next,
so it holds one chunk (a few MiB) of a payload of any size, and gRPC's
flow control holds the rest at the sender. Run by
:mod:`pool.dispatcher.server`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from pool.routing.jobs import Link
from workers.protocol import worker_pb2_grpc
from workers.protocol.transfer import Chunks, FetchContext, UploadContext, first_chunk
from workers.protocol.worker_pb2 import Chunk, FetchRequest, UploadReply

_GONE = "no such worker here: it is gone (the task runs again)"


class RelayService(worker_pb2_grpc.TransfersServicer):
    """Fetches, relayed to the worker that holds the value.

    :param link_of: the link to a worker by its uid, if there is one.
    """

    def __init__(self, link_of: Callable[[uuid.UUID], Link | None]) -> None:
        self._link_of = link_of

    async def Fetch(self, request: FetchRequest, context: FetchContext) -> None:
        if (link := self._find(request.source)) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _GONE)
        assert link is not None

        async def relay() -> None:
            async for chunk in link.fetch(request):
                await context.write(chunk)

        await _relayed(relay(), context)

    async def Upload(self, chunks: Chunks, context: UploadContext) -> UploadReply:
        first = await first_chunk(chunks, context)
        if (link := self._find(first.source)) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _GONE)
        assert link is not None

        async def relayed() -> AsyncIterator[Chunk]:
            yield Chunk(token=first.token, size=first.size, data=first.data)
            async for chunk in chunks:
                yield chunk

        await _relayed(link.upload(relayed()), context)
        return UploadReply()

    def _find(self, source: str) -> Link | None:
        try:
            return self._link_of(uuid.UUID(source))
        except ValueError:
            return None


async def _relayed(
    call: Awaitable[None], context: aio.ServicerContext[Any, Any]
) -> None:
    """Run a call to the worker; its failure is the client's call's, said so."""
    try:
        await call
    except LookupError as exc:
        await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    except aio.AioRpcError as exc:
        await context.abort(exc.code(), f"from the worker: {exc.details()}")
