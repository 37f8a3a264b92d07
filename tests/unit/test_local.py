"""The LocalDiscovery API: create, attach, publish, subscribe, and its errors."""

import asyncio
import contextlib
import dataclasses
import os

import pytest

from discovery import (
    DiscoveryError,
    DiscoveryEvent,
    LocalDiscovery,
    LockTimeout,
    NamespaceNotFound,
    Publisher,
    RegistryFull,
    RegistryMismatch,
    Subscriber,
    UnknownEventType,
    UnsafeRuntimeDirectory,
    WorkerAlreadyRegistered,
    WorkerInfoTooLarge,
    WorkerNotRegistered,
    paths,
)
from discovery.lock import RegistryLock
from tests.support.streams import (
    events_until,
    follow,
    make_info,
    next_event,
    raw_writer,
)


async def test_lifecycle_events_in_order(namespace: str) -> None:
    """A subscriber sees added, then updated, then dropped, with the latest info."""
    with LocalDiscovery(namespace) as discovery:
        async with follow(discovery.subscriber) as stream:
            async with discovery.publisher as publisher:
                info = make_info(tags={"a"})
                await publisher.publish("worker-added", info)
                assert await next_event(stream) == DiscoveryEvent("worker-added", info)
                draining = dataclasses.replace(info, status="draining")
                await publisher.publish("worker-updated", draining)
                assert await next_event(stream) == DiscoveryEvent(
                    "worker-updated", draining
                )
                await publisher.publish("worker-dropped", info)
                assert await next_event(stream) == DiscoveryEvent(
                    "worker-dropped", draining
                )


async def test_second_instance_attaches_and_only_owner_removes(namespace: str) -> None:
    """A second LocalDiscovery attaches; its exit leaves the registry in place."""
    with LocalDiscovery(namespace, capacity=8) as owner:
        with LocalDiscovery(namespace, capacity=8) as attacher:
            assert owner.created and not attacher.created
        segment = paths.SHM_DIR / paths.segment_name(namespace)
        assert segment.exists()
        async with owner.publisher as publisher:
            await publisher.publish("worker-added", make_info())
    assert not segment.exists()
    assert not paths.namespace_dir(namespace, create=False).exists()


def test_attach_with_other_layout_is_refused(namespace: str) -> None:
    """Asking for another capacity than the namespace has is a clear error."""
    mismatch = pytest.raises(RegistryMismatch, match=r"exists with capacity 8")
    with LocalDiscovery(namespace, capacity=8), mismatch:
        LocalDiscovery(namespace, capacity=16).__enter__()


async def test_publish_without_registry_says_what_to_do(namespace: str) -> None:
    """Publishing to a namespace nobody created names the fix."""
    with pytest.raises(NamespaceNotFound, match=r"has no registry; start the pool"):
        async with Publisher(namespace) as publisher:
            await publisher.publish("worker-added", make_info())
    paths.remove_namespace_dir(namespace)


async def test_typed_errors_for_bad_publishes(namespace: str) -> None:
    """Each bad publish gets its own error class, all under DiscoveryError."""
    with LocalDiscovery(namespace, capacity=2, block_size=200) as discovery:
        async with discovery.publisher as publisher:
            info = make_info()
            with pytest.raises(UnknownEventType, match=r"^unknown discovery event"):
                await publisher.publish("worker-exploded", info)  # type: ignore[arg-type]
            with pytest.raises(WorkerNotRegistered, match=r"is not registered"):
                await publisher.publish("worker-updated", info)
            with pytest.raises(WorkerNotRegistered):
                await publisher.publish("worker-dropped", info)
            big = make_info(extra={"blob": "x" * 300})
            with pytest.raises(
                WorkerInfoTooLarge, match=r"encodes to \d+ bytes but a block holds 200"
            ):
                await publisher.publish("worker-added", big)
            await publisher.publish("worker-added", info)
            with pytest.raises(WorkerAlreadyRegistered):
                await publisher.publish("worker-added", info)
            await publisher.publish("worker-added", make_info())
            with pytest.raises(RegistryFull, match=r"is full \(2 workers\)"):
                await publisher.publish("worker-added", make_info())
    for cls in (UnknownEventType, WorkerInfoTooLarge):
        assert issubclass(cls, ValueError) and issubclass(cls, DiscoveryError)
    assert issubclass(LockTimeout, TimeoutError)


async def test_publisher_close_drops_its_workers(namespace: str) -> None:
    """A publisher that exits cleanly drops every worker it still holds."""
    with LocalDiscovery(namespace) as discovery:
        async with follow(discovery.subscriber) as stream:
            infos = [make_info() for _ in range(3)]
            async with discovery.publisher as publisher:
                for info in infos:
                    await publisher.publish("worker-added", info)
                for _ in infos:
                    assert (await next_event(stream)).type == "worker-added"
            dropped = {(await next_event(stream)).worker_info.uid for _ in infos}
            assert dropped == {info.uid for info in infos}


async def test_owner_close_drops_everything_for_subscribers(namespace: str) -> None:
    """When the owner closes the namespace, subscribers see every worker dropped."""
    async with follow(Subscriber(namespace)) as stream:
        info = make_info()
        with LocalDiscovery(namespace) as discovery:
            publisher = discovery.publisher
            await publisher.publish("worker-added", info)
            assert (await next_event(stream)).type == "worker-added"
        event = await next_event(stream)
        assert (event.type, event.worker_info.uid) == ("worker-dropped", info.uid)
        await publisher.aclose()


