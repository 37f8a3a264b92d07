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
import io
import os
import select
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import (
    context,
    forkserver,
    process,
    reduction,
    resource_tracker,
    util,
)
from pathlib import Path
from typing import Final

import setproctitle

from discovery import paths
from discovery.liveness import pid_namespace

PRELOAD: Final = ["pool.supervisor.preload"]


# multiprocessing keeps the forkserver's socket in a temporary directory
# (``/tmp/pymp-*``), removed at exit, and left behind by a process that is
# killed. This process's goes in the runtime directory instead, named after
# its pid namespace and pid, and the next pool to start removes those of
# dead processes.
TEMP_PREFIX: Final = "mp-"


def temp_dir_of(pid: int) -> Path:
    """The temporary directory :func:`use_private_temp_dir` gives process
    ``pid`` (of this pid namespace)."""
    return paths.runtime_dir() / f"{TEMP_PREFIX}{pid_namespace()}-{pid}"


def use_private_temp_dir() -> None:
    """Give this process's ``multiprocessing`` a temporary directory in the
    runtime directory, unless it has one already; it is removed at exit."""
    config = process.current_process()._config  # type: ignore[attr-defined]
    if config.get("tempdir") is not None:
        return
    path = temp_dir_of(os.getpid())
    path.mkdir(mode=0o700, exist_ok=True)
    config["tempdir"] = str(path)
    # As multiprocessing registers its own: after every other finalizer.
    util.Finalize(None, _remove_temp_dir, args=(str(path),), exitpriority=-100)


def _remove_temp_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if (current := process.current_process()) is not None:
        current._config["tempdir"] = None  # type: ignore[attr-defined]


def sweep_temp_dirs() -> None:
    """Remove the temporary directories of dead processes (see
    :func:`use_private_temp_dir`). Never raises."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(paths.runtime_dir()):
            name = entry.name
            if not name.startswith(TEMP_PREFIX) or not entry.is_dir(
                follow_symlinks=False
            ):
                continue
            pidns, _, pid = name[len(TEMP_PREFIX) :].partition("-")
            # (Another pid namespace's, such as a container's, is not ours to
            # judge.)
            if pidns == str(pid_namespace()) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ZygoteUnavailable(RuntimeError):
    """The zygote is not running; start the process the slow way."""


class Forked:
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

    async def wait(self) -> int:
        """Wait for the child to exit; its status."""
        return await asyncio.shield(self._exit)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the child has exited."""
        if self._returncode is None and self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

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
            probe = await self._fork(None, [], {})
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

    async def spawn(
        self, entry: str, argv: Sequence[str], fds: Mapping[str, int]
    ) -> Forked:
        """Fork a child that runs ``entry`` (``"module:function"``, called
        with ``argv`` plus ``OPTION FD`` for each of ``fds``; its return value
        is the exit status). ``fds`` stay open here; the child gets copies.

        :raises ZygoteUnavailable: if the zygote is not running.
        """
        if not self.ready or _exited(self._pidfd):
            # (Asking a dead forkserver would start another in its place, and
            # wait for its imports.)
            self.ready = False
            raise ZygoteUnavailable("the zygote is not running")
        try:
            return await self._fork(entry, argv, fds)
        except (OSError, EOFError) as exc:
            if _exited(self._pidfd):  # else this one failed, not the zygote
                self.ready = False  # (and watch starts another)
            raise ZygoteUnavailable(f"the zygote did not fork: {exc!r}") from exc

    async def _fork(
        self, entry: str | None, argv: Sequence[str], fds: Mapping[str, int]
    ) -> Forked:
        options = list(fds)
        pid, sentinel = await asyncio.to_thread(
            self._launch, (entry, list(argv), options), list(fds.values())
        )
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


def _enter(entry: str | None, argv: list[str], options: list[str]) -> None:
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
    for option, fd in zip(options, passed, strict=True):
        argv += [option, str(fd)]
    module, _, function = entry.partition(":")
    # What `ps` shows: the command that would have started it the slow way.
    setproctitle.setproctitle(shlex.join([sys.executable, "-m", module, *argv]))
    main = getattr(__import__(module, fromlist=[function]), function)
    sys.exit(main(argv))


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
