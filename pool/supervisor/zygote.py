"""The zygote: a pre-imported interpreter every pool process is forked from.

:class:`Zygote` runs one ``multiprocessing`` forkserver of its own (a
:class:`multiprocessing.forkserver.ForkServer`, not the module's shared one,
so a program's own forkserver and its preload list are left alone). The
forkserver is a fresh interpreter that imports :mod:`pool.supervisor.preload`
(grpc, protobuf, uvloop, the worker and the dispatcher, with
``GRPC_ENABLE_FORK_SUPPORT=0``) and creates no gRPC object, loop, thread
or lock. Each child it forks then runs :func:`_enter`, which, before
anything else, closes every descriptor it was not given, drops the
forkserver's and the resource tracker's descriptors from ``multiprocessing``'s
books, and starts its own session; only then does the worker's or the
dispatcher's ``main`` create its loop, its locks and its server.

Unlike ``ProcessPoolExecutor``, the caller's ``__main__`` is not imported
again in the child: a pool process runs our code, and needs no
``if __name__ == "__main__"`` guard in the user's script. It does get the
caller's ``sys.path`` and working directory.

A child forked this way is not ours to reap: the forkserver reaps it and
writes its exit status to a pipe (the *sentinel*) that :class:`Forked`
watches; signals go through a pidfd opened as soon as the pid is known, so
they never reach a reused pid. Caller: :mod:`pool.supervisor.orchestration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import select
import shlex
import signal
import sys
from collections.abc import Callable, Mapping
from multiprocessing import context, forkserver, process, reduction, resource_tracker
from typing import Any, Final

import setproctitle

from pool.supervisor.children import Child, ChildProcess, Process, spawn
from pool.supervisor.sweep import use_private_temp_dir
from workers.common.spec import to_argv

PRELOAD: Final = ["pool.supervisor.preload"]


class ZygoteUnavailable(RuntimeError):
    """The zygote is not running; start the process the slow way."""


class Forked(ChildProcess):
    """A process the zygote forked for us: signalled through a pidfd, and
    its exit status read from the forkserver's sentinel pipe."""

    def __init__(self, pid: int, sentinel: int) -> None:
        self.pid = pid
        self._loop = asyncio.get_running_loop()
        self._sentinel = sentinel
        self._returncode: int | None = None
        self._exit: asyncio.Future[int] = self._loop.create_future()
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already: its status is on the way
            self._pidfd = -1
        self._loop.add_reader(sentinel, self._on_status)

    @property
    def returncode(self) -> int | None:
        """The exit status once known (``-N`` for signal N)."""
        return self._returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the child has exited."""
        if self._returncode is None and self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def _on_status(self) -> None:
        self._loop.remove_reader(self._sentinel)
        try:
            code = forkserver.read_signed(self._sentinel)
        except (OSError, EOFError):
            # The forkserver died before it reaped the child: wait on the
            # pidfd instead; how the child ended is not known.
            code = 255
            if self._pidfd >= 0 and not _exited(self._pidfd):
                self._loop.add_reader(self._pidfd, self._on_orphan_exit)
                return
        self._finish(code)

    def _on_orphan_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        self._finish(255)

    def _finish(self, code: int) -> None:
        os.close(self._sentinel)
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        self._returncode = code
        self._exit.set_result(code)


class Zygote:
    """One forkserver with :data:`PRELOAD` imported; see the module docstring.

    ``ready`` is true from a successful :meth:`start` until the forkserver is
    seen dead (:meth:`watch` then starts another).
    """

    def __init__(self, on_change: Callable[[str, int], None] = lambda *_: None) -> None:
        """:param on_change: called with ``("ready", pid)`` each time a
        forkserver is warm and ``("exited", pid)`` when one is seen dead."""
        self._server = forkserver.ForkServer()
        self._server.set_forkserver_preload(PRELOAD)
        self._on_change = on_change
        self.ready = False
        self.pid = 0
        self._pidfd = -1  # of the running forkserver

    async def start(self) -> None:
        """Start the forkserver and wait until it forks (its imports done).

        :raises ZygoteUnavailable: if it cannot start or fork.
        """
        try:
            use_private_temp_dir()
            await asyncio.to_thread(self._server.ensure_running)
            self.pid = self._server._forkserver_pid or 0  # type: ignore[attr-defined]
            self._close_pidfd()
            self._pidfd = os.pidfd_open(self.pid)
            probe = await self._fork(None, None, {})
        except (OSError, EOFError, ValueError) as exc:
            raise ZygoteUnavailable(f"the zygote did not start: {exc}") from exc
        code = await probe.wait()
        if code != 0:
            raise ZygoteUnavailable(f"the zygote's first child exited with {code}")
        self.ready = True
        self._on_change("ready", self.pid)

    async def watch(self) -> None:
        """Restart the forkserver whenever it dies, until cancelled."""
        delay = 0.1
        while True:
            if self.ready:
                await _readable(self._pidfd)
                self.ready = False  # meanwhile, children start the slow way
                self._on_change("exited", self.pid)
            with contextlib.suppress(ZygoteUnavailable):
                await self.start()
                delay = 0.1
                continue
            await asyncio.sleep(delay)  # the back-off itself
            delay = min(delay * 2, 10.0)

    async def spawn(self, entry: str, settings: Any, fds: Mapping[str, int]) -> Forked:
        """Fork a child that runs ``entry`` (``"module:function"``, called
        with ``settings``, a dataclass, whose fields named in ``fds`` are set
        to the child's copies of those descriptors; its return value is the
        exit status). ``fds`` stay open here.

        :raises ZygoteUnavailable: if the zygote is not running.
        """
        if not self.ready or _exited(self._pidfd):
            # (Asking a dead forkserver would start another in its place, and
            # wait for its imports.)
            self.ready = False
            raise ZygoteUnavailable("the zygote is not running")
        try:
            return await self._fork(entry, settings, fds)
        except (OSError, EOFError) as exc:
            if _exited(self._pidfd):  # else this one failed, not the zygote
                self.ready = False  # (and watch starts another)
            raise ZygoteUnavailable(f"the zygote did not fork: {exc!r}") from exc

    async def _fork(
        self, entry: str | None, settings: Any, fds: Mapping[str, int]
    ) -> Forked:
        launch = asyncio.ensure_future(
            asyncio.to_thread(
                self._launch, (entry, settings, list(fds)), list(fds.values())
            )
        )
        try:
            pid, sentinel = await asyncio.shield(launch)
        except asyncio.CancelledError:
            # The thread still sends ``fds``, which the caller closes once
            # this returns; a child it forks now has no owner: kill it.
            while not launch.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([launch])
            if not launch.cancelled() and launch.exception() is None:
                Forked(*launch.result()).kill()
            raise
        return Forked(pid, sentinel)

    def _launch(self, args: tuple[object, ...], fds: list[int]) -> tuple[int, int]:
        """Ask the forkserver for a child (blocking): its pid and sentinel."""
        child = context.ForkServerProcess(target=_enter, args=args, name="shmpool")
        data = io.BytesIO()
        context.set_spawning_popen(self)  # type: ignore[arg-type]  # (the authkey)
        try:
            reduction.dump(_preparation(), data)
            reduction.dump(child, data)
        finally:
            context.set_spawning_popen(None)
        sentinel, write = self._server.connect_to_new_process(fds)
        try:
            with open(write, "wb", closefd=True) as pipe:
                pipe.write(data.getbuffer())
            return forkserver.read_signed(sentinel), sentinel
        except BaseException:
            os.close(sentinel)
            raise

    def close(self) -> None:
        """Stop the forkserver (blocking; children it forked keep running)."""
        self.ready = False
        self._close_pidfd()
        with contextlib.suppress(OSError, ChildProcessError):
            self._server._stop()  # type: ignore[attr-defined]

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def _preparation() -> dict[str, object]:
    """What ``multiprocessing.spawn.prepare`` sets up in the child: this
    process's import path and directory, and no ``__main__`` to re-run."""
    origin = process.ORIGINAL_DIR  # type: ignore[attr-defined]
    sys_path = [origin if p == "" else p for p in sys.path]
    return {
        "name": "shmpool",
        "authkey": process.current_process().authkey,
        "sys_path": sys_path,
        "dir": os.getcwd(),
        "orig_dir": origin,
    }


