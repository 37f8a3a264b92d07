"""The two halves of a task stream, on their own and facing each other:
what one writes, the other admits, with the code cache agreeing at both
ends, and the receiver's room and close."""

from __future__ import annotations

import asyncio
import hashlib

import grpc
import pytest

from workers.protocol import codec
from workers.protocol.stream import MAX_BATCH_TASKS, Cancels, Incoming, Outgoing
from workers.protocol.worker_pb2 import Result, Task

pytestmark = pytest.mark.timeout(10)

CODE = b"pickled function"
DIGEST = hashlib.sha256(CODE).digest()


def shipped(task_id: int) -> Task:
    return Task(id=task_id, digest=DIGEST)


def named(task_id: int) -> Task:
    return Task(id=task_id, function="tests.support.sample_tasks:square")


def written(outgoing: Outgoing[Task]) -> tuple[list[Task], list[int]]:
    """What one round of writes carries, as the receiver gets it."""
    tasks: list[Task] = []
    cancels: list[int] = []
    for part, part_cancels in outgoing.take():
        tasks += [Task.FromString(t.SerializeToString()) for t in part]
        cancels += part_cancels.cancel
    return tasks, cancels


async def test_a_function_travels_once_per_stream_and_again_on_a_new_one() -> None:
    """Both directions agree: the receiver gets the pickle with the first
    task naming it, the digest alone after, and the pickle again once the
    sender starts a new stream (a reconnect, where the receiver is new)."""
    sender: Outgoing[Task] = Outgoing(lambda task: task)
    receiver: Incoming[Task] = Incoming(max_tasks=100)
    for i in (1, 2):
        sender.add(shipped(i), CODE)
    tasks, _ = written(sender)
    assert [t.code for t in tasks] == [CODE, b""]
    assert [receiver.admit(t) for t in tasks] == [CODE, CODE]
    sender.new_stream()
    sender.add(shipped(3), CODE)
    fresh: Incoming[Task] = Incoming(max_tasks=100)
    (task,), _ = written(sender)
    assert task.code == CODE and fresh.admit(task) == CODE


async def test_what_was_written_keeps_no_copy_of_the_pickle() -> None:
    """The message holds the pickle; the sender's own task does not, so a
    task sent again (after a lost worker) is not sent with a stale copy."""
    sender: Outgoing[Task] = Outgoing(lambda task: task)
    task = shipped(1)
    sender.add(task, CODE)
    parts = list(sender.take())
    assert parts and task.code == b""


async def test_tasks_go_in_order_in_bounded_messages_with_cancels_first() -> None:
    sender: Outgoing[Task] = Outgoing(lambda task: task)
    count = MAX_BATCH_TASKS + 5
    for i in range(count):
        sender.add(named(i))
    assert sender.withdraw(3) and not sender.withdraw(3)
    sender.cancel(99)
    sender.cancel(98, "stop")
    sender.cancel(97, "abandon")
    parts = [(len(tasks), cancels) for tasks, cancels in sender.take()]
    assert parts == [
        (MAX_BATCH_TASKS, Cancels([99], [97], [98])),
        (count - 1 - MAX_BATCH_TASKS, Cancels.none()),
    ]
    assert not sender


async def test_the_receiver_refuses_what_it_cannot_take() -> None:
    """A digest the stream never carried, a pickle that does not match its
    digest, and an id already in flight are each answered at once, and the
    stream goes on."""
    receiver: Incoming[Task] = Incoming(max_tasks=100)
    assert receiver.admit(shipped(1)) is None  # never carried
    assert receiver.admit(Task(id=2, digest=DIGEST, code=b"other")) is None
    assert receiver.admit(named(3)) == b""
    receiver.entries[3] = named(3)
    assert receiver.admit(named(3)) is None  # in flight
    batch = await anext(receiver.outbox.batches())
    codes = {r.id: codec.status_of(r.failure) for r in batch.results}
    assert codes == {
        1: grpc.StatusCode.INVALID_ARGUMENT,
        2: grpc.StatusCode.INVALID_ARGUMENT,
        3: grpc.StatusCode.ALREADY_EXISTS,
    }


async def test_a_full_receiver_waits_for_room_and_closes_once_drained() -> None:
    """At max_tasks held, the reader waits; an answer frees room; once the
    sender closed its side, the last answer closes the outbox, after which
    its batches end."""
    receiver: Incoming[Task] = Incoming(max_tasks=2)
    for i in (1, 2):
        receiver.entries[i] = named(i)
    waiting = asyncio.ensure_future(receiver.wait_for_room())
    await asyncio.sleep(0)  # (one turn of the loop: it has looked, and waits)
    assert not waiting.done()
    receiver.answer(1, Result(id=1, value=b"v"))
    await asyncio.wait_for(waiting, 5)
    receiver.end_of_input()
    receiver.answer(2, Result(id=2, value=b"v"))
    batches = [batch async for batch in receiver.outbox.batches()]
    assert [r.id for b in batches for r in b.results] == [1, 2]
