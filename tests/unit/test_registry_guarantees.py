"""What the shared-memory registry guarantees (``docs/architecture.md``,
"What the registry guarantees"), each a regression test: its docstring
names what the registry design we started from did instead ("Reference:"),
which fails it. That a killed worker drops is ``test_liveness.py``'s."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import tempfile
import time
from pathlib import Path

import pytest

from discovery import (
    LocalDiscovery,
    LockTimeout,
    Publisher,
    RegistryFull,
    Subscriber,
    UnsafeRuntimeDirectory,
    WorkerInfo,
    paths,
)
from discovery.lock import RegistryLock
from tests.support.helpers import agent
from tests.support.streams import (
    events_until,
    follow,
    make_info,
    next_event,
    raw_writer,
)


async def test_the_registry_holds_its_whole_capacity(namespace: str) -> None:
    """Reference: the table is sized capacity*4 bytes for 16-byte slots, so
    only a quarter of the capacity fits. Here every slot is usable."""
    with LocalDiscovery(namespace, capacity=64) as discovery:
        async with discovery.publisher as publisher:
            for _ in range(64):
                await publisher.publish("worker-added", make_info())
            with pytest.raises(RegistryFull, match=r"\(64 workers\)"):
                await publisher.publish("worker-added", make_info())


async def test_updated_only_for_a_worker_that_changed(namespace: str) -> None:
    """Reference: every scan reports worker-updated for every known worker.
    Here only the changed worker is reported, and a repeat is not a change."""
    with LocalDiscovery(namespace) as discovery:
        async with follow(discovery.subscriber) as stream:
            async with discovery.publisher as publisher:
                workers = [make_info() for _ in range(5)]
                for info in workers:
                    await publisher.publish("worker-added", info)
                first = make_info()
                await publisher.publish("worker-added", first)
                assert len(await events_until(stream, first)) == 5
                changed = WorkerInfo(**{**workers[2].__dict__, "status": "draining"})
                await publisher.publish("worker-updated", changed)
                await publisher.publish("worker-updated", changed)  # no change
                await publisher.publish("worker-updated", workers[0])  # no change
                marker = make_info()
                await publisher.publish("worker-added", marker)
                seen = await events_until(stream, marker)
                assert [(e.type, e.worker_info) for e in seen] == [
                    ("worker-updated", changed)
                ]


async def test_a_half_written_slot_is_never_read(namespace: str) -> None:
    """Reference: readers read blocks without the lock, and a half-written
    block fails to decode and ends the subscriber. Here a slot caught
    mid-write is skipped, and read once the write completes."""
    with LocalDiscovery(namespace) as discovery, raw_writer(namespace) as writer:
        async with follow(discovery.subscribe(poll_interval=0.05)) as stream:
            info = make_info()
            writer.tear(0, info.uid, info.encode())
            reader = asyncio.ensure_future(next_event(stream))
            done, _ = await asyncio.wait({reader}, timeout=0.3)  # several polls
            assert not done, f"read a half-written slot: {reader.result()}"
            writer.write(0, info.uid, info.encode())  # the writer finishes
            event = await reader
            assert (event.type, event.worker_info) == ("worker-added", info)


async def test_a_drop_during_a_read_never_raises(namespace: str) -> None:
    """Reference: a block unlinked between the slot read and its open raises
    FileNotFoundError in the subscriber. Here another process adds and drops
    workers as fast as it can while we read: no error, and every worker's
    events form a valid life (added, then dropped)."""
    lives: dict[object, list[str]] = {}
    with LocalDiscovery(namespace, capacity=4) as discovery:
        subscriber = discovery.subscribe(poll_interval=0.01)
        async with follow(subscriber) as stream:
            with agent("churn", namespace, "1500") as churn:
                churn.expect("ready")
                reading = asyncio.ensure_future(_collect(stream, lives))
                await asyncio.get_running_loop().run_in_executor(
                    None, churn.expect, "done", 60.0
                )
                assert churn.stop() == 0
            marker = make_info()
            async with discovery.publisher as publisher:
                await publisher.publish("worker-added", marker)
                await asyncio.wait_for(_until_seen(lives, marker), 10)
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
    lives.pop(marker.uid)
    assert lives, "saw no churn at all"
    assert all(life == ["worker-added", "worker-dropped"] for life in lives.values())


async def _collect(stream, lives) -> None:  # type: ignore[no-untyped-def]
    async for event in stream:
        lives.setdefault(event.worker_info.uid, []).append(event.type)


async def _until_seen(lives, marker) -> None:  # type: ignore[no-untyped-def]
    while marker.uid not in lives:  # _collect fills it from the same loop
        await asyncio.sleep(0.01)


async def test_the_lock_wait_is_bounded_and_idle(namespace: str) -> None:
    """Reference: the lock wait spins on sleep(0) at full CPU, forever. Here it
    backs off, then fails with a typed timeout."""
    with LocalDiscovery(namespace):
        holder = RegistryLock(namespace)
        publisher = Publisher(namespace, lock_timeout_s=1.0)
        try:
            with holder.hold():
                wall, cpu = time.monotonic(), time.process_time()
                with pytest.raises(LockTimeout):
                    await publisher.publish("worker-added", make_info())
                wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        finally:
            holder.close()
            await publisher.aclose()
    assert wall >= 1.0  # it waited its bound (pytest-timeout bounds the rest)
    assert cpu < 0.3 * wall, f"waiting burned {cpu:.2f} s of CPU in {wall:.2f} s"


async def test_runtime_files_are_private_and_unredirectable(
    namespace: str,
) -> None:
    """Reference: lock and notification files sit in the shared temp directory
    under predictable names, opened through symlinks, and the raw namespace
    goes into a path. Here they live in a private directory, 0600, and a
    planted symlink is refused without touching its target."""
    with LocalDiscovery(namespace) as discovery:
        async with discovery.publisher as publisher:
            await publisher.publish("worker-added", make_info())
            directory = paths.namespace_dir(namespace)
            assert not str(directory).startswith(tempfile.gettempdir() + "/wool")
            assert oct(directory.stat().st_mode & 0o777) == "0o700"
            for entry in directory.iterdir():
                assert oct(entry.stat().st_mode & 0o777) == "0o600", entry
    other = namespace + "-x"
    directory = paths.namespace_dir(other)
    victim = Path(tempfile.mkdtemp()) / "victim"
    victim.write_text("precious")
    try:
        os.symlink(victim, directory / paths.LOCK_FILE)
        with pytest.raises(UnsafeRuntimeDirectory, match="symbolic link"):
            LocalDiscovery(other).__enter__()
        assert victim.read_text() == "precious"
    finally:
        paths.remove_namespace_dir(other)
        victim.unlink()
        victim.parent.rmdir()


async def test_unrelated_files_do_not_wake_a_subscriber(namespace: str) -> None:
    """Reference: subscribers watch the whole temp directory and wake for every
    file there. Here only the namespace's notifications wake them."""
    with LocalDiscovery(namespace) as discovery:
        subscriber = discovery.subscribe(poll_interval=60)
        async with follow(subscriber) as stream:
            async with discovery.publisher as publisher:
                first = make_info()
                await publisher.publish("worker-added", first)
                await next_event(stream)
                before = subscriber.stats.wakeups
                scratch = Path(tempfile.mkdtemp())
                noisy = [scratch, paths.runtime_dir(), paths.namespace_dir(namespace)]
                for directory in noisy:
                    for i in range(100):
                        (directory / f"unrelated-{i}").write_text("x")
                        (directory / f"unrelated-{i}").unlink()
                scratch.rmdir()
                marker = make_info()
                await publisher.publish("worker-added", marker)
                await events_until(stream, marker)
                assert subscriber.stats.wakeups - before <= 2


