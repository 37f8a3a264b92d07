"""A program that leaves the interpreter with work in flight:
``python -m tests.support.at_exit MODE NAMESPACE GATE``.

MODE ``client``: a Client of the pool in NAMESPACE submits a task that waits
for the file GATE, and the program ends without shutting it down.
MODE ``pool``: the same through an embedded Pool (namespace NAMESPACE) that
is never closed. MODE ``killed``: an embedded Pool that prints ``ready`` and
waits to be killed.

It prints ``exiting`` once its main thread has ended (the test then opens
GATE); then, in an atexit hook (which runs after the interpreter has
joined every thread that is not a daemon, the clients' exit watcher
among them), the task's result and what a new submit raised.
"""

from __future__ import annotations

import atexit
import sys
import threading

from pool import Client, Pool
from tests.support import sample_tasks


def main() -> None:
    mode, namespace, gate = sys.argv[1:]
    if mode == "killed":
        Pool(workers=1, namespace=namespace).__enter__()
        print("ready", flush=True)
        threading.Event().wait()
    client = (
        Client(namespace)
        if mode == "client"
        else Pool(workers=1, namespace=namespace).__enter__()
    )
    future = client.submit(sample_tasks.gated, gate, 42)

    def report() -> None:
        print(f"result {future.result(timeout=0)}")
        try:
            client.submit(sample_tasks.square, 1)
        except RuntimeError as exc:
            print(f"submit {exc}")

    atexit.register(report)
    # The test opens the gate only once the program is on its way out: its
    # main thread has ended, and the interpreter joins this thread.
    threading.Thread(target=_say_exiting).start()


def _say_exiting() -> None:
    threading.main_thread().join()
    print("exiting", flush=True)


if __name__ == "__main__":
    main()
