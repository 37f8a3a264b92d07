"""The worker's alarm, in a child process of its own (it is the process's
real-time timer): it ends the process past the earliest limit held, and
not once every task let go of it."""

from __future__ import annotations

import multiprocessing
import signal

import pytest

from workers.alarm import MAX_LIMIT_S, Alarm

pytestmark = pytest.mark.timeout(30)


def _held(limit_s: float, release: bool) -> None:
    alarm = Alarm()
    alarm.hold(1, 3600)  # (a later deadline does not hide the earlier one)
    alarm.hold(2, limit_s)
    alarm.hold(3, MAX_LIMIT_S * 10)  # (too long to hold: never raises)
    if release:
        alarm.release(2)
        alarm.release(1)
        return
    signal.pause()  # (until the kernel ends it)


@pytest.mark.parametrize("release", [False, True], ids=["held", "released"])
def test_the_kernel_ends_a_process_past_its_earliest_limit(release: bool) -> None:
    """Held, the alarm ends the process with SIGALRM about a second past the
    earliest limit; released, the process exits as it would."""
    child = multiprocessing.get_context("spawn").Process(
        target=_held, args=(0.01, release)
    )
    child.start()
    child.join(20)
    assert child.exitcode == (0 if release else -signal.SIGALRM)
