"""Any callable, the way Ray, Dask and loky take them: what a worker cannot
import travels by value (workers/shipping.py), against real pools."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import pool
from pool import Client
from tests.support.helpers import DEADLINE_S, run_script
from tests.support.pools import running_pool

pytestmark = pytest.mark.integration

SCRIPT = """
import asyncio
import copy
import dataclasses
import functools
import traceback

import pool


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Refused(Exception):
    pass


def doubled(p):
    return Point(2 * p.x, 2 * p.y)


def refuse(why):
    raise Refused(why)


def neg(x):
    return -x


def fails_here(x):
    raise ValueError(x)  # the line the remote traceback shows


async def in_executor(client):
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(client, doubled, Point(3, 4))


class Counter:
    def __init__(self, step):
        self.step = step

    def advance(self, x):
        return x + self.step


with pool.Pool(workers=2) as client:
    print("lambda", client.submit(lambda x: x + 1, 41).result())
    point = client.submit(doubled, Point(1, 2)).result()
    print("main", point, isinstance(point, Point))
    print("partial", client.submit(functools.partial(pow, 2), 10).result())
    print("bound", client.submit(Counter(5).advance, 1).result())
    try:
        client.submit(refuse, "no").result()
    except Refused as exc:
        print("raised", type(exc).__name__, exc)
    print("map", sum(client.map(lambda x: x * x, range(1000))))
    print("key", client.submit(sorted, [3, 1, 2], key=neg).result())
    copied = client.submit(copy.copy, Point(1, 2)).result()
    print("copy", copied, isinstance(copied, Point))
    try:
        client.submit(fails_here, 7).result()
    except ValueError as exc:
        cause = "".join(traceback.format_exception(exc))
        print("line", "raise ValueError(x)  # the line" in cause)
    print("asyncio", asyncio.run(in_executor(client)))
    print("slots", client.max_workers, client._max_workers)
"""


@pytest.mark.timeout(120)
def test_a_script_submits_a_lambda_a_main_function_and_a_partial(
    tmp_path: Path,
) -> None:
    """The README's script, run by path from another directory with no
    PYTHONPATH: its __main__ functions, classes and exceptions make the
    round trip, typed as the script knows them, inside arguments too (a
    sort key, a dataclass given to an importable function); a remote
    traceback shows the script's line; asyncio's run_in_executor takes the
    client; and the client says the pool's slots, as dask reads them."""
    assert run_script(tmp_path, "script.py", SCRIPT, timeout_s=90) == [
        "lambda 42",
        "main Point(x=2, y=4) True",
        "partial 1024",
        "bound 6",
        "raised Refused no",
        f"map {sum(x * x for x in range(1000))}",
        "key [3, 2, 1]",
        "copy Point(x=1, y=2) True",
        "line True",
        "asyncio Point(x=6, y=8)",
        "slots 2 2",
    ]


@pytest.fixture
def local_module(tmp_path: Path) -> Iterator[ModuleType]:
    """A module of the test's own, which a pool's workers cannot import."""
    name = f"local_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            class Box:
                def __init__(self, value):
                    self.value = value

            def unbox(box, add=0):
                return box.value + add
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


@pytest.mark.timeout(90)
def test_ship_modules_sends_a_module_the_workers_cannot_import(
    namespace: str, local_module: ModuleType
) -> None:
    """Without ship_modules, the error says where the worker looks and how to
    fix it; with it, the module's functions and classes travel by value."""
    with running_pool(namespace, "--workers", "1"):
        with Client(namespace) as client:
            future = client.submit(local_module.unbox, local_module.Box(1))
            with pytest.raises(pool.errors.BadTask) as raised:
                future.result(timeout=DEADLINE_S)
            message = str(raised.value)
            assert f"'{local_module.__name__}'" in message
            assert "sys.path[0]=" in message and "working directory" in message
            assert "--path" in message and "ship_modules" in message
        with Client(namespace, ship_modules=[local_module]) as client:
            box = local_module.Box(40)
            assert client.submit(local_module.unbox, box, add=2).result(30) == 42
            assert list(client.map(local_module.unbox, [box] * 300)) == [40] * 300


def test_ship_modules_takes_modules() -> None:
    with pytest.raises(TypeError, match="ship_modules takes modules"):
        Client("nobody-here", ship_modules=["json"])  # type: ignore[list-item]