async def test_a_subscriber_waits_for_its_namespace(namespace: str) -> None:
    """Reference: a subscriber started before the namespace exists fails. Here
    it waits, and sees the namespace's workers once it appears."""
    async with follow(Subscriber(namespace, poll_interval=30)) as stream:
        early = asyncio.ensure_future(next_event(stream))
        done, _ = await asyncio.wait({early}, timeout=0.1)
        assert not done  # waiting, not failed
        with LocalDiscovery(namespace) as discovery:
            async with discovery.publisher as publisher:
                info = make_info()
                await publisher.publish("worker-added", info)
                event = await early
                assert (event.type, event.worker_info) == ("worker-added", info)


async def test_defaults_agree_and_pickling_keeps_poll_interval(
    namespace: str,
) -> None:
    """Reference: Publisher defaults to 512-byte blocks while LocalDiscovery
    makes 1024, and a pickled Subscriber loses its poll_interval. Here the
    block size is the namespace's, and pickling keeps every argument."""
    with LocalDiscovery(namespace) as discovery:
        info = make_info(extra={"note": "x" * 700})
        assert 512 < len(info.encode()) <= 1024
        async with Publisher(namespace) as publisher:
            await publisher.publish("worker-added", info)
        subscriber = pickle.loads(pickle.dumps(discovery.subscribe(poll_interval=0.25)))
        assert subscriber.poll_interval == 0.25 and subscriber.namespace == namespace


@pytest.mark.parametrize("end", ["sigkill", "clean-exit"])
async def test_an_attacher_never_unlinks_the_segment(namespace: str, end: str) -> None:
    """Reference: attaching registers the segment with the resource tracker,
    which unlinks it (or warns of a leak) when the attaching process ends.
    Here an attacher starts no tracker, and its end leaves the registry whole."""
    with LocalDiscovery(namespace) as discovery:
        segment = paths.SHM_DIR / paths.segment_name(namespace)
        async with discovery.publisher as publisher:
            info = make_info()
            await publisher.publish("worker-added", info)
            with agent("attach", namespace) as attacher:
                ready = attacher.expect("ready")
                assert ready["first"]["uid"] == str(info.uid)
                assert ready["children"] == [], "a resource tracker was started"
                if end == "sigkill":
                    attacher.kill()
                else:
                    assert attacher.stop() == 0
                    assert "resource_tracker" not in attacher.stderr()
            assert segment.exists()
            async with follow(discovery.subscriber) as stream:
                assert (await next_event(stream)).worker_info == info
