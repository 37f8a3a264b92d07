"""A program that imports grpc before pool, runs an embedded pool and has
all its workers killed and replaced, again and again:
``python -X faulthandler -m tests.support.grpc_first``. Prints ``replaced N`` at the
end; a child that crashed before it could exec prints a fatal error."""

from __future__ import annotations

import os
import signal
import sys
from functools import partial

import grpc  # first, before pool sets GRPC_ENABLE_FORK_SUPPORT

from discovery import list_workers
from pool import Pool
from tests.support import sample_tasks
from tests.support.helpers import wait_until

WORKERS, ROUNDS = 4, 16


def main() -> None:
    assert grpc is not None
    with Pool(workers=WORKERS) as client:
        for _ in range(ROUNDS):  # gRPC busy in other threads as children start
            busy = client.map(sample_tasks.work, range(300))
            before = {w.pid for w in list_workers(client.namespace)}
            # All stopped first, then killed: a worker killed later than the
            # others could take their tasks meanwhile, and a task lost with
            # three workers fails (WorkerLost), which is not what this tests.
            for pid in before:
                os.kill(pid, signal.SIGSTOP)
            for pid in before:
                os.kill(pid, signal.SIGKILL)
            wait_until(partial(_replaced, client.namespace, before), timeout_s=30)
            assert list(busy) == [x * x for x in range(300)]
    print(f"replaced {WORKERS * ROUNDS}")
    sys.stdout.flush()


def _replaced(namespace: str, before: set[int]) -> bool:
    now = {w.pid for w in list_workers(namespace)}
    return len(now) == WORKERS and not now & before


if __name__ == "__main__":
    main()
