"""Killed publishers' workers are dropped at once, for every subscriber."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid

import pytest

from discovery import LocalDiscovery, Subscriber, list_workers
from discovery.liveness import liveness_path, pid_namespace
from tests.support.helpers import agent
from tests.support.pools import pool_command, running_pool, watching
from tests.support.streams import eventually, follow, make_info, next_event, raw_writer

pytestmark = pytest.mark.integration


async def test_sigkilled_publisher_without_supervisor_drops(namespace: str) -> None:
    """A publisher process that no supervisor started is SIGKILLed: this
    process's subscriber and another process's each see exactly one
    worker-dropped per worker, carrying its last info, and the slots and
    liveness files are gone."""
    uids = [str(uuid.uuid4()) for _ in range(3)]
    with LocalDiscovery(namespace):
        async with follow(Subscriber(namespace, poll_interval=30)) as stream:
            with (
                agent("subscribe", namespace) as other,
                agent("publish", namespace) as pub,
            ):
                other.expect("ready")
                pub.expect("ready")
                for uid in uids:
                    pub.call(op="worker-added", uid=uid, status="ready")
                pub.call(op="worker-updated", uid=uids[0], status="draining")
                ours: dict[str, str] = {}  # latest status per uid, here and there
                while len(ours) < 3 or ours[uids[0]] != "draining":
                    event = await next_event(stream)
                    ours[str(event.worker_info.uid)] = event.worker_info.status
                theirs: dict[str, str] = {}
                while len(theirs) < 3 or theirs[uids[0]] != "draining":
                    event_json = other.expect("event")
                    theirs[event_json["uid"]] = event_json["status"]
                pub.kill()
                drops = [await next_event(stream, 5) for _ in uids]
                assert [e.type for e in drops] == ["worker-dropped"] * 3
                assert {str(e.worker_info.uid) for e in drops} == set(uids)
                last = {str(e.worker_info.uid): e.worker_info.status for e in drops}
                assert last[uids[0]] == "draining"
                their_drops = [other.expect("event", 5) for _ in uids]
                assert {(e["type"], e["uid"]) for e in their_drops} == {
                    ("worker-dropped", uid) for uid in uids
                }
                other.kill()
        assert list_workers(namespace) == []
        for uid in uids:
            assert not liveness_path(namespace, uuid.UUID(uid)).exists()


async def test_worker_whose_pid_was_reused_is_dropped_at_the_next_poll(
    namespace: str,
) -> None:
    """A slot whose pid names a live process that is not its publisher (the
    pid was reused before the subscriber opened its pidfd) is dropped at the
    next poll all the same: its liveness lock is free.

    Regression: only slots without a pidfd had their lock tested at a poll,
    so such a worker was never dropped."""
    info = make_info()  # its pid: this test's process, alive throughout
    with LocalDiscovery(namespace), raw_writer(namespace) as writer:
        async with follow(Subscriber(namespace, poll_interval=0.2)) as stream:
            writer.write(
                0, info.uid, info.encode(), pid=os.getpid(), pidns=pid_namespace()
            )
            added = await next_event(stream)
            assert (added.type, added.worker_info.uid) == ("worker-added", info.uid)
            dropped = await next_event(stream)
            assert (dropped.type, dropped.worker_info) == ("worker-dropped", info)
        assert list_workers(namespace) == []


async def test_publisher_killed_before_registering_leaves_nothing(
    namespace: str,
) -> None:
    """A publisher killed after it took a worker's liveness lock but before
    it wrote the slot leaves no file behind: a subscriber's poll sweeps it."""
    with LocalDiscovery(namespace), agent("hold", namespace) as holder:
        uid = uuid.UUID(holder.expect("ready")["uid"])
        assert liveness_path(namespace, uid).exists()
        holder.kill()
        async with follow(Subscriber(namespace, poll_interval=0.05)) as stream:
            napping = asyncio.ensure_future(anext(stream))
            await eventually(lambda: not liveness_path(namespace, uid).exists())
            napping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await napping


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kills", [1, 3, 4])
def test_killed_workers_drop_and_are_replaced(namespace: str, kills: int) -> None:
    """SIGKILL one, several, then all workers of `pool up`: every subscriber
    (the supervisor's view and a `pool watch`) sees one worker-dropped per
    killed worker, and each is replaced."""
    with (
        running_pool(namespace, "--workers", "4") as pool,
        watching(namespace) as watch,
    ):
        watch.wait_counts({"worker-added ": 4}, 30)
        victims = sorted(w.pid for w in list_workers(namespace))[:kills]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        seen = [
            reader.wait_counts({"worker-dropped ": kills}, 10)
            for reader in (pool.lines, watch)
        ]
        for lines in seen:
            drops = [line for line in lines if line.startswith("worker-dropped ")]
            assert sorted(_pid(line) for line in drops) == victims
        # A replacement may be reported before the last drop.
        wanted = {
            prefix: kills - sum(line.startswith(prefix) for line in seen[0])
            for prefix in ("worker-started ", "worker-added ")
        }
        pool.lines.wait_counts(wanted, 30)
        after = {w.pid for w in list_workers(namespace)}
        assert len(after) == 4 and not after & set(victims)
        done = pool_command(
            "submit", "-n", namespace, "tests.support.sample_tasks:square", "3"
        )
        assert done.stdout == "9\n"


def _pid(line: str) -> int:
    return int(line.split("pid=")[1].split()[0])


def test_no_restart_only_reports_deaths(namespace: str) -> None:
    """With --no-restart a killed worker is reported dropped and not replaced."""
    with running_pool(namespace, "--workers", "2", "--no-restart") as pool:
        victim = list_workers(namespace)[0].pid
        os.kill(victim, signal.SIGKILL)
        wanted = {"worker-not-replaced ": 1, "worker-dropped ": 1}
        lines = pool.lines.wait_counts(wanted, 30)
        assert f"worker-dropped pid={victim} " in "".join(lines)
        assert not any(line.startswith("worker-started ") for line in lines)
        assert [w.pid != victim for w in list_workers(namespace)] == [True]
