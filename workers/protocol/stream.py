"""The two halves of a task stream, written once for both of its hops.

A task stream carries batches of tasks (and cancels) one way and batches
of results (and the ids of tasks started) the other. It runs on two hops,
with the same halves at each end::

    client Connection ── Outgoing ──> Incoming ── dispatcher ClientStream
    dispatcher WorkerLink ── Outgoing ──> Incoming ── worker Run stream

:class:`Outgoing`, the sending half: what is still to be written, in order
(tasks, and the cancels of tasks written before, by kind:
:data:`Withdraw`), handed out as messages of at most
:data:`MAX_BATCH_TASKS` tasks and about :data:`MAX_BATCH_BYTES`, each
taken out only when it is written (what waits behind gRPC's flow control
can still be withdrawn); a task carries its function's pickle only if
the receiver does not hold it (the stream's
:class:`~workers.protocol.shipping.StreamCache`, empty again on a new
stream). What was sent and not answered, and so what to send again on a
reconnect, is its owner's ledger (the client's
:class:`~pool.client.ledger.Ledger`, the dispatcher's router).

:class:`Incoming`, the receiving half: checks each task as it arrives (its
function's pickle against the cache, its id not already in flight), holds
what it took until it is answered, at most ``max_tasks`` at once (the
reader stops reading while full, so gRPC flow control holds the sender),
collects answers into its :class:`~workers.protocol.outbox.Outbox`, and
closes it once the sender has closed its side and every task is answered.
:meth:`Incoming.serve` runs the reader beside the writer of answers.

Per task on each hop: one Task (or Submission) message in a batch, one
Result in a batch, one id in a ``started`` list; per message: one write,
one wake-up of the writer, one turn of the loop before it (what else is
ready joins the message), one copy of each task into the batch. See
``benchmarks/README.md`` for the whole budget.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Final, Generic, Literal, NamedTuple, TypeVar, get_args

from workers.protocol import codec, outbox, shipping
from workers.protocol.errors import BadTask
from workers.protocol.outbox import Outbox
from workers.protocol.worker_pb2 import Failure, Result, ResultBatch, Task

MAX_BATCH_TASKS: Final = 4096  # tasks per message
# Tasks a client writes on a stream and has not had answered, at most: as
# many as its dispatcher reads (pool.dispatcher.service), so that the rest
# waits in the client, where a cancel withdraws it for certain, rather than
# in gRPC's buffers on the way.
MAX_UNANSWERED: Final = 10_000
# Bytes per message, about: with one task of up to codec.MAX_ARGS_LIMIT
# more, a message stays under gRPC's limit.
MAX_BATCH_BYTES: Final = outbox.MAX_BATCH_BYTES

Item = TypeVar("Item")  # what is written: a Task, or a Submission holding one
Entry = TypeVar("Entry")  # what a receiver keeps of a task it took


# How a task is asked back (``TaskBatch`` says what each does): ``cancel``
# if not started; ``abandon`` (its caller is gone) also a running
# coroutine; ``stop`` whatever its state. The latter asks more.
Withdraw = Literal["cancel", "abandon", "stop"]
WITHDRAWS: Final[tuple[Withdraw, ...]] = get_args(Withdraw)
STRENGTH: Final[dict[str | None, int]] = {None: 0, "cancel": 1, "abandon": 2, "stop": 3}


class Cancels(NamedTuple):
    """The ids a message asks the receiver to withdraw, by kind (the fields
    of the same names of ``TaskBatch`` and ``SubmissionBatch``)."""

    cancel: list[int]
    abandon: list[int]
    stop: list[int]

    @classmethod
    def none(cls) -> Cancels:
        return cls([], [], [])


class Outgoing(Generic[Item]):
    """The sending half of a stream; see the module docstring.

    :param task_of: the task an item carries (the item itself for a Task).
    """

    def __init__(
        self, task_of: Callable[[Item], Task], wake: asyncio.Event | None = None
    ) -> None:
        self._task_of = task_of
        self._items: dict[int, tuple[Item, bytes]] = {}  # by task id, in order
        self._bytes = 0  # of the items' arguments and functions
        self._cancels = Cancels.none()
        self._shipped = shipping.StreamCache()
        # Set when there is something to write (the owner may share it).
        self.wake = wake if wake is not None else asyncio.Event()

    def __bool__(self) -> bool:
        return bool(self._items or any(self._cancels))

    @property
    def unwritten(self) -> int:
        """Tasks still to be written."""
        return len(self._items)

    def _writable(self, room: Callable[[], int] | None) -> bool:
        """Whether a part may be written now: cancels, or tasks and room."""
        if any(self._cancels):
            return True
        return bool(self._items) and (room is None or room() > 0)

    def new_stream(self) -> None:
        """A new stream starts: the receiver holds no function of ours."""
        self._shipped = shipping.StreamCache()

    def add(self, item: Item, code: bytes = b"") -> None:
        """Write ``item`` next; ``code`` is its function's pickle if it
        ships one (:mod:`workers.protocol.shipping`)."""
        task = self._task_of(item)
        if (old := self._items.get(task.id)) is not None:  # (sent again)
            self._bytes -= self._size(old)
        self._items[task.id] = (item, code)
        self._bytes += len(task.args) + len(code)
        self.wake.set()

    def withdraw(self, task_id: int) -> bool:
        """Take back a task not written yet; whether it was there."""
        entry = self._items.pop(task_id, None)
        if entry is None:
            return False
        self._bytes -= self._size(entry)
        return True

    def cancel(self, task_id: int, kind: Withdraw = "cancel") -> None:
        """Ask the receiver to withdraw a task it was sent (see
        :data:`Withdraw`)."""
        getattr(self._cancels, kind).append(task_id)
        self.wake.set()

    def clear(self) -> None:
        self._items, self._cancels, self._bytes = {}, Cancels.none(), 0

    def take(
        self, room: Callable[[], int] | None = None
    ) -> Generator[tuple[list[Item], Cancels], None, None]:
        """What is to be written, a part (a message) at a time, each taken
        out only once the one before is written, so that what waits behind
        a slow write (gRPC flow control) can still be withdrawn: at most
        :data:`MAX_BATCH_TASKS` items and about :data:`MAX_BATCH_BYTES`
        (unless one item alone is larger: it fits a message,
        :func:`~workers.protocol.codec.check_call_size`), with the cancels
        asked since the part before, until nothing is left. Each task
        carries its function's pickle where the receiver needs it; make each
        part's message before the next is taken: the pickle is cleared from
        the item then (the message holds its own copy). ``room``: how many
        tasks may be written now (no more are taken; None: no bound)."""
        while self._writable(room):
            part = self._next_part(MAX_BATCH_TASKS if room is None else room())
            cancels, self._cancels = self._cancels, Cancels.none()
            carrying = [(self._task_of(item), code) for item, code in part if code]
            for task, code in carrying:
                task.code = self._shipped.outgoing(task.digest, code)
            try:
                yield [item for item, _ in part], cancels
            finally:
                for task, _ in carrying:
                    task.ClearField("code")

    def _next_part(self, room: int) -> list[tuple[Item, bytes]]:
        """The next part's items, at most ``room``, taken out (all of them,
        in the common case where they fit one message)."""
        items, most = self._items, max(0, min(room, MAX_BATCH_TASKS))
        part: list[tuple[Item, bytes]]
        if len(items) <= most and self._bytes <= MAX_BATCH_BYTES:
            part, self._items, self._bytes = list(items.values()), {}, 0
            return part
        part, size = [], 0
        for task_id in list(itertools.islice(items, most)):
            entry = items[task_id]
            entry_size = self._size(entry)
            if part and size + entry_size > MAX_BATCH_BYTES:
                break
            del items[task_id]
            part.append(entry)
            size += entry_size
        self._bytes -= size
        return part

    def _size(self, entry: tuple[Item, bytes]) -> int:
        return len(self._task_of(entry[0]).args) + len(entry[1])

    async def write_all(
        self,
        write: Callable[[list[Item], Cancels], Awaitable[bool]],
        done: Callable[[], bool] = lambda: False,
        room: Callable[[], int] | None = None,
    ) -> None:
        """Write what comes, as it comes (no more tasks at once than
        ``room()`` says, if given: :meth:`wake` is then set when it grows),
        until ``write`` says the stream is gone (False) or ``done()`` holds
        with nothing left to write."""
        while True:
            if not self._writable(room):
                if not self and done():
                    return
                self.wake.clear()
                await self.wake.wait()
                await asyncio.sleep(0)  # what else is ready joins the message
                continue
            parts = self.take(room)
            try:
                for items, cancels in parts:
                    if not await write(items, cancels):
                        return
            finally:
                parts.close()


class Incoming(Generic[Entry]):
    """The receiving half of a stream; see the module docstring."""

    def __init__(self, max_tasks: int) -> None:
        self.entries: dict[int, Entry] = {}  # by the sender's task id
        self.outbox = Outbox()
        self.max_tasks = max_tasks
        self.reading = True  # the sender has not closed its side
        self._shipped = shipping.StreamCache()
        self._room = asyncio.Event()

    def admit(self, task: Task) -> bytes | None:
        """Check a task as it arrives: its function's pickle (empty for one
        named), or None if it was answered at once (a pickle that does not
        match the cache, or an id in flight). The cache goes first, whatever
        becomes of the task, so that both ends of the stream agree."""
        code = b""
        if task.digest:
            try:
                code = self._shipped.incoming(task.digest, task.code)
            except shipping.ShippingError as exc:
                self.refuse(task.id, codec.failure_of(BadTask(str(exc)), remote=False))
                return None
            task.ClearField("code")  # its holder keeps the one copy
        if task.id in self.entries:
            self.refuse(task.id, codec.id_reused(task.id))
            return None
        return code

    def refuse(self, task_id: int, failure: Failure) -> None:
        """Answer a task that was not taken."""
        self.outbox.put(Result(id=task_id, failure=failure))

    def answer(self, task_id: int, result: Result | None) -> None:
        """Settle a task it holds: ``result`` goes out (None: nobody is left
        to hear it); its room frees; the outbox closes once drained."""
        del self.entries[task_id]
        if result is not None:
            self.outbox.put(result)
        if len(self.entries) < self.max_tasks:
            self._room.set()
        if not self.entries and not self.reading:
            self.outbox.close()

    async def wait_for_room(self, elsewhere: asyncio.Event | None = None) -> None:
        """Return once it holds fewer than ``max_tasks`` (and ``elsewhere``,
        a room further on, is set): the reader waits here."""
        while len(self.entries) >= self.max_tasks or not (
            elsewhere is None or elsewhere.is_set()
        ):
            if len(self.entries) >= self.max_tasks:
                self._room.clear()
                await self._room.wait()
            elif elsewhere is not None:
                await elsewhere.wait()

    def end_of_input(self) -> None:
        """The sender closed its side: end once every task is answered."""
        self.reading = False
        if not self.entries:
            self.outbox.close()

    async def serve(
        self,
        read: Coroutine[Any, Any, None],
        write: Callable[[ResultBatch], Awaitable[None]],
    ) -> None:
        """Run ``read`` (the sender's batches into this) beside the writer
        of answers, until the outbox closes; then stop reading: what the
        sender writes from now on finds the stream closed."""
        async with asyncio.TaskGroup() as group:
            reading = group.create_task(read)
            async for batch in self.outbox.batches():
                await write(batch)
            reading.cancel()
