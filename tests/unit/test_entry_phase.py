"""A task a worker took moves only along the transitions its Phase draws:
withdrawn only while held, stuck only when answered while its thread runs."""

from __future__ import annotations

import pytest

from workers.protocol.worker_pb2 import Task
from workers.running import Entry, Phase, Stream

pytestmark = pytest.mark.timeout(10)


def _entry() -> Entry:
    return Entry(Task(id=1, function="math:factorial"), Stream())


def _phase(entry: Entry) -> Phase:
    return entry.phase  # (read afresh: each call may have moved it)


def test_a_held_task_is_withdrawn_once() -> None:
    entry = _entry()
    assert entry.settle(withdraw=True) and _phase(entry) is Phase.ANSWERED
    assert not entry.settle() and not entry.take()  # once, and never started


def test_a_taken_task_is_not_withdrawn_but_answered_as_stuck_while_it_runs() -> None:
    entry = _entry()
    assert entry.take() and not entry.take()
    assert not entry.settle(withdraw=True) and _phase(entry) is Phase.RUNNING
    assert entry.settle() and _phase(entry) is Phase.STUCK and entry.answered
    entry.ran()  # its thread returns: still stuck until the loop hears it
    assert _phase(entry) is Phase.STUCK
    assert entry.unstick() and _phase(entry) is Phase.ANSWERED
    assert not entry.unstick()


def test_a_task_whose_thread_returned_is_answered_not_stuck() -> None:
    entry = _entry()
    entry.take()
    entry.ran()
    assert _phase(entry) is Phase.RAN and not entry.settle(withdraw=True)
    assert entry.settle() and _phase(entry) is Phase.ANSWERED
    assert not entry.unstick() and not entry.settle()