def _enter(entry: str | None, settings: Any, fields: list[str]) -> None:
    """In the forked child: shed what it inherited, then run ``entry``."""
    passed = forkserver.get_inherited_fds() or []
    keep = {0, 1, 2, *passed}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            with contextlib.suppress(OSError):  # (listdir's own, now closed)
                os.close(int(name))
    null = os.open(os.devnull, os.O_RDONLY)  # stdin: not the zygote's
    os.dup2(null, 0)
    os.close(null)
    # multiprocessing's books still name what was just closed.
    forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
    forkserver._forkserver._inherited_fds = None  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._fd = None  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._pid = None  # type: ignore[attr-defined]
    os.setsid()
    if entry is None:  # the probe that tells the zygote is warm
        return
    settings = dataclasses.replace(settings, **dict(zip(fields, passed, strict=True)))
    module, _, function = entry.partition(":")
    # What `ps` shows: the command that would have started it the slow way.
    title = [sys.executable, "-m", module, *to_argv(settings)]
    setproctitle.setproctitle(shlex.join(title))
    run = getattr(__import__(module, fromlist=[function]), function)
    sys.exit(run(settings))


def _exited(pidfd: int) -> bool:
    """Whether the process ``pidfd`` names has exited (without waiting)."""
    return bool(select.select([pidfd], [], [], 0)[0])


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def fork_or_spawn(
    zygote: Zygote | None, child: Child, fds: dict[str, int], view: Any
) -> Process:
    """Fork ``child`` from ``zygote``; while it is down, start a fresh
    interpreter instead (slower, and otherwise the same). ``view`` is told
    of a fork that failed."""
    if zygote is not None and zygote.ready:
        try:
            return await zygote.spawn(child.entry, child.settings, fds)
        except ZygoteUnavailable as exc:
            view.note("zygote-failed", name=child.name, error=str(exc))
    return spawn(child.argv(fds), pass_fds=list(fds.values()))
