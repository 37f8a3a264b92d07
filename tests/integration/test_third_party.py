"""Code nobody here wrote, run unchanged against a real pool: dask's
schedulers and numpy, from a script run by path in another directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import run_script

pytestmark = pytest.mark.integration

SCRIPT = """
import dask
import dask.bag as db
import numpy as np

import pool


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def odd(x):
    return x % 2 == 1


def local(scheduler):
    total = dask.delayed(add)(dask.delayed(inc)(1), dask.delayed(inc)(10))
    several = [dask.delayed(inc)(i) for i in range(20)]
    bag = db.from_sequence(range(100), npartitions=8).map(inc).filter(odd)
    return (
        dask.compute(total, scheduler=scheduler)[0],
        dask.compute(*several, scheduler=scheduler),
        bag,
    )


with pool.Pool(workers=2) as client:
    total, several, bag = local(client)
    here_total, here_several, here_bag = local("sync")
    print("graph", total, total == here_total)
    print("delayed", several == here_several)
    in_pool = bag.compute(scheduler="processes", pool=client)
    print("bag", len(in_pool), in_pool == here_bag.compute(scheduler="sync"))
    array = np.arange(24, dtype=np.float32).reshape(4, 6) / 7
    back = client.submit(np.copy, array).result()
    print("numpy", back.dtype, back.shape, back.tobytes() == array.tobytes())
"""


@pytest.mark.timeout(150)
def test_dask_and_numpy_run_unchanged_on_a_pool(tmp_path: Path) -> None:
    """dask.compute(..., scheduler=client) submits dask's own batch function
    with the script's functions inside its arguments; dask.bag's processes
    scheduler takes the client as its pool and reads its _max_workers. The
    results equal dask's own, computed in the script; a numpy array comes
    back bit for bit."""
    assert run_script(tmp_path, "dask_script.py", SCRIPT, timeout_s=120) == [
        "graph 13 True",
        "delayed True",
        "bag 50 True",
        "numpy float32 (4, 6) True",
    ]
