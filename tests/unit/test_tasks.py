"""How a task is named, encoded and answered (workers.protocol.codec), in-process."""

from __future__ import annotations

import pickle

import grpc
import pytest

from pool import TaskTimeout
from tests.support import sample_tasks
from workers.protocol import codec
from workers.protocol.errors import ArgumentsTooLarge, BadTask, FunctionNotFound

pytestmark = pytest.mark.timeout(10)


def test_calls_round_trip_and_bad_ones_are_refused() -> None:
    """Arguments survive the wire; too large, undecodable or misshapen ones
    are a BadTask of the right kind."""
    data = codec.dump_call((1, "a"), {"k": [2]})
    assert codec.load_call(data) == ((1, "a"), {"k": [2]})
    with pytest.raises(ArgumentsTooLarge, match="over the worker's limit of 4"):
        codec.load_call(data, max_bytes=4)
    with pytest.raises(BadTask, match="do not unpickle"):
        codec.load_call(b"\x80\x05junk")
    with pytest.raises(BadTask, match=r"pickled \(tuple, dict\) pair"):
        codec.load_call(pickle.dumps([1, 2]))


def test_arguments_naming_a_module_the_worker_lacks_say_what_to_do() -> None:
    """An argument whose class the worker cannot import is FunctionNotFound,
    whose message names the module and the fixes, ship_modules among them.

    Regression: it was a bare "arguments do not unpickle: ModuleNotFoundError"."""
    data = codec.dump_call((sample_tasks.Scaler(2),), {})
    data = data.replace(b"tests.support.sample_tasks", b"tests.support.sample_taskz")
    with pytest.raises(FunctionNotFound) as raised:
        codec.load_call(data)
    message = str(raised.value)
    assert message.startswith(
        "the task's arguments need module 'tests.support.sample_taskz'"
    )
    assert "--path" in message and "ship_modules=[module]" in message


def test_an_exception_that_cannot_be_printed_still_makes_a_failure() -> None:
    """failure_of never raises, whatever the exception's __str__ does, and
    the exception itself still travels.

    Regression: the failure text called str() unguarded, so such a task was
    never answered and its worker thread died."""
    try:
        sample_tasks.raise_bad_str()
    except sample_tasks.BadStr as exc:
        failure = codec.failure_of(exc)
    assert failure.message == "<BadStr: str() failed>"
    assert failure.type == "tests.support.sample_tasks.BadStr"
    assert codec.status_of(failure) == grpc.StatusCode.UNKNOWN
    rebuilt = codec.exception_of(failure)
    assert isinstance(rebuilt, sample_tasks.BadStr) and rebuilt.args == ("hidden",)
    assert "raise_bad_str" in str(rebuilt.__cause__)


def test_a_timeout_is_a_typed_deadline() -> None:
    """A task over its limit fails with TaskTimeout (a TimeoutError) whose
    status is DEADLINE_EXCEEDED, and it rebuilds as itself in the caller."""
    failure = codec.failure_of(TaskTimeout(0.5), remote=False)
    assert codec.status_of(failure) == grpc.StatusCode.DEADLINE_EXCEEDED
    rebuilt = codec.exception_of(failure)
    assert isinstance(rebuilt, TaskTimeout) and isinstance(rebuilt, TimeoutError)
    assert str(rebuilt) == "the task ran over its 0.5 s"
