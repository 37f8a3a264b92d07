""":class:`AsyncClient`: the pool for asyncio code, on the caller's loop.

The same submissions, connection and map plan as
:class:`~pool.client.executor.Client` (:mod:`pool.client.core`,
:mod:`pool.client.mapping`), with asyncio futures instead of
``concurrent.futures`` ones. A task is run *at least once* (see
:mod:`pool.client.executor`).

Cancelling the asyncio task that awaits a call (``task.cancel()``, a
timeout, a task group's end) ends that task at once, as asyncio's own
``to_thread`` does, and *abandons* the call: withdrawn if it has not
started, cancelled in its worker if it is a running coroutine; a running
plain function runs on, its result dropped. :meth:`AsyncClient.cancel`
says which: it returns the pool's word for each task, True only if its
call will never run (the task then ends cancelled; on False it goes on to
the call's result), and with ``force=True`` stops running calls too.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Self, Unpack

from pool.client.cancels import CANCEL_WAIT_S, NO_ASKS, Ask
from pool.client.connection import Connection
from pool.client.core import ClientOptions, dropped, open_options, outcome
from pool.client.mapping import PROBE_WAIT_S, Args, InMap, MapPlan
from pool.client.options import CallOptionsGiven
from pool.client.refs import ObjectRef
from pool.client.store import NO_STORE, Hold, Store
from workers.protocol import codec, shipping
from workers.protocol.stream import Withdraw
from workers.protocol.worker_pb2 import Result


class AsyncClient:
    """The pool for asyncio code: ``async with AsyncClient(ns) as client``.

    Enter and leave it in the same task: it runs its connection in a task
    group of that task.

    :param namespace: the pool's namespace.
    :param tags, task_timeout_s, priority, retries, retry_on: the defaults
        of its calls' options, as for :class:`Client` (and :meth:`options`).
    :param ship_modules, discovery_url, token_file, tls_ca: as for
        :class:`Client`.
    """

    def __init__(
        self, namespace: str = "default", **options: Unpack[ClientOptions]
    ) -> None:
        self.namespace, self._locator, self._submissions = open_options(
            namespace, options
        )
        self._connection: Connection | None = None
        self._stack = contextlib.AsyncExitStack()  # holds the connection's group
        # The asyncio task awaiting each call (for cancel), while it awaits.
        self._awaiting: weakref.WeakKeyDictionary[
            asyncio.Future[Any], _AsyncHandler
        ] = weakref.WeakKeyDictionary()
        self._owner: AsyncClient | None = None  # (a view's: see options)

    def options(self, **given: Unpack[CallOptionsGiven]) -> AsyncClient:
        """This client with other defaults for its calls, on the same
        connection (:meth:`Client.options`); entering and leaving it is
        free, and closes nothing.

        :raises ValueError: for a bad value (:raises TypeError: for a wrong
            type), named.
        """
        view = copy.copy(self)
        view._submissions = self._submissions.with_options(given)
        view._owner = self._owner or self
        return view

    @property
    def _live(self) -> Connection | None:
        """The connection, while open (a view's is its owner's)."""
        return (self._owner or self)._connection

    async def __aenter__(self) -> Self:
        if self._owner is not None:
            return self  # (a view: its owner holds the connection)
        connection = await Connection.open(self._locator)
        group = await self._stack.enter_async_context(asyncio.TaskGroup())
        group.create_task(connection.run())
        self._connection = connection
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        """Close the stream (what is pending fails) and end its task group,
        which hears of an error unwinding: that error goes on as itself,
        unless the connection failed too (then both, in a group)."""
        if self._owner is not None or self._connection is None:
            return
        connection, self._connection = self._connection, None
        connection.close(abandon=True)
        try:
            await self._stack.__aexit__(*exc_info)
        except BaseExceptionGroup as group:
            if exc_info[1] is None or list(group.exceptions) != [exc_info[1]]:
                raise

    async def aclose(self) -> None:
        """Close the stream; tasks still pending fail."""
        await self.__aexit__(None, None, None)

    def _send(
        self,
        ref: shipping.Reference,
        args: Args,
        kwargs: Any,
        in_map: InMap | None = None,
    ) -> _AsyncHandler:
        connection = self._opened()
        store = connection.store
        submission, code, hold = self._submissions.make(
            ref, args, kwargs, store=store, in_map=in_map
        )
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        handler = _AsyncHandler(submission.task.id, answer, store, hold)
        connection.submit(submission, handler, code)
        return handler

    def _opened(self) -> Connection:
        if (connection := self._live) is None:
            raise RuntimeError("use `async with AsyncClient(...)` before submitting")
        return connection

    def put(self, value: Any) -> ObjectRef:
        """:meth:`Client.put`, for asyncio code (it writes the value before
        it returns)."""
        connection = self._opened()
        if connection.store is None:
            raise RuntimeError(NO_STORE.format(namespace=self.namespace))
        return connection.store.put(value)

    async def _outcome(self, handler: _AsyncHandler) -> Any:
        task = asyncio.current_task()
        if task is not None:
            self._awaiting[task] = handler
        try:
            return await handler.answer
        except asyncio.CancelledError:
            if task is not None and task.cancelling():  # the caller's, not ours
                self._withdraw(handler, "abandon")
            raise
        finally:
            if task is not None:
                self._awaiting.pop(task, None)

    def _withdraw(self, handler: _AsyncHandler, kind: Withdraw = "cancel") -> Ask:
        """Ask the pool to withdraw ``handler``'s task (``kind``: see
        :data:`~workers.protocol.stream.Withdraw`); the ask (its answer is
        the pool's word)."""
        ask = Ask(kind)
        if handler.ask(ask) and (connection := self._live) is not None:
            connection.cancel(handler.task_id, kind)
        return ask

    async def cancel(
        self, tasks: Iterable[asyncio.Future[Any]], *, force: bool = False
    ) -> list[bool]:
        """Cancel the calls these asyncio tasks await (each a task running
        :meth:`submit`), all at once, and wait for the pool's word, as
        :meth:`Client.cancel`: True only if the call will never run (its
        task then ends cancelled). A task whose call has started goes on to
        its result (False), unless ``force``: then the call is stopped (a
        plain function's worker ended and replaced) and the task ends
        cancelled. A task that has not yet sent its call is cancelled.

        :returns: for each task, in order, whether its call was cancelled.
        """
        self._opened()
        asks: list[Ask | bool] = []
        for task in tasks:
            handler = self._awaiting.get(task)
            if task.done():
                asks.append(task.cancelled())
            elif handler is None:  # (its call is not sent yet: it never is)
                asks.append(task.cancel())
            else:
                asks.append(self._withdraw(handler, "stop" if force else "cancel"))
        deadline = asyncio.get_running_loop().time() + CANCEL_WAIT_S
        return [await _word(ask, deadline) for ask in asks]

    async def submit(
        self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` in the pool and return its result.

        Cancelling the awaiting task withdraws the call if it has not
        started (see :meth:`cancel` for the pool's word, and to stop a
        running call).
        """
        ref = self._submissions.reference(fn)
        return await self._outcome(self._send(ref, args, kwargs))

    async def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        chunksize: int | None = None,
    ) -> AsyncIterator[Any]:
        """Results of ``fn`` over the iterables, in order; every task is sent
        at once, and those not yet awaited are cancelled if the loop stops.
        ``chunksize`` is as for :meth:`Client.map` (adaptive by default)."""
        plan = MapPlan(
            iterables, chunksize, per_task_limit=bool(self._submissions.timeout_s)
        )
        chunked, part = plan.chunked, self._submissions.map_part(plan.calls)
        ref = self._submissions.reference(fn)
        first = plan.first(self._submissions.per_call_s(ref))
        sent = [self._send(ref, a, {}, InMap(part, chunked)) for a in first]
        if plan.adaptive:
            per_call_s = await _time_per_call_async([h.answer for h in sent])
            rest = plan.rest(per_call_s)
            sent += [self._send(ref, a, {}, InMap(part, True)) for a in rest]
        sent.reverse()
        try:
            while sent:
                value = await self._outcome(sent.pop())
                if not chunked:
                    yield value
                else:
                    self._submissions.timed(ref, value)
                    for item in codec.chunk_items(value):
                        yield item
        finally:
            for handler in sent:
                self._withdraw(handler, "abandon")
                handler.answer.cancel()  # (its answer, when it comes, is dropped)


async def _time_per_call_async(answers: list[asyncio.Future[Any]]) -> float | None:
    """:func:`pool.client.executor._time_per_call` for :class:`AsyncClient`."""
    if not answers:
        return None
    # (An asyncio client does not hear when a task starts: it waits longer.)
    done, _ = await asyncio.wait(
        answers, timeout=4 * PROBE_WAIT_S, return_when=asyncio.FIRST_COMPLETED
    )
    for answer in done:
        with contextlib.suppress(Exception):
            chunk: codec.ChunkResult = answer.result()
            return chunk.elapsed_s / max(1, len(chunk.values))
    return None


async def _word(ask: Ask | bool, deadline: float) -> bool:
    """An ask's answer (or one known at once), given up at ``deadline``
    (False: the call goes on)."""
    if isinstance(ask, bool):
        return ask
    answer = ask.future
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(deadline):
            return await asyncio.shield(asyncio.wrap_future(answer))
    if answer.cancel():  # given up, before any answer
        return False
    return await asyncio.wrap_future(answer)  # (claimed: its answer comes now)


class _AsyncHandler:
    """Resolves an asyncio future with a task's value or exception (on its
    loop), as the result arrives: a value in shared memory is mapped then;
    or cancels it once the pool withdrew the task as asked (:class:`Asks`)."""

    __slots__ = ("_asks", "_hold", "_state", "_store", "answer", "task_id")

    def __init__(
        self, task_id: int, answer: asyncio.Future[Any], store: Store | None, hold: Hold
    ) -> None:
        self.task_id, self.answer = task_id, answer
        self._store, self._hold = store, hold
        self._asks = NO_ASKS
        self._state = "pending"  # then "running", and "cancelled" or "done"

    def ask(self, ask: Ask) -> bool:
        """Hold ``ask`` (True: ask the pool), or answer it from the state."""
        state = self._state
        ended, cancelled = state in ("cancelled", "done"), state == "cancelled"
        self._asks = self._asks.of()
        return self._asks.hold(
            ask, ended=ended, cancelled=cancelled, running=state == "running"
        )

    def started(self) -> None:
        self._state = "running"
        self._asks.started()

    def withdrawn(self) -> bool:
        return self._asks.withdrawn(self._cancel)

    def _cancel(self) -> None:
        self._state = "cancelled"
        if self._store is not None:
            self._store.release(self._hold)
        self.answer.cancel()

    def undecided(self) -> None:
        self._asks.ended()

    def resolve(self, result: Result) -> None:
        self._state = "done"
        self._asks.ended()
        if self._store is not None:
            self._store.release(self._hold)
        if self.answer.done():
            dropped(result, self._store)
            return
        try:
            self.answer.set_result(outcome(result, self._store, self._hold.key))
        except BaseException as exc:  # the task's error, whatever it is
            self.answer.set_exception(exc)