async def test_filter_reports_workers_entering_and_leaving(namespace: str) -> None:
    """A filtered subscriber sees a worker added when it starts matching and
    dropped when it stops."""
    with LocalDiscovery(namespace) as discovery:
        async with (
            follow(discovery.subscribe(lambda info: info.status == "ready")) as stream,
            discovery.publisher as publisher,
        ):
            info = make_info(status="draining")
            await publisher.publish("worker-added", info)
            ready = dataclasses.replace(info, status="ready")
            await publisher.publish("worker-updated", ready)
            assert await next_event(stream) == DiscoveryEvent("worker-added", ready)
            await publisher.publish("worker-updated", info)
            assert await next_event(stream) == DiscoveryEvent("worker-dropped", ready)


async def test_lock_timeout_is_typed(namespace: str) -> None:
    """A lock held elsewhere makes publish fail after the bounded wait."""
    with LocalDiscovery(namespace) as discovery:
        holder = RegistryLock(namespace)
        try:
            with holder.hold():
                publisher = Publisher(namespace, lock_timeout_s=0.2)
                with pytest.raises(LockTimeout, match=r"held for more than 0.2 s"):
                    await publisher.publish("worker-added", make_info())
            await publisher.publish("worker-added", make_info())  # free again
            await publisher.aclose()
        finally:
            holder.close()
        assert discovery.namespace == namespace


def test_default_namespace_is_fresh() -> None:
    """Without a name, each LocalDiscovery gets its own namespace."""
    a, b = LocalDiscovery(), LocalDiscovery()
    assert a.namespace != b.namespace and a.namespace.startswith("pool-")


def test_an_empty_namespace_is_refused_not_replaced() -> None:
    """Only None means "make one up": an empty name is a mistake."""
    with pytest.raises(ValueError, match="it is empty"):
        LocalDiscovery("")


async def test_subscriber_poll_finds_change_without_notification(
    namespace: str,
) -> None:
    """With no notification at all, polling still delivers the event."""
    with LocalDiscovery(namespace) as discovery, raw_writer(namespace) as writer:
        async with follow(discovery.subscribe(poll_interval=0.05)) as stream:
            info = make_info()
            writer.write(0, info.uid, info.encode(), notify=False)
            event = await next_event(stream, 5)
            assert event == DiscoveryEvent("worker-added", info)


async def test_many_subscribers_share_one_watch(namespace: str) -> None:
    """Many subscribers in one process all get the event."""
    with LocalDiscovery(namespace) as discovery:
        async with contextlib.AsyncExitStack() as stack:
            streams = [
                await stack.enter_async_context(
                    follow(discovery.subscribe(poll_interval=30))
                )
                for _ in range(20)
            ]
            async with discovery.publisher as publisher:
                marker = make_info()
                await publisher.publish("worker-added", marker)
                seen = await asyncio.gather(*(events_until(s, marker) for s in streams))
                assert seen == [[]] * 20


async def test_corrupt_slot_is_skipped_with_one_warning(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An undecodable slot is skipped with one warning; the stream goes on."""
    with LocalDiscovery(namespace) as discovery, raw_writer(namespace) as writer:
        async with follow(discovery.subscribe(poll_interval=0.02)) as stream:
            writer.write(3, make_info().uid, b"\xff\x00garbage")
            async with discovery.publisher as publisher:
                marker = make_info()
                await publisher.publish("worker-added", marker)
                assert await events_until(stream, marker) == []
                other = make_info()
                await publisher.publish("worker-added", other)
                assert (await next_event(stream)).worker_info == other
    warnings = [r for r in caplog.records if "skipping slot 3" in r.getMessage()]
    assert len(warnings) == 1, warnings


async def test_subscriber_reads_only_changed_slots(namespace: str) -> None:
    """After the first look, one change costs one slot read, however many
    workers are registered."""
    with LocalDiscovery(namespace, capacity=512) as discovery:
        subscriber = discovery.subscribe(poll_interval=30)
        async with follow(subscriber) as stream:
            async with discovery.publisher as publisher:
                infos = [make_info() for _ in range(500)]
                for info in infos:
                    await publisher.publish("worker-added", info)
                for _ in infos:
                    await next_event(stream)
                before = subscriber.stats.slots_read
                for info in infos[:10]:
                    changed = dataclasses.replace(info, status="draining")
                    await publisher.publish("worker-updated", changed)
                    assert await next_event(stream) == DiscoveryEvent(
                        "worker-updated", changed
                    )
                assert subscriber.stats.slots_read - before == 10


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
async def test_segment_of_another_user_is_refused(namespace: str) -> None:
    """Attaching to a segment another user owns, or one others may write, fails."""
    with LocalDiscovery(namespace):
        segment = paths.SHM_DIR / paths.segment_name(namespace)
        assert oct(segment.stat().st_mode & 0o777) == "0o600"
        os.chown(segment, 54321, 54321)
        with pytest.raises(UnsafeRuntimeDirectory, match=r"belongs to uid 54321"):
            await Publisher(namespace).__aenter__()
        os.chown(segment, 0, 0)
        os.chmod(segment, 0o666)
        with pytest.raises(UnsafeRuntimeDirectory, match=r"mode is 0666"):
            await Publisher(namespace).__aenter__()


def test_watchdogs_stopped_emitter_message_does_not_leak(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """watchdog logs an ERROR when its emitter is stopped mid-read (a race
    of its own, on a double Ctrl-C): it is dropped; its other errors are not."""
    import logging

    import discovery.watch  # noqa: F401  (installs the filter)

    inotify = logging.getLogger("watchdog.observers.inotify")
    inotify.error("InotifyEmitter.queue_events() called when the thread is inactive")
    inotify.error("something else went wrong")
    assert "thread is inactive" not in caplog.text
    assert "something else went wrong" in caplog.text
