"""Clients of a running pool, found by namespace.

:class:`Client` is a :class:`concurrent.futures.Executor` that behaves like
``ProcessPoolExecutor`` wherever ``concurrent.futures`` defines the
behaviour. Its connection runs on a loop of its own
(:class:`~pool.client.loop.LoopThread`). A future is PENDING, and
cancellable, until a worker has started its task; then RUNNING.
A cancel reaches the dispatcher's queue, or the worker that holds the
task unstarted, and ``cancel()`` returns its word (True: the call will
never run). :meth:`Client.cancel` cancels many at once, and with
``force=True`` stops running calls too. ``shutdown(wait=False)`` lets
pending futures finish; at interpreter exit, every client's pending
futures are waited for, as the standard executors do.

:class:`~pool.client.async_client.AsyncClient` is the same for asyncio
code, on the caller's loop.

A task is run *at least once*: if its worker dies, the dispatcher runs it
again elsewhere (up to its attempt limit), so a task with side effects may
see them twice.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Unpack

from pool.client.core import ClientOptions, open_options
from pool.client.futures import PoolFuture
from pool.client.handlers import withdraw
from pool.client.loop import LoopThread, interpreter_exiting
from pool.client.mapping import (
    Args,
    InMap,
    MapPlan,
    calls_in,
)
from pool.client.options import CallOptionsGiven
from pool.client.progress import Progress, follow, open_bar
from pool.client.refs import ObjectRef
from pool.client.results import flatten, in_order, time_per_call
from pool.client.store import NO_STORE
from workers.protocol import shipping

__all__ = ["Client"]

# How a call names its callable, or what went wrong naming it.
Ref = shipping.Reference | Exception


class Client(concurrent.futures.Executor):
    """An Executor whose tasks run in the pool serving ``namespace``.

    :param namespace: the pool's namespace (``pool up --namespace``).
    :param tags, task_timeout_s, priority, retries, retry_on: the defaults
        of its calls' options (:mod:`pool.client.options`; no time limit,
        priority 0, no retry); :meth:`options` gives other defaults.
    :param ship_modules: modules of yours that the workers cannot import:
        their functions and classes travel by value (cloudpickle's
        ``register_pickle_by_value``, for the life of this process).
    :param discovery_url: find the pool through the Redis it registers in
        (``pool up --discovery redis://...``), from any machine, rather than
        in this machine's runtime directory.
    :param token_file: with ``discovery_url``, the file holding the pool's
        token (else ``$SHMPOOL_TOKEN``, else this machine's pool's).
    :param tls_ca: with ``discovery_url``, the CA (PEM file) of a dispatcher
        that serves TLS (``pool up --tls-cert``; default: the system's roots).
    :param max_pending: at most this many futures pending at once: past it,
        :meth:`submit` (and :meth:`map`) waits for room, as ``put`` on a
        bounded :class:`queue.Queue` does (default: no bound, as
        ``ProcessPoolExecutor``; the dispatcher's own bound then holds the
        tasks back here: ``docs/architecture.md``, every queue is bounded).
    :raises PoolNotRunning: if no pool serves the namespace.
    :raises ValueError: for a ``max_pending`` below 1, or a bad option.
    """

    def __init__(
        self,
        namespace: str = "default",
        *,
        max_pending: int | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        if max_pending is not None and max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.namespace, locator, self._submissions = open_options(namespace, options)
        self._shutdown_lock = threading.Lock()
        self._shutdown = False
        self._runner = LoopThread(locator, max_pending)
        # Unreferenced, the client lets its futures finish, then its thread ends.
        weakref.finalize(self, self._runner.close_when_idle)
        self._owner: Client | None = None  # (a view's: see options)
        self._sent: weakref.WeakSet[concurrent.futures.Future[Any]] | None = None

    def options(self, **given: Unpack[CallOptionsGiven]) -> Client:
        """This client with other defaults for its calls (as Ray's
        ``.options()``): an Executor on the same connection, whose
        ``submit``, ``map``, ``cancel`` and ``put`` send with ``given``
        in place of this client's (``task_timeout_s``, ``priority``,
        ``retries``, ``retry_on``, ``tags``: :mod:`pool.client.options`).
        The callable's own keyword arguments stay its own.

        Its ``shutdown`` (or the end of its ``with``) ends what it sent
        only; the client's own ends it too.

        :raises ValueError: for a bad value (:raises TypeError: for a wrong
            type), named.
        """
        view = copy.copy(self)
        view._submissions = self._submissions.with_options(given)
        view._owner = self._owner or self  # (kept alive while a view is)
        view._shutdown_lock, view._shutdown = threading.Lock(), False
        view._sent = weakref.WeakSet()
        return view

    @property
    def max_workers(self) -> int:
        """How many tasks the pool runs at once now: the slots of its ready
        workers, asked of its dispatcher at each read (so it follows workers
        as they come and go); at least 1, as ``ProcessPoolExecutor``'s.

        :raises PoolNotRunning: if the pool stopped.
        """
        return max(1, self._runner.slots())

    @property
    def _max_workers(self) -> int:
        """:attr:`max_workers`, by the name that code written against
        ``ProcessPoolExecutor`` reads (dask's schedulers do)."""
        return self.max_workers

    def submit(
        self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in the pool. ``fn`` is any callable: a
        function the workers can import travels by name (or pass
        ``"module:qualname"``), anything else by value with cloudpickle
        (lambdas, closures, ``__main__`` functions, partials, bound methods,
        callable objects), pickled now and sent once per connection.

        A function or arguments that cannot be sent set the future's
        exception, as pickling errors do in ``ProcessPoolExecutor``.

        :raises RuntimeError: after :meth:`shutdown`, or once the interpreter
            is exiting.
        """
        ref: shipping.Reference | Exception
        try:
            ref = self._submissions.reference(fn)
        except Exception as exc:
            ref = exc  # set on the future, once the client is known to be open
        return self._send(ref, args, kwargs)

    def _send(
        self,
        ref: Ref,
        args: Args,
        kwargs: Any,
        in_map: InMap | None = None,
    ) -> concurrent.futures.Future[Any]:
        self._runner.reserve()  # (waits while max_pending futures are pending)
        submitted = False
        try:
            with self._shutdown_lock:
                if self._shutdown or (self._owner and self._owner._shutdown):
                    raise RuntimeError("cannot schedule new futures after shutdown")
                if interpreter_exiting():
                    raise RuntimeError(
                        "cannot schedule new futures after interpreter shutdown"
                    )
                future = PoolFuture()
                try:
                    if isinstance(ref, Exception):
                        raise ref
                    submission, code, hold = self._submissions.make(
                        ref, args, kwargs, store=self._runner.store, in_map=in_map
                    )
                except Exception as exc:
                    future.set_exception(exc)
                    return future
                self._runner.submit(submission, code, future, hold)
                submitted = True
                if self._sent is not None:
                    self._sent.add(future)
                return future
        finally:
            if not submitted:
                self._runner.release()

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        progress: Progress = False,
    ) -> Iterator[Any]:
        """Like :meth:`Executor.map`: every call is submitted now, results come
        in order, each released once yielded, and a call's exception is
        raised when its turn comes; ``timeout`` counts from this call.
        ``progress=True`` draws a bar of the calls done (on a terminal or in
        a notebook; or pass a tqdm-like class: :mod:`pool.client.progress`).

        ``chunksize`` calls travel and run as one task (1: a task per call,
        as ``ProcessPoolExecutor`` does by default). By default the size
        adapts: the first calls go one per task, and once one has answered
        (or one has run :data:`PROBE_WAIT_S` unanswered) the rest go in
        chunks that run about :data:`CHUNK_TARGET_S` each, or one per task
        if calls are longer (:class:`~pool.client.mapping.MapPlan`). A chunk's
        calls keep their own values and exceptions, and a worker lost
        mid-chunk costs only that chunk, which runs again."""
        plan = MapPlan(
            iterables, chunksize, per_task_limit=bool(self._submissions.timeout_s)
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            ref = self._submissions.reference(fn)  # pickled once for every call
        except Exception as exc:  # raised on iteration, as the rest would be
            failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
            failed.set_exception(exc)
            return in_order([failed], deadline)
        futures, sizes = self._send_all(plan, ref)
        bar = open_bar(progress, sum(sizes), _name_of(fn))
        if bar is not None:
            follow(bar, futures, sizes)
        results = in_order(futures, deadline, bar.close if bar else None)
        if not plan.chunked:
            return results
        return flatten(results, functools.partial(self._submissions.timed, ref))

    def _send_all(
        self, plan: MapPlan, ref: shipping.Reference
    ) -> tuple[list[concurrent.futures.Future[Any]], list[int]]:
        """Every task of a map, sent (an object passed to many of its calls,
        such as ``[a] * 16``, is written to shared memory once), and the
        calls each carries."""
        store = self._runner.store
        with store.one_call() if store else contextlib.nullcontext():
            tasks = plan.first(self._submissions.per_call_s(ref))
            chunk, part = plan.chunked, self._submissions.map_part(plan.calls)
            futures = [self._send(ref, a, {}, InMap(part, chunk)) for a in tasks]
            if plan.adaptive:
                rest = plan.rest(time_per_call(futures))
                futures += [self._send(ref, a, {}, InMap(part, True)) for a in rest]
                tasks += rest
        sizes = [calls_in(args, chunk) for args in tasks]
        return futures, sizes

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` once in the pool's shared memory, as ``ray.put``
        or Dask's ``scatter`` do: pass the reference to any number of tasks
        (as an argument, or inside one at any depth), and each receives the
        object, mapped, not copied. It lives until :meth:`ObjectRef.release`,
        until nothing references it (tasks that name it hold it until they
        end), or until this client closes.

        :raises RuntimeError: if the pool does not share this machine's
            memory (a pool of other machines: pass the value itself).
        :raises SharedMemoryFull: if it does not fit.
        """
        store = self._runner.store
        if store is None:
            raise RuntimeError(NO_STORE.format(namespace=self.namespace))
        return store.put(value)

    def cancel(
        self, futures: Iterable[concurrent.futures.Future[Any]], *, force: bool = False
    ) -> list[bool]:
        """Cancel these futures at once (a round trip for all of them, where
        ``future.cancel()`` takes one each), as Dask's ``Client.cancel``:
        each is cancelled if its call will never run. With ``force``,
        running calls are stopped too, as a time limit stops them: a
        coroutine is cancelled; a plain function's worker is ended and
        replaced (what it held unstarted goes elsewhere, and a call running
        beside it in that worker runs again elsewhere); their futures end
        cancelled (``result()`` raises ``CancelledError``).

        :returns: for each future, in order, whether it ended cancelled
            (False: it ran, or finished first).
        :raises RuntimeError: for ``force`` from a done callback (the
            client's own thread cannot wait for the pool's word).
        """
        return withdraw(list(futures), "stop" if force else "cancel")

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Accept no more tasks; with ``cancel_futures``, cancel those no
        worker has started (as :meth:`cancel` does: when it returns, each is
        cancelled or running); with ``wait``, return once every future is
        done and the client's thread has ended (else it ends once they are
        done)."""
        with self._shutdown_lock:
            self._shutdown = True
        if self._sent is not None:  # a view: its own futures
            sent = list(self._sent)
            if cancel_futures:
                withdraw(sent, "cancel")
            if wait:
                concurrent.futures.wait(sent)
            return
        if cancel_futures:
            self._runner.cancel_pending()
        self._runner.close_when_idle()
        if wait:
            self._runner.join()


def _name_of(fn: Callable[..., Any]) -> str:
    """What a bar calls ``fn``."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__
