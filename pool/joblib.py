"""joblib's backend for the pool: ``import pool.joblib``, then
``parallel_config(backend="shm-pool")``, and scikit-learn's ``n_jobs``
reaches the pool's workers.

- ``parallel_config(backend="shm-pool", namespace="default")``: a running
  pool (``pool up``); ``workers=4`` (and any other ``Pool`` setting): a pool
  of its own, started at the first ``Parallel`` call and stopped when the
  configuration is let go of (or at exit); ``client=``: a ``Client`` or
  ``Pool`` you hold; nothing: a pool of its own, one worker per CPU.
- ``n_jobs=-1`` is every slot of the pool (workers times concurrency), -2
  all but one, and so on; a positive ``n_jobs`` caps the batches this
  ``Parallel`` has in the pool at once (:class:`Batches` holds the rest).
  ``n_jobs=None`` and ``n_jobs=1`` run where joblib's own backends run
  them, in the caller, one call after another, unless
  ``parallel_config(n_jobs=...)`` says otherwise: so does scikit-learn's
  default, ``n_jobs=None``. (Code that counts or warns in the caller, or
  keeps what only the caller's objects keep, then behaves as on joblib's
  default backend.)
- joblib batches the calls (``batch_size="auto"`` as for loky); each batch
  is one task, its arguments pickled with protocol 5, so a large array
  goes through shared memory, written once however many batches name it
  (:mod:`pool.client.copies`).
- An exception in a call cancels every batch no worker has started
  (:meth:`ShmPoolBackend.abort_everything`), and once that returns, no
  batch starts: each cancel waits for the pool's word, and a batch joblib
  hands over while it aborts is cancelled here; the one raised carries
  the worker's traceback as its cause. A batch whose worker dies runs again
  elsewhere, as any task does.
- A ``Parallel`` inside a task runs sequentially in that worker, unless it
  names a backend of its own.

Callbacks to joblib run on a thread of the backend's, never on the
client's loop: joblib dispatches the next batch from them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import operator
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from joblib import register_parallel_backend
from joblib._parallel_backends import (
    AutoBatchingMixin,
    ParallelBackendBase,
    SequentialBackend,
)

from pool.client.embedded import Pool
from pool.client.executor import Client

__all__ = ["BACKEND", "ShmPoolBackend"]

BACKEND: Final = "shm-pool"
Callback = Callable[[concurrent.futures.Future[Any]], Any]


class Batches:
    """One ``Parallel`` call's batches: at most ``limit`` of them in the
    pool at once, the rest waiting here in order (no more than joblib's
    ``pre_dispatch`` lets it send ahead). Each batch's own future settles,
    and joblib's callback runs, on the relay thread."""

    def __init__(self, client: Client, limit: int) -> None:
        self._client, self._limit = client, limit
        self._lock = threading.Lock()
        self._sent_all = threading.Condition(self._lock)  # no send under way
        self._sending = 0
        self._aborted = False  # cancel() was called: send nothing more
        self._in_pool = 0
        self._waiting: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._waiting = deque()
        self._sent: dict[concurrent.futures.Future[Any], concurrent.futures.Future[Any]]
        self._sent = {}
        self._relay = concurrent.futures.ThreadPoolExecutor(1, "shm-pool-joblib")

    def submit(
        self, batch: Callable[[], Any], callback: Callback | None
    ) -> concurrent.futures.Future[Any]:
        """The future of ``batch``, sent now or once there is room."""
        mine: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if callback is not None:
            mine.add_done_callback(callback)
        with self._lock:
            if self._aborted:
                aborted = True
            elif self._in_pool >= self._limit:
                self._waiting.append((batch, mine))
                return mine
            else:
                aborted, self._in_pool = False, self._in_pool + 1
        if aborted:
            _cancel(mine)
        else:
            self._send(batch, mine)
        return mine

    def _send(
        self, batch: Callable[[], Any], mine: concurrent.futures.Future[Any]
    ) -> None:
        with self._lock:
            if self._aborted:
                self._in_pool -= 1
                aborted = True
            else:
                aborted, self._sending = False, self._sending + 1
        if aborted:
            _cancel(mine)
            return
        try:  # (the batch travels as an argument: its arrays by shared memory)
            sent = self._client.submit(operator.call, batch)
        except BaseException as exc:
            self._settle(mine, None, exc)
            return
        finally:
            with self._lock:
                self._sending -= 1
                self._sent_all.notify_all()
        with self._lock:
            self._sent[sent] = mine
        sent.add_done_callback(self._relayed)

    def _relayed(self, sent: concurrent.futures.Future[Any]) -> None:
        """The client's loop: hand the settled batch to the relay thread."""
        with contextlib.suppress(RuntimeError):  # the call ended: nobody waits
            self._relay.submit(self._finished, sent)

    def _finished(self, sent: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            mine = self._sent.pop(sent)
            following = self._waiting.popleft() if self._waiting else None
            if following is None:
                self._in_pool -= 1
        if following is not None:
            self._send(*following)
        if sent.cancelled():
            _cancel(mine)
        else:
            self._settle(mine, sent, sent.exception())

    def _settle(
        self,
        mine: concurrent.futures.Future[Any],
        sent: concurrent.futures.Future[Any] | None,
        exc: BaseException | None,
    ) -> None:
        if not mine.done() and mine.set_running_or_notify_cancel():
            if exc is not None:
                mine.set_exception(exc)
            else:
                assert sent is not None
                mine.set_result(sent.result())

    def cancel(self) -> None:
        """Cancel every batch no worker has started (running ones go on),
        and whatever is handed over from now on: once this returns, no
        batch of this call starts."""
        with self._lock:
            self._aborted = True
            waiting, self._waiting = list(self._waiting), deque()
            self._sent_all.wait_for(lambda: not self._sending)
            sent = list(self._sent)
        for _, mine in waiting:
            _cancel(mine)
        self._client.cancel(sent)

    def close(self) -> None:
        """Let the relay thread end once its callbacks have run."""
        self._relay.shutdown(wait=False)

    def renewed(self) -> Batches:
        """These batches' successor, for the next call of a ``Parallel``
        that goes on after an abort (these are closed)."""
        self.close()
        return Batches(self._client, self._limit)


def _cancel(future: concurrent.futures.Future[Any]) -> None:
    """Cancel a batch's own future (pending until settled): its callback
    runs, and its waiters wake."""
    if future.cancel():
        with contextlib.suppress(RuntimeError):  # (told already)
            future.set_running_or_notify_cancel()


class ShmPoolBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]
    """joblib's ``ParallelBackendBase`` on a pool (see the module docstring).

    :param namespace: a running pool's namespace.
    :param workers: start a pool of this many workers (with ``settings``).
    :param client: a ``Client`` (or what ``Pool.__enter__`` gave) to use.
    :raises ValueError: if more than one of them is given.
    """

    supports_retrieve_callback = True  # so: return_as="generator", timeouts
    supports_sharedmem = False
    uses_threads = False
    default_n_jobs = 1  # (as joblib's: None runs in the caller; -1 asks for the pool)

    def __init__(
        self,
        namespace: str | None = None,
        *,
        workers: int | None = None,
        client: Client | None = None,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads
        )
        given = [n for n, v in (("namespace", namespace), ("client", client)) if v]
        if len(given) + (workers is not None or bool(settings)) > 1:
            raise ValueError(
                f"the {BACKEND!r} backend takes a running pool's namespace, a "
                f"client, or the settings of a pool of its own: not several"
            )
        self._namespace, self._client = namespace, client
        self._settings = {"workers": workers, **settings}
        self._batches: Batches | None = None

    def _opened(self) -> Client:
        if self._client is None:
            if self._namespace is not None:
                self._client = Client(self._namespace)
                weakref.finalize(self, self._client.shutdown)
            else:
                embedded = Pool(**self._settings)
                self._client = embedded.__enter__()
                weakref.finalize(self, embedded.close)
        return self._client

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """``n_jobs``; for -1, -2, ... the pool's slots, all but one, ...;
        for None, 1 (as joblib's backends: scikit-learn asks with its
        default, None, to decide whether to split its work)."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max(self._opened().max_workers + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: int = 1, parallel: Any = None, **_: Any) -> int:
        """Ready the pool for one ``Parallel`` call; the jobs it runs at once."""
        self.parallel = parallel
        n_jobs = self.effective_n_jobs(n_jobs)
        self._batches = Batches(self._opened(), n_jobs)
        return n_jobs

    def submit(
        self, func: Callable[[], Any], callback: Callback | None = None
    ) -> concurrent.futures.Future[Any]:
        assert self._batches is not None, "joblib submits after configure"
        return self._batches.submit(func, callback)

    def retrieve_result_callback(self, out: concurrent.futures.Future[Any]) -> Any:
        return out.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Cancel the call's batches no worker has started; the pool stays
        (and with ``ensure_ready``, this backend, for the next call)."""
        if self._batches is not None:
            self._batches.cancel()
            if ensure_ready:
                self._batches = self._batches.renewed()
            else:
                self.terminate()

    def terminate(self) -> None:
        """The ``Parallel`` call ended: its relay thread goes; the pool stays
        for the next call."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None
        self.reset_batch_stats()

    def get_nested_backend(self) -> tuple[ParallelBackendBase, int | None]:
        """What a ``Parallel`` inside a task runs on: sequentially there."""
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None


register_parallel_backend(BACKEND, ShmPoolBackend)
