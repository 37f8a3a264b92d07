"""Every line of the dispatcher's two pipes reads back as what was written;
anything else is a typed error."""

from __future__ import annotations

import base64
import typing
from collections.abc import Callable
from typing import Any

import pytest

from pool.dispatcher import messages
from workers.protocol.worker_pb2 import Failure

pytestmark = pytest.mark.timeout(30)

SAMPLES: dict[type, Any] = {int: 4242, str: "exit 1: ünïcode", dict: {"a": [1, 2.5]}}


def _sample(kind: type) -> Any:
    hints = typing.get_type_hints(kind)
    fields = [f for f in hints if f != "KIND"]
    return kind(*(SAMPLES[typing.get_origin(hints[f]) or hints[f]] for f in fields))


@pytest.mark.parametrize(
    ("kind", "read"),
    [(k, messages.order) for k in typing.get_args(messages.Order)]
    + [(k, messages.report) for k in typing.get_args(messages.Report)],
)
def test_every_message_round_trips(
    kind: type, read: Callable[[str | bytes], object]
) -> None:
    """Each order and report, encoded, is one line that decodes to itself."""
    message = _sample(kind)
    line = messages.encode(message)
    assert "\n" not in line
    assert read(line) == message
    assert read(line.encode()) == message


def test_an_order_is_not_a_report_nor_the_other_way() -> None:
    with pytest.raises(messages.BadLine, match="not a message of this pipe"):
        messages.report(messages.encode(messages.Drain()))
    with pytest.raises(messages.BadLine, match="not a message of this pipe"):
        messages.order(messages.encode(messages.Linked("uid")))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("drain", "not JSON"),
        ('["drain"]', "not a message"),
        ('{"drain": true}', "not a message"),  # (the old form)
        ('{"kind": "exited", "pid": "7", "status": "x"}', "pid is not of type int"),
        ('{"kind": "exited", "pid": 7}', r"has \['pid', 'status'\]"),
        ('{"kind": "started", "extra": 1}', r"has \[\]"),
    ],
)
def test_a_bad_line_is_a_typed_error_that_names_it(line: str, says: str) -> None:
    with pytest.raises(messages.BadLine, match=says):
        messages.order(line)


def test_broken_carries_a_failure_and_refuses_garbage() -> None:
    failure = Failure(type="InitializerFailed", message="boom")
    wire = base64.b64encode(failure.SerializeToString()).decode()
    order = messages.order(messages.encode(messages.Broken(wire)))
    assert isinstance(order, messages.Broken)
    assert order.parsed() == failure
    with pytest.raises(messages.BadLine, match="not a serialized Failure"):
        messages.Broken("%%%").parsed()
