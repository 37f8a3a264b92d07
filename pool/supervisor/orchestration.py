"""The supervisor: owns a namespace, its dispatcher and its workers.

:meth:`Supervisor.run` claims the namespace (``LocalDiscovery(exclusive=
True)``: a lock held for the pool's life; what a dead pool left is
replaced), sweeps what other dead pools of this user left, creates the
token, starts the dispatcher and the workers in their own sessions (so a
terminal's Ctrl-C reaches only the supervisor), writes the dispatcher's
address for clients (and, with ``discovery_url``, announces it in Redis for
clients of other machines: :mod:`pool.client.rendezvous`), and shows every event
through a :class:`~pool.supervisor.view.View`.

Children are forked from a :class:`~pool.supervisor.zygote.Zygote` that the
supervisor starts first thing (its imports overlap the claim of the
namespace). While it is down, they start the slow way, as fresh
interpreters (``python -m workers.process``), and it is restarted.

Every child gets a pidfd of the supervisor (``--parent-fd``) and exits when
it becomes readable, that is when the supervisor dies, however it dies. The
dispatcher also gets a pipe only the supervisor writes to
(``--control-fd``): how each worker ended, when every worker has started
(tasks whose tags no worker has fail at once from then on), and when the
pool drains.

With ``capture_output`` (``pool up``), each child's stdout and stderr
share a pipe to the supervisor (``--output-fd``), whose lines the view
shows prefixed by the child (``[w3 pid=1234] ...``).

A child that dies is reaped at once and replaced (with exponential
back-off for one that dies before it is ready). A worker whose status
stays ``"stuck"`` for ``stuck_grace_s`` is stopped and so replaced. When
``stop`` is set it drains: it tells the dispatcher (which fails the tasks
no worker has yet), SIGTERMs every worker and gives them ``grace_s`` to
finish (cut short when ``kill_now`` is set), SIGKILLs the rest, then stops
the dispatcher, which first delivers every result it has and fails the
rest (it is given two seconds for that even after a second Ctrl-C); the
registry's owner removes every file and segment. All its background work
runs in one task group, so any unexpected error ends ``pool up`` (after
the drain) with that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from discovery import LocalDiscovery, NamespaceInUse, backends, paths, sweep_dead
from pool.client import rendezvous
from pool.client.rendezvous import ADDRESS_FILE
from pool.dispatcher.queue import MAX_QUEUED
from pool.errors import PoolAlreadyRunning
from pool.supervisor.children import (
    START_TIMEOUT_S,
    ChildFailed,
    Process,
    describe_exit,
    exit_fields,
    read_ready,
    spawn,
    terminate,
)
from pool.supervisor.output import output_lines
from pool.supervisor.view import View
from pool.supervisor.zygote import Zygote, ZygoteUnavailable, sweep_temp_dirs
from workers.offload import in_daemon_thread
from workers.protocol import auth
from workers.protocol.codec import MAX_ARGS_BYTES

BACKOFF_S: Final = (0.1, 10.0)  # first delay, cap
DISPATCHER_STOP_S: Final = 15.0  # it waits for its last results, then ends
# After a second Ctrl-C the workers are killed at once, but the dispatcher
# still gets this long to tell each client how its tasks ended.
HURRIED_DISPATCHER_STOP_S: Final = 2.0
OUTPUT_DRAIN_S: Final = 1.0  # for the children's last lines, once they exited


@dataclass(eq=False)
class Child:
    """A process the supervisor started, and what it said when ready."""

    name: str
    module: str  # run as `python -m module`, or its `main` forked by the zygote
    argv: list[str]
    process: Process | None = None
    ready: dict[str, Any] = field(default_factory=dict)
    failures: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    @property
    def kind(self) -> str:
        return self.name.split("-")[0]

    @property
    def label(self) -> str:
        """How its output is prefixed: ``w3`` for worker-3."""
        kind, _, number = self.name.partition("-")
        return f"w{number}" if kind == "worker" else kind


@dataclass
class Options:
    namespace: str = "default"
    workers: int = os.cpu_count() or 1
    external_workers: bool = False  # others join by hand: 0 workers is allowed
    concurrency: int = 1
    tags: tuple[str, ...] = ()
    host: str | None = None
    port: int = 0  # the dispatcher's, with host
    advertise: str | None = None  # the dispatcher's address for other machines
    restart: bool = True
    grace_s: float = 30.0
    capacity: int = 128
    no_worker_timeout_s: float = 30.0
    max_args_bytes: int = MAX_ARGS_BYTES
    stuck_grace_s: float = 60.0
    max_queued: int = MAX_QUEUED
    # Show what children write to stdout and stderr through the view, a line
    # at a time, prefixed by who wrote it (else they share the caller's).
    capture_output: bool = False
    paths: tuple[str, ...] = ()  # where workers import task modules from first
    reload: bool = False  # workers re-import a task module whose source changed
    # Workers register in Redis at this URL, not in the namespace's shared
    # memory (which still holds the pool's ownership, token and address).
    discovery_url: str | None = None
    # The token to use, shared with workers on other hosts (else a fresh one;
    # $SHMPOOL_TOKEN also gives it).
    token_file: str | None = None
    tls_ca: str | None = None  # the CA of workers that serve TLS (PEM file)
    # A certificate and key (PEM files) for the TCP ports (with host): the
    # dispatcher's serves TLS to clients of other machines (this machine's
    # use its unix socket), and the workers' to the dispatcher.
    tls: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        paths.validate_namespace(self.namespace)
        backends.check_url(self.discovery_url)
        joining = self.discovery_url or self.external_workers
        if self.workers < (0 if joining else 1):
            raise ValueError(
                f"workers must be at least {0 if joining else 1}, got {self.workers}"
                + ("" if joining else "; 0 only with --discovery or --external-workers")
            )
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {self.max_queued}")
        if self.host and self.workers and bool(self.tls_ca) != bool(self.tls):
            raise ValueError(
                "with --host, --tls-cert and --tls-ca go together: the workers "
                "`pool up` puts on TCP serve TLS with the certificate, and the "
                "dispatcher checks it against the CA (for a self-signed "
                "certificate, give it as its own CA)"
            )


class Supervisor:
    """Runs one pool; see the module docstring.

    :param on_ready: called once every worker is registered.
    """

    def __init__(
        self,
        options: Options,
        view: View,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.options = options
        self.view = view
        self._on_ready = on_ready
        self.address = ""  # the dispatcher's, for this machine's clients
        self.remote = rendezvous.Announced("")  # for others, with --discovery
        self._stopping = False
        self._dispatcher: Child | None = None
        self._workers: list[Child] = []
        self._group: asyncio.TaskGroup | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._relays: set[asyncio.Task[None]] = set()  # children's output
        self._parent_fd = -1
        self._control_fd = -1  # the write end of the dispatcher's control pipe
        self._status: dict[str, str] = {}  # uid -> status, of registered workers
        self._registry_changed = asyncio.Event()
        self._zygote: Zygote | None = None
        self._ready = False  # every worker has been registered once

    async def run(self, stop: asyncio.Event, kill_now: asyncio.Event) -> None:
        """Run the pool until ``stop``; drain; leave nothing behind.

        :raises PoolAlreadyRunning: if a live pool owns the namespace.
        :raises ChildFailed: if the dispatcher, or every worker, cannot start.
        """
        ns, opts = self.options.namespace, self.options
        capacity = max(opts.capacity, 2 * opts.workers)
        registry = LocalDiscovery(ns, capacity=capacity, exclusive=True)
        zygote = Zygote(lambda what, pid: self.view.note(f"zygote-{what}", pid=pid))
        entered, owner = False, 0
        try:
            try:
                async with asyncio.TaskGroup() as starting:
                    # The zygote's imports take the longest: they run meanwhile.
                    starting.create_task(self._warm(zygote))
                    try:
                        await in_daemon_thread(registry.__enter__)  # may wait
                        entered = True
                    except NamespaceInUse as exc:
                        owner = exc.pid
            except BaseExceptionGroup as group:
                raise _first_error(group) from None
            if not entered:
                raise PoolAlreadyRunning(ns, owner)
            try:
                await in_daemon_thread(sweep_dead)  # other pools' leftovers
                await in_daemon_thread(sweep_temp_dirs)
                given = None
                if opts.token_file or os.environ.get(auth.TOKEN_ENV):
                    given = auth.token_for(ns, opts.token_file)
                auth.create_token(ns, given)
                self._parent_fd = os.pidfd_open(os.getpid())
                try:
                    await self._supervise(stop, kill_now)
                except BaseExceptionGroup as group:
                    raise _first_error(group) from None
            finally:
                for fd in (self._parent_fd, self._control_fd):
                    if fd >= 0:
                        os.close(fd)
        finally:
            if entered:
                await in_daemon_thread(registry.close)  # (works at exit, too)
            await in_daemon_thread(zygote.close)
        self.view.note("stopped", namespace=ns)

    async def _warm(self, zygote: Zygote) -> None:
        """Start the zygote; without it, children start the slow way."""
        try:
            await zygote.start()
        except ZygoteUnavailable as exc:
            self.view.note("zygote-failed", error=str(exc))
        self._zygote = zygote

    async def _supervise(self, stop: asyncio.Event, kill_now: asyncio.Event) -> None:
        ns = self.options.namespace
        async with asyncio.TaskGroup() as group:
            self._group = group
            self._spawn(self._follow())
            restarting = announcing = None
            if self._zygote is not None:
                restarting = self._spawn(self._zygote.watch())
            try:
                await self._start_all()
                await self._until_registered()
                if self.options.discovery_url:  # for clients of other machines
                    announced = asyncio.Event()
                    announcing = self._spawn(
                        rendezvous.announce(
                            self.options.discovery_url,
                            ns,
                            lambda: self.remote,
                            announced,
                        )
                    )
                    await announced.wait()  # findable once it says "ready"
                ready: dict[str, Any] = {
                    "namespace": self.options.namespace,
                    "workers": len(self._workers),
                    "address": self.address,
                }
                if self.options.paths:
                    ready["path"] = ":".join(self.options.paths)
                self.view.note("ready", **ready)
                self._ready = True
                self._tell_dispatcher(started=True)
                if self._on_ready is not None:
                    self._on_ready()
                await stop.wait()
            finally:
                self._stopping = True
                for task in (restarting, announcing):  # no more restarts; no
                    if task is not None:  # new clients from other machines
                        task.cancel()
                self.view.note("stopping", namespace=self.options.namespace)
                await self._stop_all(kill_now)
                if self._relays:  # the children's last lines (a grandchild
                    # that kept their pipe open is not waited for long)
                    await asyncio.wait(self._relays, timeout=OUTPUT_DRAIN_S)
                for task in self._background:
                    task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the pool's task group, cancelled when it stops."""
        assert self._group is not None
        task = self._group.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- starting ------------------------------------------------------------

    async def _start_all(self) -> None:
        opts = self.options
        common = ["--namespace", opts.namespace]  # (and the descriptors: _start)
        if opts.discovery_url:
            common += ["--discovery", opts.discovery_url]
        host = ["--host", opts.host] if opts.host else []
        dispatcher = Child(
            "dispatcher",
            "pool.dispatcher.server",
            [
                *common,
                *host,
                *(("--port", str(opts.port)) if opts.port else ()),
                *(("--advertise", opts.advertise) if opts.advertise else ()),
                *(
                    ("--tls-cert", opts.tls[0], "--tls-key", opts.tls[1])
                    if opts.tls
                    else ()
                ),
                *("--no-worker-timeout-s", str(opts.no_worker_timeout_s)),
                *("--max-queued", str(opts.max_queued)),
                *(("--tls-ca", opts.tls_ca) if opts.tls_ca else ()),
            ],
        )
        self._dispatcher = dispatcher
        worker_argv = [
            *common,
            *host,
            *("--concurrency", str(opts.concurrency)),
            *("--grace-s", str(opts.grace_s)),
            *("--max-args-bytes", str(opts.max_args_bytes)),
        ]
        if opts.tags:
            worker_argv += ["--tags", ",".join(opts.tags)]
        for path in opts.paths:
            worker_argv += ["--path", path]
        if opts.reload:
            worker_argv.append("--reload")
        if opts.tls and opts.host:  # the dispatcher's certificate, theirs too
            worker_argv += ["--tls-cert", opts.tls[0], "--tls-key", opts.tls[1]]
        self._workers = [
            Child(f"worker-{i}", "workers.process", worker_argv)
            for i in range(opts.workers)
        ]
        # All at once: workers need only the registry and the token, and the
        # dispatcher finds them in the registry whenever it comes up. A worker
        # that fails to start is retried like any dead worker; a dispatcher
        # that fails ends `pool up` (its trouble is most likely the setup).
        async with asyncio.TaskGroup() as starting:
            starting.create_task(self._start(dispatcher))
            for child in self._workers:
                starting.create_task(self._start_or_retry(child))

    async def _start_or_retry(self, child: Child) -> None:
        try:
            await self._start(child)
        except ChildFailed as exc:
            self.view.note("start-failed", name=child.name, error=str(exc))
            self._spawn(self._watch(child))

    async def _start(self, child: Child) -> None:
        """Start a child, wait for its READY line, and watch it from then on."""
        child.ready = {}
        ready_read, ready_write = os.pipe()
        fds = {"--ready-fd": ready_write, "--parent-fd": self._parent_fd}
        control_read = output_read = -1
        if child is self._dispatcher:
            control_read, control_write = os.pipe()
            self._replace_control(control_write)
            fds["--control-fd"] = control_read
        if self.options.capture_output:
            output_read, fds["--output-fd"] = os.pipe()
        try:
            process = await self._fork_or_spawn(child, fds)
        except BaseException:
            if output_read >= 0:
                os.close(output_read)
            raise
        finally:
            for fd in (ready_write, control_read, fds.get("--output-fd", -1)):
                if fd >= 0:
                    os.close(fd)
        if output_read >= 0:
            relay = self._spawn(self._relay(output_read, child.label, process.pid))
            self._relays.add(relay)
            relay.add_done_callback(self._relays.discard)
        child.process = process
        try:
            child.ready = await read_ready(ready_read, process, child.name)
        except BaseException:
            process.kill()
            await process.wait()
            raise
        self._registry_changed.set()  # _until_registered looks again
        if child is self._dispatcher:  # a restarted one may listen elsewhere
            self.address = child.ready["address"]
            self.remote = rendezvous.Announced(
                child.ready.get("remote", self.address), bool(child.ready.get("tls"))
            )
            _write_private(self.options.namespace, ADDRESS_FILE, self.address)
            if self._ready:
                self._tell_dispatcher(started=True)
        self.view.note(f"{child.kind}-started", pid=process.pid)
        self._spawn(self._watch(child))

    async def _relay(self, fd: int, name: str, pid: int) -> None:
        """Show what a child writes, line by line, until it closes its end."""
        try:
            async for text in output_lines(fd):
                self.view.output(name, pid, text)
        finally:
            os.close(fd)

    async def _fork_or_spawn(self, child: Child, fds: dict[str, int]) -> Process:
        """Fork the child from the zygote; while it is down, start a fresh
        interpreter instead (slower, and otherwise the same)."""
        if self._zygote is not None and self._zygote.ready:
            try:
                return await self._zygote.spawn(f"{child.module}:main", child.argv, fds)
            except ZygoteUnavailable as exc:
                self.view.note("zygote-failed", name=child.name, error=str(exc))
        argv = [sys.executable, "-m", child.module, *child.argv]
        for option, fd in fds.items():
            argv += [option, str(fd)]
        return spawn(argv, pass_fds=list(fds.values()))

    def _replace_control(self, write_fd: int) -> None:
        if self._control_fd >= 0:
            os.close(self._control_fd)
        os.set_blocking(write_fd, False)
        self._control_fd = write_fd

    def _tell_dispatcher(self, **order: Any) -> None:
        """One control line to the dispatcher; dropped if it is not reading."""
        if self._control_fd < 0:
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self._control_fd, (json.dumps(order) + "\n").encode())

    async def _watch(self, child: Child) -> None:
        """Reap the child when it exits; replace it unless stopping."""
        assert child.process is not None
        code = await child.process.wait()
        self.view.note(f"{child.kind}-exited", pid=child.pid, **exit_fields(code))
        if child is not self._dispatcher:
            self._tell_dispatcher(
                exit={"pid": child.pid, "status": describe_exit(code)}
            )
        if self._stopping:
            return
        if not self.options.restart:
            self.view.note(f"{child.kind}-not-replaced", pid=child.pid)
            return
        # Back off only for a child that dies before it is ready: one killed
        # after it served is replaced at once.
        child.failures = 0 if child.ready else child.failures + 1
        await asyncio.sleep(restart_delay(child.failures))  # the back-off itself
        if self._stopping:
            return
        try:
            await self._start(child)
        except ChildFailed as exc:
            self.view.note("start-failed", name=child.name, error=str(exc))
            self._spawn(self._watch(child))

    # -- following -----------------------------------------------------------

    async def _follow(self) -> None:
        events = backends.subscriber_for(
            self.options.namespace, self.options.discovery_url
        )
        async for event in events:
            info = event.worker_info
            uid = str(info.uid)
            if event.type == "worker-dropped":
                self._status.pop(uid, None)
            else:
                was = self._status.get(uid)
                self._status[uid] = info.status
                if info.status == "stuck" and was != "stuck":
                    self._spawn(self._replace_if_stuck(uid, info.pid))
            self._registry_changed.set()
            self.view.event(event)

    async def _replace_if_stuck(self, uid: str, pid: int) -> None:
        """Stop a worker still stuck after the grace period (it is replaced)."""
        await asyncio.sleep(self.options.stuck_grace_s)  # the grace period
        if self._stopping or self._status.get(uid) != "stuck":
            return
        for child in self._workers:
            if child.pid == pid and child.process is not None:
                self.view.note("worker-stuck", pid=pid, uid=uid[:8])
                await terminate([child.process], self.options.grace_s, asyncio.Event())

    async def _until_registered(self) -> None:
        """Wait until every worker is ready and this view has seen it added."""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while not all(
                    c.ready and c.ready["uid"] in self._status for c in self._workers
                ):
                    await self._registry_changed.wait()
                    self._registry_changed.clear()
        except TimeoutError:
            late = sum(1 for c in self._workers if not c.ready)
            raise ChildFailed(
                f"{late} of {len(self._workers)} workers were not ready within "
                f"{START_TIMEOUT_S:g} s; see the errors above"
            ) from None

    # -- stopping ------------------------------------------------------------

    async def _stop_all(self, kill_now: asyncio.Event) -> None:
        """Drain: the dispatcher first hears of it, then the workers finish,
        then the dispatcher delivers the last results and stops."""
        self._tell_dispatcher(drain=True)
        workers = [c.process for c in self._workers if c.process is not None]
        await terminate(workers, self.options.grace_s + 5, kill_now)
        if self._dispatcher is None or self._dispatcher.process is None:
            return
        if kill_now.is_set():
            grace_s, hurry = HURRIED_DISPATCHER_STOP_S, asyncio.Event()
        else:
            grace_s, hurry = DISPATCHER_STOP_S, kill_now
        await terminate([self._dispatcher.process], grace_s, hurry)


def restart_delay(failures: int) -> float:
    """Seconds before restarting a child that failed to start ``failures``
    times in a row: none for the first restart, then 0.1 s doubling to 10 s."""
    if failures <= 0:
        return 0.0
    first, cap = BACKOFF_S
    return float(min(cap, first * 2 ** (failures - 1)))


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The first error in a (nested) exception group, to report as itself."""
    first = group.exceptions[0]
    return _first_error(first) if isinstance(first, BaseExceptionGroup) else first


def _write_private(namespace: str, name: str, text: str) -> None:
    fd = paths.open_private_file(
        paths.namespace_dir(namespace) / name, os.O_WRONLY | os.O_TRUNC
    )
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
