""":class:`AsyncClient`: the pool for asyncio code, on the caller's loop.

The same submissions, connection and map plan as
:class:`~pool.client.executor.Client` (:mod:`pool.client.core`,
:mod:`pool.client.mapping`), with asyncio futures instead of
``concurrent.futures`` ones. A task is run *at least once* (see
:mod:`pool.client.executor`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Self, Unpack

from pool.client.connection import Connection
from pool.client.core import ClientOptions, dropped, open_options, outcome
from pool.client.mapping import PROBE_WAIT_S, Args, InMap, MapPlan
from pool.client.refs import ObjectRef
from pool.client.store import NO_STORE, Hold, Store
from workers.protocol import codec, shipping
from workers.protocol.worker_pb2 import Result


class AsyncClient:
    """The pool for asyncio code: ``async with AsyncClient(ns) as client``.

    Enter and leave it in the same task: it runs its connection in a task
    group of that task.

    :param namespace: the pool's namespace.
    :param tags: tags every task of this client requires of its worker.
    :param task_timeout_s: per-task limit enforced by the worker (None: none).
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

    async def __aenter__(self) -> Self:
        connection = await Connection.open(self._locator)
        group = await self._stack.enter_async_context(asyncio.TaskGroup())
        group.create_task(connection.run())
        self._connection = connection
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        """Close the stream (what is pending fails) and end its task group,
        which hears of an error unwinding: that error goes on as itself,
        unless the connection failed too (then both, in a group)."""
        if self._connection is None:
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
    ) -> tuple[int, asyncio.Future[Any]]:
        connection = self._opened()
        store = connection.store
        submission, code, hold = self._submissions.make(
            ref, args, kwargs, store=store, in_map=in_map
        )
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        connection.submit(submission, _AsyncHandler(answer, store, hold), code)
        return submission.task.id, answer

    def _opened(self) -> Connection:
        if self._connection is None:
            raise RuntimeError("use `async with AsyncClient(...)` before submitting")
        return self._connection

    def put(self, value: Any) -> ObjectRef:
        """:meth:`Client.put`, for asyncio code (it writes the value before
        it returns)."""
        connection = self._opened()
        if connection.store is None:
            raise RuntimeError(NO_STORE.format(namespace=self.namespace))
        return connection.store.put(value)

    async def _outcome(self, task_id: int, answer: asyncio.Future[Any]) -> Any:
        try:
            return await answer
        except asyncio.CancelledError:
            if self._connection is not None:
                self._connection.cancel(task_id)
            raise

    async def submit(
        self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` in the pool and return its result.

        Cancelling the awaiting task cancels the task in the pool.
        """
        ref = self._submissions.reference(fn)
        return await self._outcome(*self._send(ref, args, kwargs))

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
            per_call_s = await _time_per_call_async([a for _, a in sent])
            rest = plan.rest(per_call_s)
            sent += [self._send(ref, a, {}, InMap(part, True)) for a in rest]
        sent.reverse()
        try:
            while sent:
                value = await self._outcome(*sent.pop())
                if not chunked:
                    yield value
                else:
                    self._submissions.timed(ref, value)
                    for item in codec.chunk_items(value):
                        yield item
        finally:
            for task_id, answer in sent:
                if not answer.done() and self._connection is not None:
                    self._connection.cancel(task_id)
                answer.cancel()  # (its answer, when it comes, is dropped)


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


class _AsyncHandler:
    """Resolves an asyncio future with a task's value or exception (on its
    loop), as the result arrives: a value in shared memory is mapped then."""

    __slots__ = ("_answer", "_hold", "_store")

    def __init__(
        self, answer: asyncio.Future[Any], store: Store | None, hold: Hold
    ) -> None:
        self._answer, self._store, self._hold = answer, store, hold

    def started(self) -> None:
        pass

    def resolve(self, result: Result) -> None:
        if self._store is not None:
            self._store.release(self._hold)
        if self._answer.done():
            dropped(result, self._store)
            return
        try:
            self._answer.set_result(outcome(result, self._store, self._hold.key))
        except BaseException as exc:  # the task's error, whatever it is
            self._answer.set_exception(exc)
