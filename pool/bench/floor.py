"""The round-trip floor for our shape: two raw grpc.aio hops, or one.

A client sends 64 bytes on a bidi stream to a *relay*, which forwards them
on a stream of its own to an *echo* server and sends the answer back: two
hops on unix sockets, each process on uvloop, as a task goes client →
dispatcher → worker. No protobuf, no pickling, no routing: what is left
of a no-op task's round trip when everything of ours is taken away. With
``hops=1`` the client talks to the echo server itself, as a task would go
straight to its worker.

``python -m pool.bench.floor echo|relay SOCKET [UPSTREAM]`` runs one server
(printing ``ready`` once it listens), and ``... client SOCKET SAMPLES`` the
client (printing its round trips); :func:`measure` starts them and times
``samples`` round trips in a row, the client too in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import uvloop
from grpc import aio

from pool.bench.proc import cpu_s
from workers.common import channels

METHOD = "/floor.Echo/Stream"
WARM_UP = 50  # round trips not timed
MESSAGE = b"x" * 64


def _handler(behaviour: Any) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "floor.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(behaviour)}
    )


async def _echo(
    requests: AsyncIterator[bytes], context: object
) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


async def serve(role: str, socket: str, upstream: str | None) -> None:
    server = aio.server()
    if role == "echo":
        server.add_generic_rpc_handlers((_handler(_echo),))
    else:
        channel = channels.channel(f"unix:{upstream}")
        forward: Any = channel.stream_stream(METHOD)

        async def relay(
            requests: AsyncIterator[bytes], context: object
        ) -> AsyncIterator[bytes]:
            call = forward()
            async for message in requests:
                await call.write(message)
                yield await call.read()
            await call.done_writing()

        server.add_generic_rpc_handlers((_handler(relay),))
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def _round_trips(socket: str, samples: int) -> list[float]:
    async with channels.channel(f"unix:{socket}") as channel:
        call: Any = channel.stream_stream(METHOD)()
        times = []
        for _ in range(samples + WARM_UP):
            started = time.perf_counter()
            await call.write(MESSAGE)
            await call.read()
            times.append(time.perf_counter() - started)
        await call.done_writing()
    return times[WARM_UP:]


def _client(socket: str, samples: int) -> tuple[list[float], float]:
    """The client's round trips (s) and CPU time (s), in a process of its
    own: gRPC's asyncio poller serves one loop a process, and the measuring
    process may run a client's loop already."""
    argv = [sys.executable, "-m", "pool.bench.floor", "client", socket, str(samples)]
    answer = json.loads(subprocess.run(argv, check=True, capture_output=True).stdout)
    return answer["times"], answer["cpu_s"]


async def _client_main(socket: str, samples: int) -> None:
    cpu = time.process_time()
    times = await _round_trips(socket, samples)
    print(json.dumps({"times": times, "cpu_s": time.process_time() - cpu}))


def measure(
    samples: int = 500, cpu: dict[str, float] | None = None, hops: int = 2
) -> list[float]:
    """Round trips through relay and echo (``hops=2``) or to echo alone
    (``hops=1``), in seconds, each server its own process; with ``cpu``,
    each process's CPU time per round trip (s) goes in it, as ``client``,
    ``relay`` (two hops) and ``echo``."""
    with tempfile.TemporaryDirectory(prefix="shmp-floor-") as directory:
        echo_socket = str(Path(directory) / "echo.sock")
        relay_socket = str(Path(directory) / "relay.sock")
        roles = [["echo", echo_socket], ["relay", relay_socket, echo_socket]]
        servers = []
        try:
            for argv in roles[:hops]:
                server = subprocess.Popen(
                    [sys.executable, "-m", "pool.bench.floor", *argv],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                servers.append(server)
                assert server.stdout is not None
                if server.stdout.readline().strip() != "ready":
                    raise RuntimeError("a floor server did not start")
            started = zip(roles[:hops], servers, strict=True)
            pids = {argv[0]: server.pid for argv, server in started}
            before = {name: cpu_s(pid) for name, pid in pids.items()}
            nearest = relay_socket if hops == 2 else echo_socket
            times, client_cpu_s = _client(nearest, samples)
            if cpu is not None:
                rounds = len(times) + WARM_UP
                cpu["client"] = client_cpu_s / rounds
                for name, pid in pids.items():
                    cpu[name] = (cpu_s(pid) - before[name]) / rounds
            return times
        finally:
            for server in servers:
                server.kill()
                server.wait()
                if server.stdout is not None:
                    server.stdout.close()


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    role, socket, *rest = sys.argv[1:]
    if role == "client":
        uvloop.run(_client_main(socket, int(rest[0])))
    else:
        uvloop.run(serve(role, socket, rest[0] if rest else None))
