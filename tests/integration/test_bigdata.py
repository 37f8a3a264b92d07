"""Large data through shared memory, against real pools: every kind of value
round-trips as ProcessPoolExecutor gives it, a worker's argument is a
copy-on-write view of the client's segment, ``put`` references and the
same array sent many times cost one copy, and a full shared memory is a
typed error that harms nothing else."""

from __future__ import annotations

import asyncio
import gc
import mmap
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import pool
from discovery import paths
from pool import AsyncClient, Client, Pool
from tests.support import data_tasks
from tests.support.helpers import wait_until
from workers.protocol import owners, payload, segments

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 2**20
EDGE = payload.BUFFER_MIN  # where a buffer starts to travel out of band


@pytest.fixture(scope="module")
def pools() -> Iterator[tuple[Client, ProcessPoolExecutor]]:
    """One embedded pool and one ProcessPoolExecutor, for the module."""
    with Pool(workers=2) as client, ProcessPoolExecutor(2) as peer:
        peer.submit(int).result(timeout=60)  # (its processes start: the module's)
        yield client, peer


def _arrays(size: int) -> list[tuple[str, Any]]:
    """Arrays of about ``size`` bytes, of every layout."""
    n = max(size // 8, 1) if size else 0
    rng = np.random.default_rng(size)
    flat = rng.random(n)
    side = max(int(n**0.5), 1)
    structured = np.zeros(max(size // 12, 1), dtype=[("a", "<i4"), ("b", "<f8")])
    structured["a"] = np.arange(structured.size)
    return [
        ("C order", flat),
        ("Fortran order", np.asfortranarray(rng.random((side, side)))),
        ("non-contiguous slice", rng.random(2 * n)[::2]),
        ("read-only", _readonly(flat.copy())),
        ("structured dtype", structured),
    ]


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


SIZES = [0, 1, EDGE - 1, EDGE + 1, 100 * 10**6]


def _cases() -> list[Any]:
    cases = []
    for size in SIZES:
        for name, value in _arrays(size):
            cases.append(pytest.param(value, id=f"{name}-{size}B"))
        cases.append(pytest.param(b"x" * size, id=f"bytes-{size}B"))
        cases.append(pytest.param(bytearray(b"y" * size), id=f"bytearray-{size}B"))
    cases.append(pytest.param(np.float64(3.5), id="numpy scalar"))
    cases.append(pytest.param(np.array(2.5), id="0-d array"))
    frame = pd.DataFrame({"x": np.arange(10**6), "y": np.random.rand(10**6)})
    cases.append(pytest.param(frame, id="DataFrame-16MB"))
    cases.append(pytest.param(frame.head(3), id="DataFrame-small"))
    return cases


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, pd.DataFrame):
        return bool(a.equals(b))
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


@pytest.mark.parametrize("value", _cases())
def test_values_round_trip_as_process_pool_executor_gives_them(
    pools: tuple[Client, ProcessPoolExecutor], value: Any
) -> None:
    """As an argument (described in the worker) and as a result (described
    here), every value is equal and has the type, dtype, shape, strides and
    flags that ProcessPoolExecutor gives it."""
    client, peer = pools
    theirs = _as_protocol_5(value, peer.submit(data_tasks.describe, value).result(60))
    ours = client.submit(data_tasks.describe, value).result(timeout=60)
    assert ours == theirs
    back = client.submit(data_tasks.identity, value).result(timeout=60)
    assert _equal(back, value)
    their_back = peer.submit(data_tasks.identity, value).result(timeout=60)
    assert data_tasks.describe(back) == _as_protocol_5(
        value, data_tasks.describe(their_back)
    )


def _as_protocol_5(value: Any, described: dict[str, Any]) -> dict[str, Any]:
    """What ProcessPoolExecutor gives, but for the one flag that differs on
    purpose: pickle protocol 5 keeps a read-only array read-only (its
    protocol 4 gives a writable copy)."""
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        c, f, _, aligned = described["flags"]
        return {**described, "flags": (c, f, False, aligned)}
    return described


def test_a_memoryview_goes_as_bytes_as_ray_and_dask_take_it(
    pools: tuple[Client, ProcessPoolExecutor],
) -> None:
    """A memoryview, which plain pickle (so ProcessPoolExecutor) refuses,
    goes by cloudpickle, as Ray and Dask take it: it arrives as bytes."""
    client, peer = pools
    view = memoryview(b"z" * (EDGE * 2))
    with pytest.raises(TypeError, match="memoryview"):
        peer.submit(len, view).result(timeout=60)
    assert client.submit(data_tasks.identity, view).result(timeout=60) == bytes(view)


def test_the_argument_is_a_copy_on_write_view_of_shared_memory(
    pools: tuple[Client, ProcessPoolExecutor],
) -> None:
    """In the worker, a large array lies in a /dev/shm segment of the
    namespace's, is writable, and a write there costs one private page
    and is not seen here."""
    client, _ = pools
    a = np.arange(4 * MIB, dtype=np.float64)
    seen = client.submit(data_tasks.write_in_place, a).result(timeout=60)
    key = paths.segment_name(client.namespace)
    assert seen["path"].startswith(f"/dev/shm/{key}.")
    assert seen["writeable"] and seen["first"] == -1.0
    assert seen["dirty_after"] - seen["dirty_before"] == os.sysconf("SC_PAGE_SIZE")
    assert a[0] == 0.0


def _used(client: Client) -> int:
    return owners.used_bytes(paths.segment_name(client.namespace))


def _held_while(
    client: Client, gate: Path, send: Callable[[], list[Any]]
) -> tuple[int, list[Any]]:
    """What the namespace holds in shared memory while ``send``'s tasks wait
    at ``gate``, and their results once it opens."""
    futures = send()
    wait_until(lambda: _used(client) > 0)
    held = _used(client)
    gate.touch()
    return held, [f.result(60) if hasattr(f, "result") else list(f) for f in futures]


def test_the_same_array_many_times_is_written_once(tmp_path: Path) -> None:
    """``map`` over ``[a] * 16`` and 16 ``submit`` calls of ``a`` hold one
    copy of it in shared memory while they run (in a pool of their own, so
    that no spare of other tests counts); a change to ``a`` between two
    submits is seen by the second (a new copy), not the first."""
    with Pool(workers=2) as client:
        _write_once(client, tmp_path)


def _write_once(client: Client, tmp_path: Path) -> None:
    a = np.random.rand(8 * MIB // 8)
    gate = tmp_path / "gate-map"
    held, sums = _held_while(
        client,
        gate,
        lambda: [client.map(data_tasks.sum_when, [str(gate)] * 16, [a] * 16)],
    )
    assert held < 1.5 * a.nbytes
    assert sums[0] == [float(a.sum())] * 16
    gate = tmp_path / "gate-submit"
    held, sums = _held_while(
        client,
        gate,
        lambda: [client.submit(data_tasks.sum_when, str(gate), a) for _ in range(16)],
    )
    assert held < 1.5 * a.nbytes
    assert sums == [float(a.sum())] * 16
    gate = tmp_path / "gate-change"
    first = client.submit(data_tasks.first_when, str(gate), a)
    a[0] = 1234.0
    second = client.submit(data_tasks.first_when, str(gate), a)
    gate.touch()
    assert first.result(timeout=60) != 1234.0
    assert second.result(timeout=60) == 1234.0


def test_a_put_reference_is_read_by_many_tasks_and_goes_with_its_last_holder(
    tmp_path: Path,
) -> None:
    """16 tasks read one reference (at any depth of their arguments); the
    segment outlives the reference while tasks that name it run, and once
    they end it is free: the next payload of its size is written into it
    (the old reference's bytes are gone); a released reference is a clear
    error."""
    with Pool(workers=2) as client:  # (its own: no spare of other tests)
        a = np.random.rand(4 * MIB // 8)
        ref = client.put(a)
        assert "shared memory" in repr(ref)
        assert client.submit(data_tasks.total, ref).result(60) == float(a.sum())
        nested = client.submit(data_tasks.identity, {"k": [ref]}).result(60)
        assert np.array_equal(nested["k"][0], a)
        gate = tmp_path / "gate"
        futures = [
            client.submit(data_tasks.sum_when, str(gate), ref) for _ in range(16)
        ]
        (segment,) = ref.data.segments
        del ref, nested
        gc.collect()
        assert (paths.SHM_DIR / segment.name).exists()
        gate.touch()
        assert [f.result(timeout=60) for f in futures] == [float(a.sum())] * 16
        assert client.submit(data_tasks.total, a + 1).result(60) == float((a + 1).sum())
        with pytest.raises(pool.errors.DataGone, match="another payload"):
            segments.attach(segment.name, segment.nonce, segment.size)
        released = client.put(a)
        released.release()
        with pytest.raises(ValueError, match="was released"):
            client.submit(data_tasks.total, released).result(timeout=60)


def test_a_put_object_comes_back_from_its_reference_mapped_as_a_task_receives_it(
    pools: tuple[Client, ProcessPoolExecutor],
) -> None:
    """``ref.get()`` is the object put: a large one mapped from its segment,
    copy-on-write (a write to it changes neither another get nor what tasks
    see), a small one from the reference; a released reference is a clear
    error. The client has no ``get``: dask would take it for its own."""
    client, _ = pools
    a = np.arange(4 * MIB // 8, dtype=np.float64)
    ref = client.put(a)
    got = ref.get()
    assert np.array_equal(got, a) and got.flags.writeable
    assert isinstance(_buffer_owner(got), mmap.mmap)  # mapped, not copied
    got[0] = -1.0
    assert ref.get()[0] == 0.0
    assert client.submit(data_tasks.identity, ref).result(60)[0] == 0.0
    assert client.put({"k": [1, 2]}).get() == {"k": [1, 2]}
    assert not hasattr(client, "get")
    ref.release()
    with pytest.raises(ValueError, match="was released"):
        ref.get()


def _buffer_owner(a: np.ndarray) -> object:
    """What finally holds an array's memory (through views and buffers)."""
    base: object = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_a_reference_of_another_pool_is_a_clear_error(
    pools: tuple[Client, ProcessPoolExecutor],
) -> None:
    client, _ = pools
    with Pool(workers=1) as other:
        ref = other.put(np.ones(EDGE))
        with pytest.raises(ValueError, match="another client or pool"):
            client.submit(data_tasks.total, ref).result(timeout=60)
        assert other.submit(data_tasks.total, ref).result(timeout=60) == EDGE


def test_a_full_shared_memory_is_a_typed_error_and_the_next_call_that_fits_works() -> (
    None
):
    """Under a pool's --shm-limit, an argument or a result that does not fit
    fails with SharedMemoryFull, naming sizes; nothing else is harmed, and
    the next call that fits runs."""
    with Pool(workers=1, shm_limit="16MiB") as client:
        with pytest.raises(pool.errors.SharedMemoryFull, match="shm-limit") as full:
            client.submit(data_tasks.total, np.ones(4 * MIB)).result(timeout=60)
        assert full.value.needed > 16 * MIB
        with pytest.raises(pool.errors.SharedMemoryFull, match="shm-limit"):
            client.submit(data_tasks.ones, 4 * MIB).result(timeout=60)
        assert client.submit(data_tasks.total, np.ones(MIB)).result(timeout=60) == MIB
        assert client.submit(data_tasks.ones, MIB).result(timeout=60).sum() == MIB
        assert _used(client) == 0


@pytest.mark.timeout(300)
def test_a_gigabyte_goes_in_and_out_of_a_fresh_pool() -> None:
    """1 GB argument in, 1 GB result out: no limit but memory."""
    a = np.ones(2**30 // 8)
    with Pool(workers=1) as client:
        assert client.submit(data_tasks.total, a).result(timeout=120) == a.size
        doubled = client.submit(data_tasks.double, a).result(timeout=120)
        assert doubled.nbytes == 2**30 and doubled[0] == 2.0 and doubled[-1] == 2.0


def test_dask_computes_a_large_array_on_the_pool(
    pools: tuple[Client, ProcessPoolExecutor],
) -> None:
    """``da.from_array`` in chunks over the old message limit (80 MB each),
    computed with ``scheduler=client``: the same values as numpy."""
    da = pytest.importorskip("dask.array")
    client, _ = pools
    a = np.random.rand(20 * 10**6)
    x = da.from_array(a, chunks=10**7)
    assert np.allclose((x * 2 + 1).compute(scheduler=client), a * 2 + 1)
    assert np.isclose((x**2).sum().compute(scheduler=client), (a**2).sum())


def test_an_async_client_sends_and_receives_large_arrays(
    pools: tuple[Client, ProcessPoolExecutor],
) -> None:
    client, _ = pools
    a = np.random.rand(10 * MIB)

    async def main() -> tuple[float, np.ndarray, list[float]]:
        async with AsyncClient(client.namespace) as aclient:
            total = await aclient.submit(data_tasks.total, a)
            doubled = await aclient.submit(data_tasks.double, a)
            ref = aclient.put(a)
            sums = [s async for s in aclient.map(data_tasks.total, [ref] * 4)]
            assert np.array_equal(ref.get(), a)
            return total, doubled, sums

    total, doubled, sums = asyncio.run(main())
    assert total == float(a.sum()) and np.array_equal(doubled, a * 2)
    assert sums == [float(a.sum())] * 4


def test_map_chunks_of_large_arrays_travel_by_reference(
    pools: tuple[Client, ProcessPoolExecutor],
) -> None:
    """A chunked map of large arrays: every value right, whatever the chunks."""
    client, _ = pools
    arrays = [np.full(MIB // 8, i, dtype=np.float64) for i in range(12)]
    for chunksize in (None, 1, 5):
        sums = list(client.map(data_tasks.total, arrays, chunksize=chunksize))
        assert sums == [float(a.sum()) for a in arrays]
