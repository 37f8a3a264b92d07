"""Helper processes for cross-process tests: ``python -m tests.support.agents ROLE NS``.

Each reads JSON commands on stdin, one a line, and answers JSON lines on
stdout; end of stdin means exit cleanly. Roles:

- ``publish NS [--create]``: publishes add/update/drop commands (creating
  the namespace first with ``--create``).
- ``subscribe NS [POLL_S]``: prints every event of the namespace.
- ``attach NS``: attaches as a non-owner and reports its child processes.
- ``churn NS COUNT``: adds and drops COUNT workers as fast as it can.
- ``hold NS``: takes a worker's liveness lock, then waits (to be killed).
- ``hold-lock NS``: takes the registry lock, then waits (to be stopped).
- ``die-writing NS PHASE LINE``: publishes a worker (PHASE ``add``) or an
  update of one it added first (PHASE ``update``) and SIGKILLs itself at
  line event LINE of the registry's slot write, or after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import uuid
from types import FrameType
from typing import Any

import uvloop

from discovery import DiscoveryEvent, LocalDiscovery, Publisher, Subscriber, WorkerInfo
from discovery.liveness import Liveness
from discovery.lock import RegistryLock
from discovery.registry import Registry
from tests.support.helpers import children_of


def say(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def event_json(event: DiscoveryEvent) -> dict[str, Any]:
    info = event.worker_info
    return {
        "kind": "event",
        "type": event.type,
        "uid": str(info.uid),
        "status": info.status,
        "version": info.version,
        "tags": sorted(info.tags),
    }


def info_of(command: dict[str, Any]) -> WorkerInfo:
    return WorkerInfo(
        uid=uuid.UUID(command["uid"]),
        address=command.get("address", "unix:/nowhere"),
        pid=os.getpid(),
        version=command.get("version", "1"),
        tags=frozenset(command.get("tags", ())),
        status=command.get("status", "ready"),
    )


async def commands() -> Any:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        yield json.loads(line)


async def publish(namespace: str, create: bool) -> None:
    with contextlib.ExitStack() as stack:
        if create:
            stack.enter_context(LocalDiscovery(namespace))
        async with Publisher(namespace) as publisher:
            say(kind="ready", pid=os.getpid())
            async for command in commands():
                try:
                    await publisher.publish(command["op"], info_of(command))
                except Exception as exc:
                    say(error=f"{type(exc).__name__}: {exc}")
                else:
                    say(kind="ok")


async def subscribe(namespace: str, poll_interval_s: float) -> None:
    stream = Subscriber(namespace, poll_interval=poll_interval_s).__aiter__()
    say(kind="ready", pid=os.getpid())
    async for event in stream:
        say(**event_json(event))


async def attach(namespace: str) -> None:
    with LocalDiscovery(namespace) as discovery:
        async with discovery.publisher:
            stream = discovery.subscriber.__aiter__()
            first = await anext(stream)
            say(
                kind="ready", first=event_json(first), children=children_of(os.getpid())
            )
            async for _ in commands():
                pass
            await stream.aclose()  # type: ignore[attr-defined]


async def hold_and_wait(namespace: str) -> None:
    """Take a worker's liveness lock, as a publisher does just before it
    writes the slot, and wait there (to be killed)."""
    uid = uuid.uuid4()
    Liveness.hold(namespace, uid)
    say(kind="ready", uid=str(uid))
    async for _ in commands():
        pass


async def die_writing(namespace: str, phase: str, line: int) -> None:
    """Die by SIGKILL at the ``line``-th line run inside the registry's slot
    write (a write has fewer: then just after it)."""
    info = WorkerInfo(uuid.uuid4(), "unix:/torn", os.getpid(), "1", extra={"a": "b"})
    async with Publisher(namespace) as publisher:
        if phase == "update":
            await publisher.publish("worker-added", info)
        say(kind="ready", uid=str(info.uid))
        await anext(commands())  # go
        writing = {Registry.write_slot.__code__, Registry._bump.__code__}
        lines = 0

        def in_write(frame: FrameType, event: str, arg: object) -> Any:
            nonlocal lines
            if event == "line":
                lines += 1
                if lines > line:
                    os.kill(os.getpid(), signal.SIGKILL)
            return in_write

        def on_call(frame: FrameType, event: str, arg: object) -> Any:
            return in_write if frame.f_code in writing else None

        sys.settrace(on_call)
        if phase == "add":
            await publisher.publish("worker-added", info)
        else:
            await publisher.publish(
                "worker-updated", dataclasses.replace(info, extra={})
            )
        sys.settrace(None)
        os.kill(os.getpid(), signal.SIGKILL)


async def hold_lock(namespace: str) -> None:
    """Hold the registry lock until told to stop (or stopped for good)."""
    lock = RegistryLock(namespace)
    with lock.hold():
        say(kind="ready", pid=os.getpid())
        async for _ in commands():
            pass
    lock.close()


async def churn(namespace: str, count: int) -> None:
    async with Publisher(namespace) as publisher:
        say(kind="ready", pid=os.getpid())
        for _ in range(count):
            info = WorkerInfo(uuid.uuid4(), "unix:/churn", os.getpid(), "1")
            await publisher.publish("worker-added", info)
            await publisher.publish("worker-dropped", info)
        say(kind="done")
        async for _ in commands():
            pass


def main() -> None:
    role, namespace, *rest = sys.argv[1:]
    match role:
        case "publish":
            coro = publish(namespace, "--create" in rest)
        case "subscribe":
            coro = subscribe(namespace, float(rest[0]) if rest else 5.0)
        case "hold-lock":
            coro = hold_lock(namespace)
        case "attach":
            coro = attach(namespace)
        case "hold":
            coro = hold_and_wait(namespace)
        case "churn":
            coro = churn(namespace, int(rest[0]))
        case "die-writing":
            coro = die_writing(namespace, rest[0], int(rest[1]))
        case _:
            raise SystemExit(f"unknown role {role!r}")
    try:
        uvloop.run(coro)
    except Exception as exc:
        say(error=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
