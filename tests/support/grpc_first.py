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

WORKERS, KILLED, ROUNDS = 4, 2, 32


def main() -> None:
    assert grpc is not None
    with Pool(workers=WORKERS) as client:
        for _ in range(ROUNDS):  # gRPC busy in other threads as children start
            busy = client.map(sample_tasks.work, range(300))
            killed = sorted(w.pid for w in list_workers(client.namespace))[:KILLED]
            # Half the workers, stopped first, then killed: a task of one may
            # go to the other before its death is seen, and counts an attempt
            # on each (a slot was free for it), but never a third: one lost
            # with three workers fails (WorkerLost), which is not what this
            # tests.
            for pid in killed:
                os.kill(pid, signal.SIGSTOP)
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
            wait_until(partial(_replaced, client.namespace, set(killed)), timeout_s=30)
            assert list(busy) == [x * x for x in range(300)]
    print(f"replaced {KILLED * ROUNDS}")
    sys.stdout.flush()


def _replaced(namespace: str, killed: set[int]) -> bool:
    now = {w.pid for w in list_workers(namespace)}
    return len(now) == WORKERS and not now & killed


if __name__ == "__main__":
    main()
