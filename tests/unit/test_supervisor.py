"""The supervisor's restart policy."""

from pool.supervisor.children import Child, next_start, restart_delay
from workers.settings import WorkerSettings


def test_restart_back_off_doubles_to_a_cap() -> None:
    """A child that served is replaced at once; one that keeps dying before
    it is ready waits 0.1 s, then twice as long each time, at most 10 s, so
    it never spins."""
    delays = [restart_delay(n) for n in range(10)]
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]


def _child() -> Child:
    return Child("worker-1", "workers.process:run", WorkerSettings())


def test_a_child_that_served_is_replaced_at_once_every_time() -> None:
    """However often it dies, a child that reached READY each time is
    started again with no delay, and its failure count stays at zero."""
    child = _child()
    for _ in range(5):
        child.ready = {"uid": "x"}
        assert next_start(child, restart=True, stopping=False) == 0.0
    assert child.failures == 0


def test_failures_before_ready_back_off_and_a_success_resets_them() -> None:
    """Deaths before READY count up and back off; one that served starts the
    count again, so an old run of failures does not slow a later restart."""
    child = _child()
    delays = [next_start(child, restart=True, stopping=False) for _ in range(4)]
    assert delays == [0.1, 0.2, 0.4, 0.8] and child.failures == 4
    child.ready = {"uid": "x"}
    assert next_start(child, restart=True, stopping=False) == 0.0
    child.ready = {}
    assert next_start(child, restart=True, stopping=False) == 0.1


def test_no_restart_while_stopping_or_with_restarts_off() -> None:
    """A pool that drains, or runs with --no-restart, replaces nothing, and
    does not count the death as a failure."""
    child = _child()
    assert next_start(child, restart=True, stopping=True) is None
    assert next_start(child, restart=False, stopping=False) is None
    assert child.failures == 0
