"""Limits a pool meets on a shared machine: a registry lock that a stuck
process never releases, and no inotify instance to be had."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from discovery import LocalDiscovery, LockTimeout, Publisher
from tests.support.helpers import agent
from tests.support.streams import make_info

pytestmark = pytest.mark.integration

# A fresh user namespace whose inotify limit is 0: inotify_init fails there
# with EMFILE, as it does for a user who has used up max_user_instances.
NO_INOTIFY = [
    "unshare",
    "--user",
    "--map-root-user",
    "sh",
    "-c",
    'echo 0 > /proc/sys/user/max_inotify_instances && exec "$@"',
    "sh",
]


def _can_drop_inotify() -> bool:
    probe = subprocess.run([*NO_INOTIFY, "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


@pytest.mark.timeout(30)
async def test_lock_held_by_a_stopped_process_times_out(namespace: str) -> None:
    """A process that took the registry lock and was then stopped (SIGSTOP)
    makes publish fail with LockTimeout after the bounded wait; once it is
    gone the lock is free again."""
    with LocalDiscovery(namespace), agent("hold-lock", namespace) as holder:
        holder.expect("ready")
        os.kill(holder.pid, signal.SIGSTOP)
        try:
            async with Publisher(namespace, lock_timeout_s=0.5) as publisher:
                pytest.fail("the lock was free")  # pragma: no cover
        except LockTimeout as exc:
            assert "held for more than 0.5 s" in str(exc)
        holder.kill()
        async with Publisher(namespace, lock_timeout_s=5) as publisher:
            await publisher.publish("worker-added", make_info())


@pytest.mark.timeout(60)
@pytest.mark.skipif(not _can_drop_inotify(), reason="cannot create a user namespace")
def test_subscriber_without_inotify_polls_with_one_warning(namespace: str) -> None:
    """A subscriber in a process that can get no inotify instance still sees
    every event, by polling, and says so once."""
    with LocalDiscovery(namespace):
        with (
            agent("subscribe", namespace, "0.1", prefix=NO_INOTIFY) as subscriber,
            agent("publish", namespace) as publisher,
        ):
            subscriber.expect("ready")
            publisher.expect("ready")
            uid = str(make_info().uid)
            for op in ["worker-added", "worker-updated", "worker-dropped"]:
                status = "draining" if op == "worker-updated" else "ready"
                publisher.call(op=op, uid=uid, status=status)
                event = subscriber.expect("event")
                assert (event["type"], event["uid"]) == (op, uid)
            subscriber.kill()  # it follows until killed
            publisher.stop()
            warnings = subscriber.stderr().count("subscribers poll instead")
    assert warnings == 1
