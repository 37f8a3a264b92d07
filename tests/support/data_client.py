"""A client that sends large arrays to a running pool until it is killed
(``python -m tests.support.data_client NAMESPACE``): it prints ``writing N`` just
before each submit, so that a test can kill it while it writes. With
``--hold`` it stores one array (``client.put``), prints ``holding`` and waits
to be killed: its data is surely in shared memory then."""

from __future__ import annotations

import sys
import threading

import numpy as np

from pool import Client
from tests.support import data_tasks


def main() -> None:
    with Client(sys.argv[1]) as client:
        print(f"owner {client._runner.store.owner.id}", flush=True)  # type: ignore[union-attr]
        a = np.random.rand(2**22)  # 32 MiB
        if "--hold" in sys.argv[2:]:
            held = client.put(a)
            print(f"holding {held!r}", flush=True)
            threading.Event().wait()
        for n in range(1_000_000):
            a[0] = n  # (a new copy each time: it changed)
            print(f"writing {n}", flush=True)
            client.submit(data_tasks.total, a)


if __name__ == "__main__":
    main()
