"""A client's connection through its states, against a dispatcher that plays
a part per stream (a real grpc.aio server on loopback): a broken stream is
reconnected and its unanswered tasks sent again; a stream the dispatcher
ends fails what is pending; a refusal fails everything for good."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from pool import dispatcher_pb2_grpc
from pool.client.connection import Connection
from pool.client.rendezvous import Locator, Target
from pool.dispatcher_pb2 import Submission
from pool.errors import PoolNotRunning, PoolRefused
from workers.common.offload import Offload
from workers.protocol import codec
from workers.protocol.worker_pb2 import Result, ResultBatch, Task

pytestmark = pytest.mark.timeout(30)


class Dispatcher(dispatcher_pb2_grpc.DispatcherServicer):
    """Plays one part per stream, in order: ``break`` (after reading a
    batch), ``answer`` (every task, with its id), ``end`` (return), or
    ``refuse`` (UNAUTHENTICATED)."""

    def __init__(self, *parts: str) -> None:
        self.parts = list(parts)
        self.received: list[list[int]] = []  # the task ids of each stream

    async def SubmitStream(self, request_iterator: Any, context: Any) -> None:
        part = self.parts.pop(0)
        ids: list[int] = []
        self.received.append(ids)
        if part == "refuse":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "not our token")
        async for batch in request_iterator:
            ids += [s.task.id for s in batch.submissions]
            if part == "break":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "dispatcher died")
            if part == "end":
                return
            results = [Result(id=i, value=pickle.dumps(i)) for i in ids]
            await context.write(ResultBatch(started=ids, results=results))
            ids = []


@dataclass(frozen=True)
class At(Locator):
    """This pool is at ``address``: no runtime directory to read."""

    address: str = ""

    async def locate(
        self, offload: Offload | None = None, avoid: frozenset[str] = frozenset()
    ) -> Target:
        return Target(self.address, "token")


class Heard:
    """What becomes of one task, as its handler hears it."""

    def __init__(self) -> None:
        self.result: asyncio.Future[Result] = asyncio.get_running_loop().create_future()

    def started(self) -> None:
        pass

    def resolve(self, result: Result) -> None:
        self.result.set_result(result)

    def withdrawn(self) -> bool:
        return False  # (nothing is cancelled here)

    def undecided(self) -> None:
        pass

    async def outcome(self) -> Any:
        """The task's value, or the exception its failure carries."""
        result = await self.result
        if result.HasField("failure"):
            return codec.exception_of(result.failure)
        return pickle.loads(result.value)


@asynccontextmanager
async def connected(dispatcher: Dispatcher) -> AsyncIterator[Connection]:
    server = aio.server()
    dispatcher_pb2_grpc.add_DispatcherServicer_to_server(dispatcher, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    connection = Connection(At("ns", address=f"127.0.0.1:{port}"), reconnect_s=10)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(connection.run())
            try:
                yield connection
            finally:
                connection.close(abandon=True)
    finally:
        await server.stop(0)


def submit(connection: Connection, task_id: int) -> Heard:
    heard = Heard()
    connection.submit(Submission(task=Task(id=task_id, function="m:f")), heard)
    return heard


async def test_a_broken_stream_is_reconnected_and_its_tasks_sent_again() -> None:
    dispatcher = Dispatcher("break", "answer")
    async with connected(dispatcher) as connection:
        heard = [submit(connection, i) for i in (1, 2)]
        assert [await asyncio.wait_for(h.outcome(), 20) for h in heard] == [1, 2]
    assert dispatcher.received[0] and dispatcher.received[1] == [1, 2]


async def test_a_stream_the_dispatcher_ends_fails_what_is_pending() -> None:
    async with connected(Dispatcher("end", "answer")) as connection:
        error = await asyncio.wait_for(submit(connection, 1).outcome(), 20)
        assert isinstance(error, PoolNotRunning)
        assert "the pool stopped" in str(error)
        # The next task is work again: a new stream, which answers it.
        assert await asyncio.wait_for(submit(connection, 2).outcome(), 20) == 2


async def test_a_refusal_fails_every_task_for_good() -> None:
    """Once refused, every task fails, the later ones at once with no new
    stream. (A refusal can reach the client as INTERNAL, when its write
    crossed the abort: grpc.aio lets the failed write's error replace the
    server's status, grpc/grpc#36066. That stream is a broken one, and the
    client, connecting again, is refused again.)"""
    dispatcher = Dispatcher(*["refuse"] * 20)
    async with connected(dispatcher) as connection:
        first = await asyncio.wait_for(submit(connection, 1).outcome(), 20)
        assert isinstance(first, PoolRefused)
        streams = len(dispatcher.received)
        later = await asyncio.wait_for(submit(connection, 2).outcome(), 20)
        assert isinstance(later, PoolRefused)  # at once, with no new stream
    assert len(dispatcher.received) == streams


def test_an_unreachable_registry_says_what_failed_not_to_start_a_pool() -> None:
    """A client whose Redis is down (or whose URL is wrong) is told so; the
    advice to start a pool would be wrong."""
    from pool import Client, PoolNotRunning

    with pytest.raises(PoolNotRunning) as raised:
        Client("nobody-here", discovery_url="redis://127.0.0.1:1")
    message = str(raised.value)
    assert "cannot reach the registry at redis://127.0.0.1:1" in message
    assert "check that Redis runs there" in message and "pool up" not in message


def test_a_token_file_others_can_read_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As ssh does of a key: mode 644 is named, with the fix; 600 is quiet."""
    from workers.protocol import auth

    token = tmp_path / "token"
    token.write_text("t" * 40)
    token.chmod(0o644)
    assert auth.token_for("nobody-here", str(token)) == "t" * 40
    assert "can be read by others (mode 0644)" in caplog.text
    assert f"chmod 600 {token}" in caplog.text
    caplog.clear()
    token.chmod(0o600)
    auth.token_for("nobody-here", str(token))
    assert "read by others" not in caplog.text
