"""The supervisor's restart policy."""

from pool.supervisor.orchestration import restart_delay


def test_restart_back_off_doubles_to_a_cap() -> None:
    """A child that served is replaced at once; one that keeps dying before
    it is ready waits 0.1 s, then twice as long each time, at most 10 s, so
    it never spins."""
    delays = [restart_delay(n) for n in range(10)]
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
