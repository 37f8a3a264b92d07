"""A client's stream of tasks to its pool's dispatcher.

:class:`Connection` runs its :class:`~pool.client.ledger.Ledger` (the
bookkeeping, with no I/O) over one ``SubmitStream`` at a time, on the
loop that made it, in :meth:`run`: a task group of a sender (everything
outgoing in one message, as soon as the previous write is done), the
reader of answers, and, with workers of another machine, a fetch of each
value too large for a message that one holds for us, and an upload of a
task's large arguments to each one the task is sent to
(:mod:`workers.protocol.transfer`).

When the stream breaks (the supervisor restarts a dispatcher that died),
it reconnects, with back-off, for up to ``reconnect_s``, and sends again
every task still unanswered: the new dispatcher never saw them (so a task
may run twice; at least once is the promise). A pool on Redis may have
several dispatchers (:mod:`pool.client.announcements`): the client then
reconnects to another at once, and also hangs up on one whose announcement
runs out (its host hung, or stops); what a dispatcher that stops cleanly
hands back unsent (``PoolStopping``) goes to another too, and with none
left, fails then. When the dispatcher ends the
stream (the pool stopped), or no pool owns the namespace any more, or the
pool refuses us (token, protocol), what is pending fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import grpc
from grpc import aio

from discovery import WorkerInfo
from pool import dispatcher_pb2_grpc
from pool.client import announcements
from pool.client.ledger import Handler, Ledger
from pool.client.rendezvous import WRONG_TOKEN, Locator, Target
from pool.client.store import SWEEP_S, Store
from pool.dispatcher_pb2 import ListWorkersRequest, Submission, SubmissionBatch
from pool.errors import PoolError, PoolNotRunning, PoolRefused, ProtocolMismatch
from workers.common.offload import Offload
from workers.protocol import auth, codec, owners, segments, transfer
from workers.protocol.owners import DataOwner
from workers.protocol.stream import Cancels, Withdraw
from workers.protocol.worker_pb2 import FetchRequest, Result, ResultBatch, Want
from workers.protocol.worker_pb2_grpc import TransfersStub

RECONNECT_S: Final = 30.0  # how long a client waits for a restarted dispatcher
RECONNECT_FIRST_S: Final = 0.05
SLOTS_TIMEOUT_S: Final = 10.0  # for the dispatcher's answer to ListWorkers


@dataclass(frozen=True)
class _Ended:
    """How one stream ended: ``error`` fails what is pending, or None (it
    broke: reconnect and send again); ``served``: it reached the dispatcher."""

    error: PoolError | None
    served: bool


class Connection:
    """The stream of tasks to a pool's dispatcher; see the module docstring.

    Make it with :meth:`open` on the loop that will run it, then run
    :meth:`run` in a task group; :meth:`submit`, :meth:`cancel` and
    :meth:`close` are called on that loop.
    """

    def __init__(self, locator: Locator, *, reconnect_s: float = RECONNECT_S) -> None:
        self._locator = locator
        self.namespace = locator.namespace
        self._reconnect_s = reconnect_s
        self._wake = asyncio.Event()  # work to connect for, or to write
        # Large data through shared memory: with a pool of this machine's.
        self.store: Store | None = None
        self.ledger = Ledger(self._wake)
        self._closing = False
        self._abandon = False
        self._call: aio.StreamStreamCall[SubmissionBatch, ResultBatch] | None = None
        # Announced dispatchers whose stream broke, and when: not taken
        # again while another is announced, until their lease has run out.
        self._broken: dict[str, float] = {}
        self.refused: PoolError | None = None  # once refused, always
        self._offload = Offload("pool-client-io")  # finding the pool, sweeps

    @classmethod
    async def open(cls, locator: Locator) -> Connection:
        """A connection to the pool ``locator`` finds.

        :raises PoolNotRunning: if no pool serves the namespace now (fail
            now, clearly, if there is no pool at all).
        """
        connection = cls(locator)
        target = await locator.locate(connection._offload)
        if target.data is not None and target.data.host == segments.host_id():
            owner = DataOwner(locator.namespace, limit_bytes=target.data.limit_bytes)
            connection.store = Store(owner)
            connection.ledger = Ledger(connection._wake, connection.store)
        return connection

    def submit(
        self, submission: Submission, handler: Handler, code: bytes = b""
    ) -> None:
        """Send a task; ``handler`` hears what becomes of it; ``code`` is its
        function's pickle if it ships one (:mod:`workers.protocol.shipping`)."""
        if self.refused is not None:
            handler.resolve(
                Result(
                    id=submission.task.id,
                    failure=codec.failure_of(self.refused, remote=False),
                )
            )
            return
        self.ledger.add(submission, handler, code)
        self._wake.set()

    def cancel(self, task_id: int, kind: Withdraw = "cancel") -> None:
        """Ask to withdraw a task (:meth:`Ledger.cancel`); its handler holds
        the ask and hears the answer."""
        self.ledger.cancel(task_id, kind)
        self._wake.set()

    def close(self, *, abandon: bool = False) -> None:
        """End :meth:`run` once nothing is pending (at once with
        ``abandon``: what is pending fails)."""
        self._closing = True
        self._wake.set()
        if abandon and not self._abandon:
            self._abandon = True
            self.ledger.fail_all(PoolNotRunning(self.namespace, "the client closed"))
            if self._call is not None:
                self._call.cancel()  # hang up: the dispatcher cancels our tasks

    async def run(self) -> None:
        """Keep a stream open while there is work; reconnect when it breaks.
        Then unlink whatever this client holds in shared memory."""
        try:
            async with asyncio.TaskGroup() as group:
                sweeping = group.create_task(self._sweep()) if self.store else None
                await self._run()
                if sweeping is not None:
                    sweeping.cancel()
        finally:
            if self.store is not None:  # (its segments: a scan of /dev/shm)
                await _off_the_loop(self._offload, self.store.close)
            await self._offload.aclose()

    async def _sweep(self) -> None:
        """Unlink, every second, results for us that nobody will read."""
        assert self.store is not None
        store = self.store
        while True:
            await asyncio.sleep(SWEEP_S)
            names = await self._offload.run(owners.names, store.owner.prefix)
            store.sweep(self.ledger, names)

    async def _run(self) -> None:
        lost_at: float | None = None
        delay = RECONNECT_FIRST_S
        while True:
            while not (len(self.ledger) or self._closing):
                self._wake.clear()
                await self._wake.wait()  # connect (again) only for work
            if self._closing and (self._abandon or not len(self.ledger)):
                self.ledger.fail_all(
                    PoolNotRunning(self.namespace, "the client closed")
                )
                return
            ended = await self._serve()
            if self._closing and (self._abandon or not len(self.ledger)):
                continue  # done: the loop's top returns
            if ended.error is not None:
                self.ledger.fail_all(ended.error)
                continue
            if ended.served:
                lost_at, delay = None, RECONNECT_FIRST_S
            lost_at = lost_at or time.monotonic()
            if time.monotonic() - lost_at >= self._reconnect_s:
                self.ledger.fail_all(
                    PoolNotRunning(self.namespace, "lost its dispatcher")
                )
                lost_at = None
                continue
            self.ledger.resend_all()
            await asyncio.sleep(delay)  # back-off between attempts to reconnect
            delay = min(delay * 2, 1.0)

    async def _serve(self) -> _Ended:
        """One stream, until it ends (or its dispatcher's announcement does:
        a host that hung, or that stops)."""
        try:
            channel, target = await self._channel()
        except PoolNotRunning as exc:
            return _Ended(exc, served=False)  # no restart is coming
        withdrawn = asyncio.Event()
        self.ledger.new_stream(hand_off=bool(target.id))
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)  # type: ignore[no-untyped-call]
        self._call = call = stub.SubmitStream(metadata=auth.call_metadata(target.token))
        transfers = TransfersStub(channel)  # type: ignore[no-untyped-call]

        def fetch(result: Result) -> None:
            group.create_task(self._fetch(transfers, target.token, result))

        def upload(want: Want) -> None:
            group.create_task(self._upload(transfers, target.token, want))

        try:
            async with asyncio.TaskGroup() as group:
                sending = group.create_task(self._send(call))
                watching = group.create_task(self._watch(target, call, withdrawn))
                try:
                    served, failed = await self._receive(call, fetch, upload)
                finally:
                    sending.cancel()
                    watching.cancel()
        finally:
            self._call = None
            call.cancel()
            await channel.close()
        return self._ended(target, served, failed, withdrawn.is_set())

    def _ended(
        self,
        target: Target,
        served: bool,
        failed: aio.AioRpcError | None,
        withdrawn: bool,
    ) -> _Ended:
        """How the stream to ``target`` ended: a refusal fails what is
        pending; the end of one of several dispatchers (announced ones) is
        no end: another takes what is pending, and that one is not taken
        again while another is announced."""
        if target.id:
            self._broken[target.id] = time.monotonic()
        if failed is not None and not withdrawn:
            return _Ended(self._refusal(failed), served)
        if withdrawn or target.id or self._closing:
            return _Ended(None, served)
        return _Ended(PoolNotRunning(self.namespace, "the pool stopped"), served)

    async def _channel(self) -> tuple[aio.Channel, Target]:
        """A channel to the dispatcher, and where it is.

        :raises PoolNotRunning: if no pool serves the namespace.
        """
        since = time.monotonic() - announcements.LEASE_S
        self._broken = {k: t for k, t in self._broken.items() if t > since}
        target = await self._locator.locate(self._offload, frozenset(self._broken))
        return await self._locator.channel(target, self._offload), target

    async def _watch(
        self,
        target: Target,
        call: aio.StreamStreamCall[SubmissionBatch, ResultBatch],
        withdrawn: asyncio.Event,
    ) -> None:
        """Hang up once the announced dispatcher ``target`` is announced no
        more (for this machine's pool, the stream breaks when it dies)."""
        if target.id and self._locator.discovery_url is not None:
            url, namespace = self._locator.discovery_url, self.namespace
            await announcements.until_withdrawn(url, namespace, target.id)
            withdrawn.set()
            call.cancel()

    async def slots(self) -> int:
        """How many tasks the pool's ready workers run at once now (the sum
        of their capacities, as the dispatcher knows them).

        :raises PoolNotRunning: if no pool serves the namespace.
        :raises grpc.aio.AioRpcError: if the dispatcher does not answer.
        """
        channel, target = await self._channel()
        async with channel:
            stub = dispatcher_pb2_grpc.DispatcherStub(channel)  # type: ignore[no-untyped-call]
            reply = await stub.ListWorkers(
                ListWorkersRequest(),
                metadata=auth.call_metadata(target.token),
                timeout=SLOTS_TIMEOUT_S,
            )
        infos = [WorkerInfo.from_protobuf(state.info) for state in reply.workers]
        return sum(info.capacity for info in infos if info.status == "ready")

    async def _receive(
        self,
        call: aio.StreamStreamCall[SubmissionBatch, ResultBatch],
        fetch: Callable[[Result], None],
        upload: Callable[[Want], None],
    ) -> tuple[bool, aio.AioRpcError | None]:
        """Read answers until the stream ends (``fetch`` what a worker of
        another machine holds, ``upload`` what one wants): whether it
        reached the dispatcher, and the error it ended with."""
        served = False
        try:
            await call.wait_for_connection()
            served = True
            async for batch in call:
                for result in self.ledger.on_batch(batch):
                    fetch(result)
                for want in batch.wants:
                    upload(want)
                if self._closing and not len(self.ledger):
                    self._wake.set()  # the sender ends our side of the stream
        except aio.AioRpcError as exc:
            return served, exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled
            # grpc raises CancelledError out of a call that close() hung up
        return served, None

    async def _fetch(self, stub: TransfersStub, token: str, result: Result) -> None:
        """Fetch a value a worker holds for us, through the dispatcher; the
        ledger hears how it went."""
        held = result.data.transfer
        request = FetchRequest(token=held.token, source=held.source)
        try:
            chunks = stub.Fetch(request, metadata=auth.call_metadata(token))
            fetched: bytearray | Exception = await transfer.receive(chunks, held.size)
        except Exception as exc:  # (RPC errors, DataGone: the ledger says)
            fetched = exc
        self.ledger.fetched(result, fetched)
        if self._closing and not len(self.ledger):
            self._wake.set()

    async def _upload(self, stub: TransfersStub, token: str, want: Want) -> None:
        """Upload a task's arguments to the worker that wants them, through
        the dispatcher. If that fails, the worker answers the task (the
        dispatcher sends it elsewhere, or it fails) without them."""
        if (offered := self.ledger.offered(want.id)) is None:
            return  # (answered meanwhile)
        data, parts = offered
        chunks = transfer.upload_chunks(data.transfer, want.source, parts)
        with contextlib.suppress(aio.AioRpcError):
            await stub.Upload(chunks, metadata=auth.call_metadata(token))

    def _refusal(self, exc: aio.AioRpcError) -> PoolError | None:
        """The error that ends every task for good, if the pool refused us."""
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            self.refused = PoolRefused(self.namespace, WRONG_TOKEN)
        elif code == grpc.StatusCode.FAILED_PRECONDITION:
            self.refused = ProtocolMismatch(self.namespace, exc.details() or "")
        return self.refused

    async def _send(
        self, call: aio.StreamStreamCall[SubmissionBatch, ResultBatch]
    ) -> None:
        async def write(submissions: list[Submission], cancels: Cancels) -> bool:
            try:
                await call.write(
                    SubmissionBatch(submissions=submissions, **cancels._asdict())
                )
            except (aio.AioRpcError, aio.UsageError, asyncio.InvalidStateError):
                return False  # the reader sees the stream end; all goes again
            return True

        def finished() -> bool:
            return self._closing and not len(self.ledger)

        await self.ledger.outgoing.write_all(write, finished, self.ledger.room)
        if finished():
            with contextlib.suppress(aio.AioRpcError, aio.UsageError):
                await call.done_writing()  # the dispatcher ends the stream


async def _off_the_loop(offload: Offload, close: Callable[[], None]) -> None:
    """``close()`` on ``offload``'s thread; here if this task is cancelled
    meanwhile (it must not be left undone)."""
    try:
        await offload.run(close)
    except asyncio.CancelledError:
        close()  # (never raises; a second call does nothing)
        raise
