"""Starting the supervisor's children, hearing them say READY, and ending them.

Children are usually forked by the zygote (:mod:`pool.supervisor.zygote`); :func:`spawn`
is the slow way, used while the zygote is down: a fresh interpreter,
started with :class:`subprocess.Popen`, which on Linux
execs through ``vfork``: no ``pthread_atfork`` handler runs in between.
The event loop's own spawn (libuv's ``fork``) runs them, and gRPC registers
handlers whenever it was imported before ``GRPC_ENABLE_FORK_SUPPORT=0`` was
set, as in a program that imports grpc before pool; such children crashed
before they could exec. A child's exit is awaited on a pidfd, so any number
of coroutines may wait for it. Caller: the supervisor
(:mod:`pool.supervisor.orchestration`), on its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any, Final, Protocol

from pool.errors import PoolError
from workers.serving import READY_PREFIX

START_TIMEOUT_S: Final = 30.0


class ChildFailed(PoolError):
    """A child process exited or hung before it was ready."""


class Process(Protocol):
    """A child process: started the slow way (:class:`Spawned`) or forked by
    the zygote (:class:`pool.supervisor.zygote.Forked`)."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, signum: int) -> None: ...

    def kill(self) -> None: ...


class Spawned:
    """A child process started by :func:`spawn`; reaped once it exits."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = self._loop.create_future()
        self._fd = os.pidfd_open(popen.pid)  # our unreaped child: never reused
        self._loop.add_reader(self._fd, self._on_exit)

    @property
    def returncode(self) -> int | None:
        """The exit status once it has been reaped (``-N`` for signal N)."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the child to exit; its status."""
        return await asyncio.shield(self._exit)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the child has been reaped."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._exit.set_result(self._popen.wait())  # exited: returns at once


def spawn(argv: Sequence[str], *, pass_fds: Sequence[int] = ()) -> Spawned:
    """Start ``argv`` in a session of its own, stdin from /dev/null, and
    stdout and stderr shared with this process."""
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
    )
    return Spawned(popen)


async def read_ready(fd: int, process: Process, name: str) -> dict[str, Any]:
    """The READY line a child writes to ``fd`` (which this closes).

    :raises ChildFailed: if it exits first, or says nothing in time.
    """
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
    raise ChildFailed(f"{name} exited before it was ready ({describe_exit(code)})")


async def terminate(
    processes: Sequence[Process], grace_s: float, kill_now: asyncio.Event
) -> None:
    """SIGTERM, wait up to ``grace_s`` (or until ``kill_now``), SIGKILL, reap."""
    alive = [p for p in processes if p.returncode is None]
    for process in alive:
        process.send_signal(signal.SIGTERM)
    async with asyncio.TaskGroup() as group:
        exited = group.create_task(_wait_all(alive))
        hurry = group.create_task(kill_now.wait())
        await asyncio.wait(
            {exited, hurry}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
        )
        hurry.cancel()
        for process in alive:
            process.kill()


async def _wait_all(processes: Sequence[Process]) -> None:
    for process in processes:
        await process.wait()


def describe_exit(code: int) -> str:
    """How a child ended, in words: ``exit code 3``, ``killed by SIGKILL``."""
    return (
        f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    )


def exit_fields(code: int) -> dict[str, Any]:
    """How a child ended, as fields of a view line."""
    return {"signal": signal.Signals(-code).name} if code < 0 else {"code": code}
