"""``Pool(workers=N)``: a whole pool inside this process, for scripts and tests.

The supervisor runs on its own uvloop loop on a daemon thread (so no
signal handlers: this process's own Ctrl-C ends it through ``__exit__``);
its children are separate processes as ever, and exit by themselves if
this process dies. ``__enter__`` returns a :class:`~pool.client.executor.Client`.

A pool still open when the interpreter exits is stopped then, after its
client's pending futures are done (as ``ProcessPoolExecutor`` does). If
this process is killed instead, its children exit by themselves, and the
next pool to start removes what this one left (``discovery.sweep_dead``).

What ``pool up`` would have printed is kept in :attr:`Pool.log`, its last
:data:`LOG_LINES` lines only (a busy pool says a line a second per worker,
for as long as it runs).

In a notebook, or with a dashboard, the workers' output comes back through
the pool (``capture_output``): each line a task prints is written to the
stdout the pool was made under (the cell's), prefixed by its worker, and
shown on the dashboard. In a script it goes straight to the terminal.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import io
import sys
import threading
import uuid
from collections import deque
from typing import Any, Final, TextIO

import uvloop

from pool.client.executor import Client
from pool.client.progress import in_notebook
from pool.errors import PoolError, leaves
from pool.supervisor.orchestration import Supervisor
from pool.supervisor.settings import PoolSettings
from pool.supervisor.view import Out, PlainView, output_line

START_TIMEOUT_S: Final = 60.0
LOG_LINES: Final = 1000  # what Pool.log keeps


class RecentLines(io.TextIOBase):
    """A text stream that keeps only its last ``lines`` lines (what
    ``getvalue()`` returns, as ``io.StringIO``'s would)."""

    def __init__(self, lines: int = LOG_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._partial = ""  # (a line written in pieces, until its newline)
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            *whole, self._partial = (self._partial + text).split("\n")
            self._lines.extend(whole)
        return len(text)

    def getvalue(self) -> str:
        with self._lock:
            return "".join(f"{line}\n" for line in self._lines) + self._partial


class EchoView(PlainView):
    """The pool's lines, kept in ``log``; a task's output line is written
    to ``echo`` too (the stdout of the code that made the pool: a notebook's
    cell), prefixed by its worker as ``pool up`` shows it, then logged."""

    def __init__(self, log: Out, echo: TextIO | None) -> None:
        super().__init__(log)
        self._echo = echo

    def output(self, name: str, pid: int, text: str) -> None:
        if self._echo is not None:
            self._echo.write(output_line(name, pid, text) + "\n")
            self._echo.flush()
        super().output(name, pid, text)


class Pool:
    """Start a pool on entry, stop it (leaving nothing behind) on exit.

    :param workers: worker processes to start (at least 1); None, the
        default, as ``ProcessPoolExecutor``: one per CPU (``os.cpu_count()``).
    :param namespace: its namespace (a fresh one by default).
    :param settings: any other setting of ``pool up``, by the name its flag
        has there (``--grace-s`` is ``grace_s=``; ``--discovery`` is
        ``discovery_url=``; ``--no-restart`` is ``restart=False``): the
        fields of :class:`~pool.supervisor.settings.PoolSettings`, such as
        ``concurrency``, ``tags``, ``no_worker_timeout_s``,
        ``stuck_grace_s``, ``max_queued``, ``paths``, ``max_tasks_per_child``,
        ``max_memory`` (bytes, or a size such as ``"2GB"``) and ``dashboard``
        (``"[HOST:]PORT"``: its page is then at :attr:`dashboard_url`).
    :raises ValueError: for a bad value, named (a
        :class:`~workers.settings.SettingError`).
    :raises TypeError: for a setting ``pool up`` does not have.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        namespace: str | None = None,
        **settings: Any,
    ) -> None:
        known = {f.name for f in dataclasses.fields(PoolSettings)}
        for name in settings.keys() - known:
            raise TypeError(
                f"Pool() has no setting {name!r}; it takes pool up's: "
                f"{', '.join(sorted(known - {'capture_output'}))}"
            )
        if namespace is None:
            namespace = f"pool-{uuid.uuid4().hex[:12]}"
        if workers is not None:
            settings["workers"] = workers
        # In a notebook (whose cells do not see the workers' own stdout) and
        # for a dashboard, the tasks' output comes back through the pool.
        echo = in_notebook() or bool(settings.get("dashboard"))
        settings.setdefault("capture_output", echo)
        self.settings = PoolSettings(namespace=namespace, **settings)
        self.log = RecentLines()  # what `pool up` would have printed, lately
        self._view = EchoView(self.log, sys.stdout if echo else None)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: Client | None = None
        self.dashboard_url = ""  # with dashboard=: its page, once started

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    def __enter__(self) -> Client:
        self._thread = threading.Thread(target=self._run, name="pool", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._error is not None:
            self._shutdown()
            why = "; ".join(map(str, leaves(self._error))) if self._error else "?"
            raise PoolError(f"the pool did not start: {why}") from self._error
        atexit.register(self.close)
        try:
            self._client = Client(self.namespace)
        except BaseException:
            self.close()
            raise
        return self._client

    def __exit__(self, *exc_info: Any) -> None:
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

        def started() -> None:
            if supervisor.dashboard is not None:
                self.dashboard_url = supervisor.dashboard.url
            self._ready.set()

        supervisor = Supervisor(self.settings, self._view, started)
        await supervisor.run(self._stop, asyncio.Event())

    def _shutdown(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join()
