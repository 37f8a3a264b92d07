"""``Pool(workers=N)``: a whole pool inside this process, for scripts and tests.

The supervisor runs on its own uvloop loop on a daemon thread (so no
signal handlers: this process's own Ctrl-C ends it through ``__exit__``);
its children are separate processes as ever, and exit by themselves if
this process dies. ``__enter__`` returns a :class:`~pool.client.executor.Client`.

A pool still open when the interpreter exits is stopped then, after its
client's pending futures are done (as ``ProcessPoolExecutor`` does). If
this process is killed instead, its children exit by themselves, and the
next pool to start removes what this one left (``discovery.sweep_dead``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import threading
import uuid
from types import TracebackType
from typing import Final

import uvloop

from pool.client.executor import Client
from pool.dispatcher.queue import MAX_QUEUED
from pool.errors import PoolError
from pool.supervisor.orchestration import Options, Supervisor
from pool.supervisor.view import PlainView

START_TIMEOUT_S: Final = 60.0


class Pool:
    """Start a pool on entry, stop it (leaving nothing behind) on exit.

    :param workers: worker processes to start (at least 1).
    :param namespace: its namespace (a fresh one by default).
    :param concurrency: tasks each worker runs at once.
    :param tags: tags every worker has.
    :param no_worker_timeout_s: how long a task waits for a matching worker.
    :param stuck_grace_s: how long a worker whose every thread is held by a
        timed-out or cancelled task may stay so before it is replaced.
    :param max_queued: how many tasks may wait for a worker in the dispatcher.
    :param discovery_url: register the workers in Redis at this URL
        (``redis://HOST:PORT``) instead of shared memory.
    :raises ValueError: for a bad number of workers, concurrency or namespace.
    """

    def __init__(
        self,
        workers: int = 4,
        *,
        namespace: str | None = None,
        concurrency: int = 1,
        tags: tuple[str, ...] = (),
        no_worker_timeout_s: float = 30.0,
        stuck_grace_s: float = 60.0,
        max_queued: int = MAX_QUEUED,
        discovery_url: str | None = None,
    ) -> None:
        self.options = Options(
            namespace=f"pool-{uuid.uuid4().hex[:12]}"
            if namespace is None
            else namespace,
            workers=workers,
            concurrency=concurrency,
            tags=tags,
            no_worker_timeout_s=no_worker_timeout_s,
            stuck_grace_s=stuck_grace_s,
            max_queued=max_queued,
            discovery_url=discovery_url,
        )
        self.log = io.StringIO()  # what `pool up` would have printed
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: Client | None = None

    @property
    def namespace(self) -> str:
        return self.options.namespace

    def __enter__(self) -> Client:
        self._thread = threading.Thread(target=self._run, name="pool", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._error is not None:
            self._shutdown()
            raise PoolError(f"the pool did not start: {self._error}") from self._error
        atexit.register(self.close)
        try:
            self._client = Client(self.namespace)
        except BaseException:
            self.close()
            raise
        return self._client

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Wait for the client's futures, then drain and stop the pool."""
        atexit.unregister(self.close)
        if self._client is not None:
            self._client.shutdown()
        self._shutdown()

    def _run(self) -> None:
        try:
            uvloop.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        supervisor = Supervisor(self.options, PlainView(self.log), self._ready.set)
        await supervisor.run(self._stop, asyncio.Event())

    def _shutdown(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join()
