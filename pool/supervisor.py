"""The supervisor: owns a namespace, its dispatcher and its workers.

:meth:`Supervisor.run` claims the namespace (an exclusive lock on
``<namespace dir>/owner`` held for the pool's life, holding its pid), then
creates the registry and the token, starts the dispatcher and the workers
as fresh interpreters in their own sessions (so a terminal's Ctrl-C
reaches only the supervisor), writes the dispatcher's address for clients,
and shows every event through a :class:`~pool.view.View`. A child that
dies is reaped at once and replaced, with exponential back-off. When
``stop`` is set it drains: SIGTERM to every worker, ``grace_s`` for them
to finish (cut short when ``kill_now`` is set), SIGKILL for the rest, then
the dispatcher; and the registry's owner removes every file and segment.
Every child also exits by itself when the supervisor dies (``--parent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Final

import portalocker
from grpc import aio

from discovery import LocalDiscovery, Subscriber, paths, reclaim
from pool.children import Spawned, spawn
from pool.client import ADDRESS_FILE
from pool.dispatcher_pb2 import WorkerExit
from pool.dispatcher_pb2_grpc import DispatcherStub
from pool.errors import PoolAlreadyRunning, PoolError
from pool.view import View
from workers import auth
from workers.lifecycle import READY_PREFIX
from workers.tasks import MAX_ARGS_BYTES

OWNER_FILE: Final = "owner"
START_TIMEOUT_S: Final = 30.0
BACKOFF_S: Final = (0.1, 10.0)  # first delay, cap


class ChildFailed(PoolError):
    """A child process exited or hung before it was ready."""


@dataclass(eq=False)
class Child:
    """A process the supervisor started, and what it said when ready."""

    name: str
    argv: list[str]
    process: Spawned | None = None
    ready: dict[str, Any] = field(default_factory=dict)
    started_at: float = 0.0
    failures: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0


@dataclass
class Options:
    namespace: str = "default"
    workers: int = os.cpu_count() or 1
    concurrency: int = 1
    tags: tuple[str, ...] = ()
    host: str | None = None
    restart: bool = True
    grace_s: float = 30.0
    capacity: int = 128
    no_worker_timeout_s: float = 30.0
    max_args_bytes: int = MAX_ARGS_BYTES


class Supervisor:
    """Runs one pool; see the module docstring."""

    def __init__(self, options: Options, view: View) -> None:
        paths.validate_namespace(options.namespace)
        if options.workers < 0:
            raise ValueError(f"--workers must be 0 or more, got {options.workers}")
        self.options = options
        self.view = view
        self.ready = asyncio.Event()
        self.address = ""
        self._stopping = False
        self._dispatcher: Child | None = None
        self._workers: list[Child] = []
        self._watchers: set[asyncio.Task[None]] = set()
        self._reporter: tuple[str, aio.Channel] | None = None
        self._registered: set[str] = set()  # uids seen added, not yet dropped
        self._registry_changed = asyncio.Event()

    async def run(self, stop: asyncio.Event, kill_now: asyncio.Event) -> None:
        """Run the pool until ``stop``; drain; leave nothing behind."""
        ns = self.options.namespace
        owner = _claim(ns)
        try:
            reclaim(ns)
            capacity = max(self.options.capacity, 2 * self.options.workers)
            with LocalDiscovery(ns, capacity=capacity):
                auth.create_token(ns)
                follower = asyncio.create_task(self._follow())
                try:
                    await self._start_all()
                    await self._until_registered()
                    self.view.note(
                        "ready",
                        namespace=ns,
                        workers=len(self._workers),
                        address=self.address,
                    )
                    self.ready.set()
                    await stop.wait()
                finally:
                    self._stopping = True
                    self.view.note("stopping", namespace=ns)
                    await self._stop_all(kill_now)
                    follower.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await follower
        finally:
            os.close(owner)
        self.view.note("stopped", namespace=ns)

    # -- starting ------------------------------------------------------------

    async def _start_all(self) -> None:
        opts, me = self.options, str(os.getpid())
        common = ["--namespace", opts.namespace, "--parent", me]
        host = ["--host", opts.host] if opts.host else []
        dispatcher = Child(
            "dispatcher",
            [
                "-m",
                "pool.dispatcher",
                *common,
                *host,
                "--no-worker-timeout-s",
                str(opts.no_worker_timeout_s),
            ],
        )
        self._dispatcher = dispatcher
        worker_argv = [
            "-m",
            "workers",
            *common,
            *host,
            "--concurrency",
            str(opts.concurrency),
            "--grace-s",
            str(opts.grace_s),
            "--max-args-bytes",
            str(opts.max_args_bytes),
        ]
        if opts.tags:
            worker_argv += ["--tags", ",".join(opts.tags)]
        self._workers = [Child(f"worker-{i}", worker_argv) for i in range(opts.workers)]
        # All at once: workers need only the registry and the token, and the
        # dispatcher finds them in the registry whenever it comes up. A worker
        # that fails to start is retried like any dead worker; a dispatcher
        # that fails ends `pool up` (its trouble is most likely the setup).
        workers = [self._start_or_retry(child) for child in self._workers]
        results = await asyncio.gather(
            self._start(dispatcher), *workers, return_exceptions=True
        )
        if isinstance(results[0], BaseException):
            raise results[0]

    async def _start_or_retry(self, child: Child) -> None:
        try:
            await self._start(child)
        except ChildFailed as exc:
            self._retry(child, exc)

    def _retry(self, child: Child, error: ChildFailed) -> None:
        """Note a failed start, and restart after the back-off."""
        self.view.note("start-failed", name=child.name, error=str(error))
        watcher = asyncio.create_task(self._watch(child))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _start(self, child: Child) -> None:
        """Start a child, wait for its READY line, and watch it from then on."""
        child.ready = {}
        ready_read, ready_write = os.pipe()
        try:
            argv = [sys.executable, *child.argv, "--ready-fd", str(ready_write)]
            process = spawn(argv, pass_fds=(ready_write,))
        finally:
            os.close(ready_write)
        child.process, child.started_at = process, time.monotonic()
        try:
            child.ready = await _read_ready(ready_read, process, child.name)
        except BaseException:
            await _kill(process)
            raise
        self._registry_changed.set()  # _until_registered looks again
        if child is self._dispatcher:  # a restarted one may listen elsewhere
            self.address = child.ready["address"]
            _write_private(self.options.namespace, ADDRESS_FILE, self.address)
        self.view.note(f"{child.name.split('-')[0]}-started", pid=process.pid)
        watcher = asyncio.create_task(self._watch(child))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, child: Child) -> None:
        """Reap the child when it exits; replace it unless stopping."""
        assert child.process is not None
        code = await child.process.wait()
        self.view.note(
            f"{child.name.split('-')[0]}-exited", pid=child.pid, **_exit(code)
        )
        if child is not self._dispatcher:
            await self._report_exit(child.pid, code)
        if self._stopping:
            return
        if not self.options.restart:
            self.view.note(f"{child.name.split('-')[0]}-not-replaced", pid=child.pid)
            return
        # Back off only for a child that dies before it is ready: one killed
        # after it served is replaced at once.
        child.failures = 0 if child.ready else child.failures + 1
        await asyncio.sleep(restart_delay(child.failures))
        if self._stopping:
            return
        try:
            await self._start(child)
        except ChildFailed as exc:
            self._retry(child, exc)

    async def _report_exit(self, pid: int, code: int) -> None:
        """Tell the dispatcher how a worker ended (for its poison-task error)."""
        if not self.address:
            return  # no dispatcher has been ready yet: it sent it no task
        if self._reporter is None or self._reporter[0] != self.address:
            if self._reporter is not None:
                await self._reporter[1].close()
            channel = aio.insecure_channel(self.address)
            self._reporter = (self.address, channel)
        stub = DispatcherStub(self._reporter[1])  # type: ignore[no-untyped-call]
        token = auth.read_token(self.options.namespace)
        with contextlib.suppress(aio.AioRpcError):
            await stub.ReportExit(
                WorkerExit(pid=pid, status=_describe_exit(code)),
                metadata=auth.call_metadata(token),
                timeout=2.0,
            )

    # -- stopping ------------------------------------------------------------

    async def _stop_all(self, kill_now: asyncio.Event) -> None:
        workers = [c.process for c in self._workers if c.process is not None]
        await _terminate(workers, self.options.grace_s + 5, kill_now)
        if self._dispatcher is not None and self._dispatcher.process is not None:
            await _terminate([self._dispatcher.process], 5.0, kill_now)
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        if self._reporter is not None:
            await self._reporter[1].close()

    async def _follow(self) -> None:
        async for event in Subscriber(self.options.namespace):
            uid = str(event.worker_info.uid)
            if event.type == "worker-dropped":
                self._registered.discard(uid)
            else:
                self._registered.add(uid)
            self._registry_changed.set()
            self.view.event(event)

    async def _until_registered(self) -> None:
        """Wait until every worker is ready and this view has seen it added."""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while not all(
                    c.ready and c.ready["uid"] in self._registered
                    for c in self._workers
                ):
                    await self._registry_changed.wait()
                    self._registry_changed.clear()
        except TimeoutError:
            late = sum(1 for c in self._workers if not c.ready)
            raise ChildFailed(
                f"{late} of {len(self._workers)} workers were not ready within "
                f"{START_TIMEOUT_S:g} s; see the errors above"
            ) from None


async def _read_ready(fd: int, process: Spawned, name: str) -> dict[str, Any]:
    """The READY line a child writes to ``fd`` (which this closes)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
    )
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            text = (await reader.readline()).decode(errors="replace")
    except TimeoutError:
        raise ChildFailed(
            f"{name} was not ready within {START_TIMEOUT_S:g} s"
        ) from None
    finally:
        transport.close()
    if text.startswith(READY_PREFIX):
        return json.loads(text[len(READY_PREFIX) :])  # type: ignore[no-any-return]
    code = await process.wait()
    raise ChildFailed(f"{name} exited before it was ready ({_describe_exit(code)})")


