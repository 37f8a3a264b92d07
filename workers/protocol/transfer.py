"""Payloads between a client and a worker of another machine: held by the
process that made them, and sent on in chunks through the dispatcher.

Shared memory ends at the machine's edge. A payload that pickles to at
least :data:`TRANSFER_MIN` bytes (its pickle and out-of-band buffers, as
for shared memory), between processes that share no memory, is not put in
a message: its maker holds it (:class:`Held`) and the message carries a
:class:`Data` naming it (a ``Transfer``: an unguessable token, the size).

- A value: the worker holds it (:data:`HELD`); the dispatcher names the
  worker in the answer (``source``, :mod:`pool.routing.links`); the
  client fetches it (``Transfers.Fetch``) from the dispatcher, which relays
  the fetch to the worker. Held until fetched, once (a fetch that breaks
  loses it, and the client runs the task again), for at most
  :data:`KEEP_S`; a worker that stops waits, up to its grace, for what it
  holds and for what it is sending.
- Arguments: the client holds them (:data:`OFFERED`) until the task ends.
  Each time the dispatcher sends the task to a worker, it asks the client
  for them (a ``Want``), and the client uploads them (``Transfers.Upload``)
  through the dispatcher to that worker, which keeps them (:data:`ARRIVED`)
  for the task; the task's slot waits for them when it takes it.

So no payload is capped by gRPC's message size, and the dispatcher holds
one chunk (:data:`CHUNK_BYTES`) of one at a time: it reads the next only
once it has written the last, and gRPC's flow control holds the rest at
the sender. Callers: :mod:`workers.protocol.codec` (values and arguments),
the worker's server, the client, the dispatcher's relay.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import pickle
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Final

import grpc
from grpc import aio

from workers.protocol import worker_pb2_grpc
from workers.protocol.errors import DataGone, TransferLost
from workers.protocol.worker_pb2 import (
    Chunk,
    Data,
    FetchRequest,
    Result,
    Task,
    Transfer,
    UploadReply,
)

# What both ends of the Transfers service are given (the worker's service
# here, the dispatcher's relay in pool.dispatcher.transfers).
Chunks = AsyncIterator[Chunk]
FetchContext = aio.ServicerContext[FetchRequest, Chunk]
UploadContext = aio.ServicerContext[Chunk, UploadReply]

# A payload pickled to this many bytes or more is held and sent on in
# chunks, rather than put in a message (which stays far under gRPC's limit).
TRANSFER_MIN: Final = 8 << 20
CHUNK_BYTES: Final = 4 << 20  # each Chunk's data, at most
KEEP_S: Final = 60.0  # how long a value waits for its fetch


class Held:
    """Payloads a process holds for readers of other machines, by token;
    with ``keep_s``, each for at most that long. Thread-safe (a worker's
    slot threads hold values; its loop serves the fetches)."""

    def __init__(self, keep_s: float | None = KEEP_S) -> None:
        self._keep_s = keep_s
        self._lock = threading.Lock()
        self._payloads: dict[bytes, tuple[float, list[memoryview]]] = {}
        self._sending = 0  # fetches under way (the loop's)
        self._changed: asyncio.Event | None = None  # for wait_fetched

    def __len__(self) -> int:
        return len(self._payloads)

    def hold(self, pickled: bytes, buffers: Sequence[memoryview] = ()) -> Data:
        """Hold a pickle and its out-of-band buffers; the Data that names
        them, each part at its offset in the stream sent on."""
        parts = [memoryview(pickled), *(view.cast("B") for view in buffers)]
        data = Data(transfer=Transfer(token=secrets.token_bytes(16)))
        offset = 0
        for part in parts:
            data.parts.add(offset=offset, length=part.nbytes)
            offset += part.nbytes
        data.transfer.size = offset
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            self._payloads[data.transfer.token] = (now, parts)
        return data

    def get(self, token: bytes) -> list[memoryview] | None:
        """What ``token`` names, held still (None: not held)."""
        with self._lock:
            entry = self._payloads.get(token)
        return None if entry is None else entry[1]

    def take(self, token: bytes) -> list[memoryview] | None:
        """What ``token`` names, no longer held (None: not held)."""
        with self._lock:
            self._expire(time.monotonic())
            entry = self._payloads.pop(token, None)
        if self._changed is not None:
            self._changed.set()
        return None if entry is None else entry[1]

    @contextlib.contextmanager
    def sending(self, token: bytes) -> Iterator[list[memoryview] | None]:
        """:meth:`take` ``token``, while what it names is sent on (on the
        loop): :meth:`wait_fetched` waits for the send too."""
        self._sending += 1
        try:
            yield self.take(token)
        finally:
            self._sending -= 1
            if self._changed is not None:
                self._changed.set()

    def _expire(self, now: float) -> None:
        if self._keep_s is None:
            return
        for token, (since, _) in list(self._payloads.items()):
            if now - since > self._keep_s:
                del self._payloads[token]

    async def wait_fetched(self, timeout_s: float) -> None:
        """Return once nothing is held or being sent, or after ``timeout_s``
        (a stopping worker's server cuts what it still sends then)."""
        self._changed = asyncio.Event()
        deadline = time.monotonic() + timeout_s
        while (self._payloads or self._sending) and (
            left := deadline - time.monotonic()
        ) > 0:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
            except TimeoutError:
                self.take(b"")  # (expires what waited too long)


HELD: Final = Held()  # a worker's values, until fetched
OFFERED: Final = Held(keep_s=None)  # a client's arguments, until answered


def chunks(parts: Sequence[memoryview]) -> Iterator[Chunk]:
    """The Chunks of a held value, in order."""
    for part in parts:
        for start in range(0, part.nbytes, CHUNK_BYTES):
            yield Chunk(data=bytes(part[start : start + CHUNK_BYTES]))


def upload_chunks(
    held: Transfer, source: str, parts: Sequence[memoryview]
) -> Iterator[Chunk]:
    """The Chunks of an upload of ``parts`` to the worker ``source``: the
    first says what follows."""
    pieces = chunks(parts)
    first = next(pieces, Chunk())
    first.token, first.size, first.source = held.token, held.size, source
    yield first
    yield from pieces


async def receive(
    stream: AsyncIterator[Chunk], size: int, first: bytes = b""
) -> bytearray:
    """A payload's bytes, as they come (``first`` of them already here).

    :raises DataGone: if the stream brings more or fewer than ``size``.
    """
    buffer = bytearray(size)
    position = len(first)
    if position > size:
        raise TransferLost("a payload", f"over {position} bytes came of {size}")
    buffer[:position] = first
    async for chunk in stream:
        end = position + len(chunk.data)
        if end > size:
            break
        buffer[position:end] = chunk.data
        position = end
    if position != size:
        raise TransferLost("a payload", f"{position} bytes came of {size}")
    return buffer


def loads(data: Data, fetched: bytearray) -> Any:
    """Unpickle a payload that came: its buffers are views of ``fetched``
    (writable, as a copy is), with no copy more."""
    whole = memoryview(fetched)
    views = [whole[p.offset : p.offset + p.length] for p in data.parts]
    pickled = data.pickle if data.pickle else views.pop(0)
    return pickle.loads(pickled, buffers=views)


class Arrivals:
    """Payloads that came, by token, until their reader takes them: a
    client's fetched values (its loop fetches and unpickles), a worker's
    uploaded arguments (its loop receives them, a slot thread waits for
    them). A worker claims the arguments of each task it holds, and lets go
    of them when it answers the task; what came unclaimed (for a task sent
    elsewhere meanwhile) goes after ``keep_s``."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self._keep_s = keep_s
        self._came = threading.Condition()
        self._bytes: dict[bytes, tuple[float, bytearray]] = {}
        self._claimed: set[bytes] = set()
        self._coming: collections.Counter[bytes] = collections.Counter()

    def claim(self, token: bytes) -> None:
        with self._came:
            self._claimed.add(token)

    def release(self, token: bytes) -> None:
        with self._came:
            self._claimed.discard(token)
            self._bytes.pop(token, None)

    @contextlib.contextmanager
    def coming(self, token: bytes) -> Iterator[None]:
        """While an upload of ``token`` comes in: its reader waits on."""
        with self._came:
            self._coming[token] += 1
        try:
            yield
        finally:
            with self._came:
                self._coming[token] -= 1
                if not self._coming[token]:
                    del self._coming[token]
                self._came.notify_all()

    def put(self, token: bytes, payload: bytearray) -> None:
        with self._came:
            self._expire()
            self._bytes[token] = (time.monotonic(), payload)
            self._came.notify_all()

    def take(self, data: Data, wait_s: float = 0.0) -> bytearray | None:
        """The bytes of ``data``, once they are here: waiting up to
        ``wait_s``, and on while they are coming; None if they did not."""
        token = data.transfer.token
        deadline = time.monotonic() + wait_s
        with self._came:
            while token not in self._bytes:
                left = 1.0 if token in self._coming else deadline - time.monotonic()
                if left <= 0:
                    break
                self._came.wait(left)
            entry = self._bytes.pop(token, None)
            self._expire()
        return None if entry is None else entry[1]

    def _expire(self) -> None:
        now = time.monotonic()
        for token, (since, _) in list(self._bytes.items()):
            if now - since > self._keep_s and token not in self._claimed:
                del self._bytes[token]


ARRIVED: Final = Arrivals()  # this process's


async def first_chunk(chunks: Chunks, context: UploadContext) -> Chunk:
    """An upload's first chunk, which says what it is for; an empty upload
    is refused with INVALID_ARGUMENT."""
    first = await anext(aiter(chunks), None)
    if first is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an empty upload")
    assert first is not None  # (abort raises)
    return first


def transfer_of(message: Task | Result) -> Transfer | None:
    """What a task's arguments or a result's value is held as, if it is
    (None: in the message, or in shared memory)."""
    if message.HasField("data") and message.data.HasField("transfer"):
        return message.data.transfer
    return None


class HeldService(worker_pb2_grpc.TransfersServicer):
    """A worker's ``Transfers``: the values it holds, once each, and the
    arguments it is sent."""

    def __init__(self, held: Held = HELD) -> None:
        self._held = held

    async def Fetch(self, request: FetchRequest, context: FetchContext) -> None:
        with self._held.sending(request.token) as parts:
            if parts is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    "this worker holds no such value (fetched already, or it "
                    f"waited over {KEEP_S:.0f} s)",
                )
            for chunk in chunks(parts or ()):
                await context.write(chunk)

    async def Upload(self, chunks: Chunks, context: UploadContext) -> UploadReply:
        first = await first_chunk(chunks, context)
        try:
            payload = await receive(chunks, first.size, first.data)
        except DataGone as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        ARRIVED.put(first.token, payload)
        return UploadReply()
