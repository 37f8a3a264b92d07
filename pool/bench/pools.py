"""The pools ``pool bench`` measures, opened alike: shm-pool (an embedded
:class:`~pool.Pool`, or a running pool by namespace) and its peers,
``ProcessPoolExecutor`` and ``multiprocessing.Pool``, and, where the
``bench`` extra installed them, loky (its ``ProcessPoolExecutor``) and
mpire (``WorkerPool``, which forks its workers), each with its workers'
pids.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Final, Protocol

from discovery import list_workers
from pool.bench.tasks import noop
from pool.client.embedded import Pool
from pool.client.executor import Client


class Executor(Protocol):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any: ...
    def map(self, fn: Callable[..., Any], *it: Any) -> Any: ...


class MpAdapter:
    """``multiprocessing.Pool`` through the calls the set makes."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        return MpFuture(self.pool.apply_async(fn, args))

    def map(self, fn: Callable[..., Any], *it: Any) -> Any:
        return self.pool.imap(fn, *it)


class MpFuture:
    def __init__(self, result: Any) -> None:
        self._result = result

    def result(self) -> Any:
        return self._result.get()


@contextmanager
def _ours(workers: int, namespace: str | None) -> Iterator[tuple[Executor, list[int]]]:
    if namespace is not None:
        with Client(namespace) as client:
            yield client, [w.pid for w in list_workers(namespace)]
        return
    embedded = Pool(workers=workers)
    with embedded as client:
        yield client, [w.pid for w in list_workers(embedded.namespace)]


@contextmanager
def _process_pool(workers: int) -> Iterator[tuple[Executor, list[int]]]:
    with concurrent.futures.ProcessPoolExecutor(workers) as executor:
        list(executor.map(noop, range(workers)))  # it starts workers lazily
        yield executor, _mp_children()


@contextmanager
def _mp_pool(workers: int) -> Iterator[tuple[Executor, list[int]]]:
    with multiprocessing.Pool(workers) as pool:
        yield MpAdapter(pool), _mp_children()


def _mp_children() -> list[int]:
    """The processes ``multiprocessing`` started here and that still run:
    the workers of the one standard pool open (the peers are opened one at
    a time)."""
    return [child.pid for child in multiprocessing.active_children() if child.pid]


@contextmanager
def _loky(workers: int) -> Iterator[tuple[Executor, list[int]]]:
    import loky

    with loky.ProcessPoolExecutor(workers) as executor:
        list(executor.map(noop, range(workers)))  # it starts workers lazily
        yield executor, list(executor._processes)


@contextmanager
def _mpire(workers: int) -> Iterator[tuple[Executor, list[int]]]:
    from mpire.pool import WorkerPool

    # (keep_alive: its workers serve apply_async and map alike, as a pool's)
    with WorkerPool(n_jobs=workers, keep_alive=True) as pool:
        pool.map(noop, range(workers))  # it starts workers lazily
        yield MpAdapter(pool), [w.pid for w in pool._workers]


OURS: Final = "shm-pool"
_INSTALLED: Final = [
    name for name in ("loky", "mpire") if importlib.util.find_spec(name) is not None
]
PEERS: Final = ("ProcessPoolExecutor", "mp.Pool", *_INSTALLED)


def opener(
    name: str, workers: int, namespace: str | None
) -> Callable[[], AbstractContextManager[tuple[Executor, list[int]]]]:
    if name == OURS:
        return lambda: _ours(workers, namespace)
    peers = {
        "ProcessPoolExecutor": _process_pool,
        "mp.Pool": _mp_pool,
        "loky": _loky,
        "mpire": _mpire,
    }
    return lambda: peers[name](workers)