async def _terminate(
    processes: list[Spawned], grace_s: float, kill_now: asyncio.Event
) -> None:
    """SIGTERM, wait up to ``grace_s`` (or until ``kill_now``), SIGKILL, reap."""
    alive = [p for p in processes if p.returncode is None]
    for process in alive:
        process.send_signal(signal.SIGTERM)
    exited = asyncio.ensure_future(asyncio.gather(*(p.wait() for p in alive)))
    hurry = asyncio.ensure_future(kill_now.wait())
    pending: set[asyncio.Future[Any]] = {exited, hurry}
    await asyncio.wait(pending, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
    hurry.cancel()
    await asyncio.gather(*(_kill(p) for p in alive))
    await exited


async def _kill(process: Spawned) -> None:
    process.kill()
    await process.wait()


def restart_delay(failures: int) -> float:
    """Seconds before restarting a child that failed to start ``failures``
    times in a row: none for the first restart, then 0.1 s doubling to 10 s."""
    if failures <= 0:
        return 0.0
    first, cap = BACKOFF_S
    return float(min(cap, first * 2 ** (failures - 1)))


def _exit(code: int) -> dict[str, Any]:
    return {"signal": signal.Signals(-code).name} if code < 0 else {"code": code}


def _describe_exit(code: int) -> str:
    return (
        f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    )


def _claim(namespace: str) -> int:
    """Lock the namespace's owner file for this process's life.

    :returns: the descriptor holding the lock (closing it releases it).
    :raises PoolAlreadyRunning: if a live pool holds it.
    """
    path = paths.namespace_dir(namespace) / OWNER_FILE
    fd = paths.open_private_file(path)
    flags = portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING
    try:
        portalocker.lock(fd, flags)
    except portalocker.AlreadyLocked:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise PoolAlreadyRunning(
            namespace, int(text) if text.isdigit() else 0
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def owner_pid(namespace: str) -> int | None:
    """The pid of the supervisor that owns ``namespace``, if one is alive."""
    path = paths.namespace_dir(namespace, create=False) / OWNER_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        flags = portalocker.LockFlags.SHARED | portalocker.LockFlags.NON_BLOCKING
        try:
            portalocker.lock(fd, flags)
        except portalocker.AlreadyLocked:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        return None  # nobody holds it: the owner is gone
    finally:
        os.close(fd)


def _write_private(namespace: str, name: str, text: str) -> None:
    fd = paths.open_private_file(
        paths.namespace_dir(namespace) / name, os.O_WRONLY | os.O_TRUNC
    )
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
