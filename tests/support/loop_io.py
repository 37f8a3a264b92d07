"""Which thread scans ``/dev/shm`` or writes a pool's files:
``python -m tests.support.loop_io client NAMESPACE`` or ``... pool``.

An audit hook (``sys.addaudithook``: ``os.scandir``, ``os.listdir`` and
``open`` events) records the name of the thread that makes each such call.
Mode ``client``: a Client of the running pool in NAMESPACE runs a task,
then waits for its second scan of ``/dev/shm`` (its sweep runs each
second). Mode ``pool``: an embedded Pool starts (its supervisor writes the
token, the dispatcher's address and the data plane's file in the
runtime directory), runs a task and stops. Either prints, as JSON, the
names of the threads that made those calls, and the name of the thread
that runs the event loop in question (the client's, or the pool's).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from discovery.paths import SHM_DIR, runtime_dir
from pool import Client, Pool
from tests.support import sample_tasks
from tests.support.helpers import DEADLINE_S

seen: dict[str, list[str]] = {"scans": [], "writes": []}
runtime = str(runtime_dir())
scanned = threading.Semaphore(0)


def hook(event: str, args: tuple[Any, ...]) -> None:
    if event in ("os.scandir", "os.listdir") and args and str(args[0]) == str(SHM_DIR):
        seen["scans"].append(threading.current_thread().name)
        scanned.release()
    elif event == "open" and args and isinstance(args[0], (str, os.PathLike)):
        path, flags = os.fspath(args[0]), args[2]
        writing = isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR)
        if path.startswith(runtime) and writing:
            seen["writes"].append(threading.current_thread().name)


def main() -> None:
    mode = sys.argv[1]
    sys.addaudithook(hook)
    if mode == "client":
        with Client(sys.argv[2]) as client:
            assert client.submit(sample_tasks.square, 3).result(DEADLINE_S) == 9
            for _ in range(2):
                assert scanned.acquire(timeout=DEADLINE_S), "no sweep of /dev/shm"
        loop = "pool-client"
    else:
        with Pool(workers=1) as client:
            assert client.submit(sample_tasks.square, 3).result(DEADLINE_S) == 9
        loop = "pool"
    print(json.dumps({**seen, "loop": loop}), flush=True)


if __name__ == "__main__":
    main()
