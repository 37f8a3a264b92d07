"""How fast a killed worker is seen dropped, and replaced.

    python -m benchmarks.crash [--kills 50] [--workers 4]

Starts ``python -m pool up`` and follows its namespace from this process
(a subscriber in another process than the workers and the supervisor).
Then, ``--kills`` times: SIGKILL a random worker, and time on the monotonic
clock (shared by every process) until this subscriber yields its
``worker-dropped``, and until its replacement's ``worker-added``. Prints
p50 and max of both over all kills, with the physical floor for the first
measured in the same run: a pidfd's wake-up after the SIGKILL of a child
that has a worker's imports, and of a small one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator

import uvloop

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from discovery import DiscoveryEvent, Subscriber


async def pidfd_floor(argv: list[str], samples: int = 30) -> list[float]:
    """SIGKILL of a child running ``argv`` (ready once it prints a line) to
    its pidfd becoming readable, in seconds. The kernel tears down the
    process's memory before it announces the death, so a bigger process has
    a higher floor."""
    loop = asyncio.get_running_loop()
    found = []
    for _ in range(samples):
        child = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE
        )
        assert child.stdout is not None
        await child.stdout.readline()
        fd = os.pidfd_open(child.pid)
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, readable.set_result, None)
        start = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        await readable
        found.append(time.monotonic() - start)
        loop.remove_reader(fd)
        os.close(fd)
        await child.wait()
    return found


SMALL = ["sh", "-c", "echo ready; exec sleep 60"]
LIKE_A_WORKER = [
    sys.executable,
    "-c",
    "import workers.process, pool.routing.placement; print('ready', flush=True); "
    "import time; time.sleep(60)",
]


async def next_of(
    events: AsyncIterator[DiscoveryEvent], kind: str, pid: int | None = None
) -> DiscoveryEvent:
    async with asyncio.timeout(30):
        while True:
            event = await anext(events)
            if event.type == kind and (pid is None or event.worker_info.pid == pid):
                return event


async def main(kills: int, workers: int) -> None:
    namespace = f"crash-{uuid.uuid4().hex[:8]}"
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pool", "up", "--namespace", namespace,
        "--workers", str(workers), stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    events = aiter(Subscriber(namespace))
    try:
        live: set[int] = set()
        while len(live) < workers:
            live.add((await next_of(events, "worker-added")).worker_info.pid)
        drops, replacements = [], []
        rng = random.Random(1)
        for _ in range(kills):
            victim = rng.choice(sorted(live))
            start = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            await next_of(events, "worker-dropped", victim)
            drops.append(time.monotonic() - start)
            added = await next_of(events, "worker-added")
            replacements.append(time.monotonic() - start)
            live.discard(victim)
            live.add(added.worker_info.pid)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        if supervisor.returncode is None:
            supervisor.send_signal(signal.SIGINT)
        if code := await supervisor.wait():
            print(f"pool up exited with {code}", file=sys.stderr)
    small, like_a_worker = await pidfd_floor(SMALL), await pidfd_floor(LIKE_A_WORKER)
    print(f"{kills} SIGKILLs of {workers} workers; times from the kill\n")
    _table(drops, replacements, like_a_worker, small)


def _table(*columns: list[float]) -> None:
    drops, replacements, like_a_worker, small = columns
    print("| measure | p50 ms | max ms |")
    print("|---|--:|--:|")
    for name, values in [
        ("worker-dropped at a subscriber in another process", drops),
        ("replacement registered (worker-added)", replacements),
        ("floor: pidfd after SIGKILL, a process as big as a worker", like_a_worker),
        ("floor: pidfd after SIGKILL, a small process (sleep)", small),
    ]:
        print(f"| {name} | {statistics.median(values) * 1e3:.2f} | "
              f"{max(values) * 1e3:.2f} |")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    uvloop.run(main(args.kills, args.workers))
