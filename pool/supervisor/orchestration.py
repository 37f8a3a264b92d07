"""The supervisor: owns a namespace, its dispatcher and its workers.

:meth:`Supervisor.run` claims the namespace (``LocalDiscovery(exclusive=
True)``: a lock held for the pool's life), sweeps what dead pools of this
user left, creates the token, starts the dispatcher and the workers in
their own sessions (so a terminal's Ctrl-C reaches only the supervisor),
writes the dispatcher's address for clients (with ``discovery_url``, also
in Redis: :mod:`pool.client.rendezvous`), and shows every event through a
:class:`~pool.supervisor.view.View`.

Children are forked from a :class:`~pool.supervisor.zygote.Zygote` started
first thing; while it is down, they start as fresh interpreters. Each gets
a pidfd of the supervisor (``--parent-fd``) and exits when the supervisor
dies, however it dies. The dispatcher also gets a pipe only the supervisor
writes to (``--control-fd``): how each worker ended, when every worker has
started, when the pool drains, and when its initializer failed too often.
With ``capture_output`` (``pool up``), the children's stdout and stderr
come back through a pipe (``--output-fd``), shown prefixed by the child.

A child that dies is reaped at once and replaced (with exponential back-off
if it dies before it is ready), unless its initializer failed
:data:`~pool.supervisor.children.MAX_INITIALIZER_FAILURES` times in a row:
then no worker starts again, and the dispatcher fails every task with that
failure. A worker ``"stuck"`` for ``stuck_grace_s`` is stopped, so replaced.
With ``--dashboard``, a :mod:`pool.supervisor.dashboard` sees what the view
sees and the dispatcher's reports. When ``stop`` is set it drains: it tells
the dispatcher (which fails the tasks no worker has yet), SIGTERMs every
worker and gives them ``grace_s`` (cut short by ``kill_now``), SIGKILLs the
rest (and a replacement whose fork returns after that began), then stops
the dispatcher, which first delivers every result it has; the registry's
owner removes every file and segment. Its background work runs in one task
group: an unexpected error ends ``pool up`` (after the drain).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from typing import Any, Final

from discovery import LocalDiscovery, NamespaceInUse, paths, reap_registries, sweep_dead
from pool.client import announcements
from pool.client.rendezvous import ADDRESS_FILE
from pool.dispatcher import messages
from pool.errors import PoolAlreadyRunning
from pool.supervisor import dataplane
from pool.supervisor.children import (
    Child,
    ChildFailed,
    ChildPipes,
    InitializerFailedInChild,
    InitializerFailures,
    Process,
    describe_exit,
    exit_fields,
    kill,
    next_start,
    read_ready,
    stop_dispatcher,
    terminate,
)
from pool.supervisor.control import ControlPipe
from pool.supervisor.dashboard import dashboard_for, dashboard_key
from pool.supervisor.output import relay
from pool.supervisor.registrations import Registrations
from pool.supervisor.settings import PoolSettings
from pool.supervisor.view import Tee, View
from pool.supervisor.zygote import Zygote, ZygoteUnavailable, fork_or_spawn
from workers.common.offload import Offload
from workers.protocol import auth

OUTPUT_DRAIN_S: Final = 1.0
WORKER_ENTRY: Final = "workers.process:run"
DISPATCHER_ENTRY: Final = "pool.dispatcher.server:run"


class Supervisor:
    """Runs one pool; see the module docstring.

    :param on_ready: called once every worker is registered.
    """

    def __init__(
        self,
        settings: PoolSettings,
        view: View,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.dashboard = dashboard_for(
            settings.namespace,
            settings.dashboard,
            settings.discovery_url,
            (settings.tls_ca, settings.tls_cert, settings.tls_key),
        )
        self.view = Tee(view, self.dashboard.board) if self.dashboard else view
        self._on_ready = on_ready
        self.address = ""  # the dispatcher's, for this machine's clients
        self.remote = announcements.Announced("")  # for others, with --discovery
        self._stopping = False
        self._dispatcher: Child | None = None
        self._workers: list[Child] = []
        self._group: asyncio.TaskGroup | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._relays: set[asyncio.Task[None]] = set()  # children's output
        self._parent_fd = -1
        self._control = ControlPipe()  # to the current dispatcher
        self._registrations = Registrations(
            settings.namespace,
            settings.discovery_url,
            self.view,
            stuck_grace_s=settings.stuck_grace_s,
            spawn=self._spawn,
            on_stuck=self._replace_stuck,
            on_stats=self.dashboard.board.stats if self.dashboard else None,
        )
        self._zygote: Zygote | None = None
        self._offload = Offload("supervisor")  # the registry, sweeps
        self._ready = False  # every worker has been registered once
        self._inits = InitializerFailures()
        self._claimed = False  # the namespace is this pool's

    async def run(self, stop: asyncio.Event, kill_now: asyncio.Event) -> None:
        """Run the pool until ``stop``; drain; leave nothing behind.

        :raises PoolAlreadyRunning: if a live pool owns the namespace.
        :raises BaseExceptionGroup: of what ended the pool: a
            :class:`~pool.supervisor.children.ChildFailed` if the dispatcher,
            or every worker, cannot start, and any error of its background
            work, all of them (:func:`pool.errors.leaves` lists them).
        """
        settings = self.settings
        registry = LocalDiscovery(
            settings.namespace, capacity=settings.registry_capacity, exclusive=True
        )
        zygote = Zygote(self._zygote_news)
        entered = False
        try:
            await self._claim(registry, zygote)
            entered = True
            try:
                await self._prepare()
                await self._supervise(stop, kill_now)
            finally:
                await self._control.aclose()
                if self.dashboard is not None:
                    await self.dashboard.aclose()
                if self._parent_fd >= 0:
                    os.close(self._parent_fd)
        finally:
            if entered:
                await self._offload.run(registry.close)  # (works at exit, too)
            await self._offload.run(zygote.close)
            await self._offload.aclose()
        self.view.note("stopped", namespace=settings.namespace)

    async def _claim(self, registry: LocalDiscovery, zygote: Zygote) -> None:
        """Own the namespace, while the zygote starts (its imports take the
        longest). :raises PoolAlreadyRunning: if a live pool owns it."""
        owner = None
        async with asyncio.TaskGroup() as starting:
            starting.create_task(self._warm(zygote))
            try:
                await self._offload.run(registry.__enter__)  # may wait
            except NamespaceInUse as exc:
                owner = exc.pid
        if owner is not None:
            raise PoolAlreadyRunning(self.settings.namespace, owner)
        self._claimed = True  # (what the zygote says is shown from now on)
        if zygote.ready:
            self._zygote_news("ready", zygote.pid)

    def _zygote_news(self, what: str, pid: int) -> None:
        if self._claimed:
            self.view.note(f"zygote-{what}", pid=pid)

    async def _prepare(self) -> None:
        """What the children need: other pools' leftovers gone, the token,
        and a pidfd of this process, whose end ends them."""
        await self._offload.run(sweep_dead)  # (this runtime directory's pools)
        await self._offload.run(reap_registries)  # (any other's)
        await dataplane.prepare(self._offload, self.settings)
        namespace, token_file = self.settings.namespace, self.settings.token_file
        token = await self._offload.run(auth.pool_token, namespace, token_file)
        if self.dashboard is not None:
            key_file = self.settings.dashboard_key_file
            key = await self._offload.run(dashboard_key, key_file)
            await self.dashboard.start(token, key, here=lambda: self.remote.address)
        self._parent_fd = os.pidfd_open(os.getpid())

    async def _warm(self, zygote: Zygote) -> None:
        """Start the zygote; without it, children start the slow way."""
        try:
            await zygote.start()
        except ZygoteUnavailable as exc:
            self.view.note("zygote-failed", error=str(exc))
        self._zygote = zygote

    async def _supervise(self, stop: asyncio.Event, kill_now: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            self._spawn(self._registrations.follow())
            self._spawn(dataplane.reap_every(self._offload, self.settings.namespace))
            restarting = announcing = None
            if self._zygote is not None:
                restarting = self._spawn(self._zygote.watch())
            try:
                await self._start_all()
                broken = lambda: self._inits.broken is not None  # noqa: E731
                await self._registrations.until_registered(self._workers, broken)
                if self.settings.discovery_url:  # for clients of other machines
                    announced = asyncio.Event()
                    announcing = self._spawn(
                        announcements.announce(
                            self.settings.discovery_url,
                            self.settings.namespace,
                            lambda: self.remote,
                            announced,
                        )
                    )
                    await announced.wait()  # findable once it says "ready"
                await self._say_ready()
                await stop.wait()
            finally:
                self._stopping = True
                for task in (restarting, announcing):  # no more restarts; no
                    if task is not None:  # new clients from other machines
                        task.cancel()
                self.view.note("stopping", namespace=self.settings.namespace)
                await self._stop_all(kill_now)
                await dataplane.reap(self._offload, self.settings.namespace)
                if self._relays:  # the children's last lines (not for long)
                    await asyncio.wait(self._relays, timeout=OUTPUT_DRAIN_S)
                for task in self._background:
                    task.cancel()

    async def _say_ready(self) -> None:
        """Every worker is registered: say so, to all who wait for it."""
        ready: dict[str, Any] = {"namespace": self.settings.namespace}
        started = sum(1 for child in self._workers if child.ready)  # (0 if broken)
        ready.update(workers=started, address=self.address)
        if self.settings.paths:
            ready["path"] = ":".join(self.settings.paths)
        if self.dashboard is not None:
            ready["dashboard"] = self.dashboard.url
        self.view.note("ready", **ready)
        self._ready = True
        await self._control.send(messages.Started())
        if self._on_ready is not None:
            self._on_ready()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the pool's task group, cancelled when it stops."""
        assert self._group is not None
        task = self._group.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- starting ------------------------------------------------------------

    async def _start_all(self) -> None:
        settings = self.settings
        dispatcher = Child("dispatcher", DISPATCHER_ENTRY, settings.dispatcher())
        self._dispatcher = dispatcher
        worker = settings.worker()
        self._workers = [
            Child(f"worker-{i}", WORKER_ENTRY, worker) for i in range(settings.workers)
        ]
        # All at once (the dispatcher finds workers whenever it comes up). A
        # worker that fails is retried; a dispatcher that fails ends the pool.
        async with asyncio.TaskGroup() as starting:
            starting.create_task(self._start(dispatcher))
            for child in self._workers:
                starting.create_task(self._start_or_retry(child))

    async def _start_or_retry(self, child: Child) -> None:
        try:
            await self._start(child)
        except ChildFailed as exc:
            await self._start_failed(child, exc)

    async def _start_failed(self, child: Child, exc: ChildFailed) -> None:
        """Say why, and watch it (it is restarted); a pool whose initializer
        fails too often is broken: its dispatcher fails every task."""
        self.view.note("start-failed", name=child.name, error=str(exc))
        if isinstance(exc, InitializerFailedInChild) and self._inits.failed(
            exc.failure
        ):
            self.view.note("initializer-failed", error=str(exc), restarts="stopped")
            await self._control.send(messages.Broken(exc.failure))
            self._registrations.changed.set()  # (the pool is as ready as it gets)
        self._spawn(self._watch(child))

    async def _start(self, child: Child) -> None:
        """Start a child, wait for its READY line, and watch it from then on."""
        child.ready = {}
        process, ready_fd = await self._fork(child)
        child.process = process
        if self._stopping:  # (forked once _stop_all had listed whom to stop)
            os.close(ready_fd)
            return await kill(process)
        try:
            child.ready = await read_ready(ready_fd, process, child.name)
        except BaseException:
            await kill(process)
            raise
        if child is not self._dispatcher:
            self._inits.succeeded()
        self._registrations.changed.set()  # (it looks again)
        if child is self._dispatcher:
            await self._dispatcher_ready(child.ready)
        self.view.note(f"{child.kind}-started", name=child.name, pid=process.pid)
        self._spawn(self._watch(child))

    async def _fork(self, child: Child) -> tuple[Process, int]:
        """Fork ``child`` with its pipes, and follow what it reports and
        prints: the process, and the pipe of its READY line (to be read)."""
        pipes = ChildPipes.open(
            self._parent_fd,
            dispatcher=child is self._dispatcher,
            output=self.settings.capture_output,
        )
        if pipes.control >= 0:
            await self._control.attach(pipes.control)
        try:
            process = await fork_or_spawn(self._zygote, child, pipes.given, self.view)
        except BaseException:
            pipes.close_kept()
            raise
        finally:
            pipes.close_given()
        if pipes.report >= 0:
            self._spawn(self._registrations.follow_links(pipes.report))
        if pipes.output >= 0:
            show = functools.partial(self.view.output, child.label, process.pid)
            relaying = self._spawn(relay(pipes.output, show))
            self._relays.add(relaying)
            relaying.add_done_callback(self._relays.discard)
        return process, pipes.ready

    async def _dispatcher_ready(self, ready: dict[str, Any]) -> None:
        """Where clients find the dispatcher (a restarted one may listen
        elsewhere), and what it must know of a pool that has started."""
        self.address = ready["address"]
        self.remote = announcements.Announced(
            ready.get("remote", self.address), bool(ready.get("tls"))
        )
        namespace = self.settings.namespace
        await self._offload.run(
            paths.write_private, namespace, ADDRESS_FILE, self.address
        )
        if self._ready:
            await self._control.send(messages.Started())
        if self._inits.broken is not None:
            await self._control.send(messages.Broken(self._inits.broken))

    async def _watch(self, child: Child) -> None:
        """Reap the child when it exits; replace it unless stopping."""
        assert child.process is not None
        code = await child.process.wait()
        self.view.note(f"{child.kind}-exited", pid=child.pid, **exit_fields(code))
        if child is not self._dispatcher:
            await self._control.send(messages.Exited(child.pid, describe_exit(code)))
        restart = self.settings.restart and self._inits.broken is None
        delay = next_start(child, restart=restart, stopping=self._stopping)
        if delay is None:
            if not self._stopping:
                self.view.note(f"{child.kind}-not-replaced", pid=child.pid)
            return
        await asyncio.sleep(delay)  # the back-off itself
        if self._stopping:
            return
        try:
            await self._start(child)
        except ChildFailed as exc:
            await self._start_failed(child, exc)

    # -- following -----------------------------------------------------------

    async def _replace_stuck(self, uid: str, pid: int) -> None:
        """Stop a worker stuck past its grace (it is replaced then)."""
        for child in self._workers:
            if child.pid == pid and child.process is not None and not self._stopping:
                await terminate([child.process], self.settings.grace_s, asyncio.Event())

    # -- stopping ------------------------------------------------------------

    async def _stop_all(self, kill_now: asyncio.Event) -> None:
        """Drain: the dispatcher first hears of it, then the workers finish,
        then the dispatcher delivers the last results and stops."""
        await self._control.send(messages.Drain())
        workers = [c.process for c in self._workers if c.process is not None]
        await terminate(workers, self.settings.grace_s + 5, kill_now)
        if self._dispatcher is not None and self._dispatcher.process is not None:
            await stop_dispatcher(self._dispatcher.process, kill_now)
