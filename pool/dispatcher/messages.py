"""What the dispatcher and its supervisor say on their two pipes: each kind
of line defined once, here, and used by both ends.

- **Orders**, on the control pipe (written by
  :class:`pool.supervisor.control.ControlPipe`, read by the dispatcher's
  ``_obey`` in :mod:`pool.dispatcher.server`): :class:`Started` (every
  worker has started: tasks need no longer wait for more),
  :class:`Exited` (how a worker ended), :class:`Broken` (the workers'
  initializer failed too often: fail every task with its failure) and
  :class:`Drain` (the pool stops: take no more tasks).
- **Reports**, on the report pipe (written by the dispatcher, read by
  :class:`pool.supervisor.registrations.Registrations`): :class:`Linked`
  (a worker's stream is up) and :class:`Stats` (with a dashboard, what
  tasks did).

A line is one JSON object that names its kind
(``{"kind": "exited", "pid": 7, "status": "killed by SIGKILL"}``).
:func:`order` and :func:`report` check every field's type, and raise
:class:`BadLine` for anything :func:`encode` did not make; no I/O here.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, dataclass_transform

from pool.errors import PoolError
from workers.protocol.worker_pb2 import Failure


class BadLine(PoolError, ValueError):
    """A pipe line that is not one of its messages; the message says why."""


@dataclass_transform(frozen_default=True)
class Message:
    """A line of a pipe: each kind a frozen dataclass of its fields (made so
    where it is declared), named on the wire by its class's name in lower
    case (``Exited``: ``"exited"``)."""

    KIND: ClassVar[str]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.KIND = cls.__name__.lower()
        dataclass(frozen=True)(cls)


class Started(Message):
    """Every worker the supervisor started is registered and linked."""


class Exited(Message):
    """The worker ``pid`` exited: ``status`` says how (``exit 0``, a signal)."""

    pid: int
    status: str


class Broken(Message):
    """The workers' initializer failed too often; ``failure`` is a serialized
    :class:`Failure` (of ``InitializerFailed``), in base64."""

    failure: str

    def parsed(self) -> Failure:
        """:raises BadLine: if ``failure`` is not one."""
        try:
            return Failure.FromString(base64.b64decode(self.failure, validate=True))
        except Exception as exc:  # (binascii.Error, protobuf's DecodeError)
            raise BadLine(f"not a serialized Failure: {self.failure[:80]!r}") from exc


class Drain(Message):
    """The pool stops: take no more tasks, deliver what workers finish."""


class Linked(Message):
    """The dispatcher's stream to the worker ``uid`` is up."""

    uid: str


class Stats(Message):
    """What tasks did since the last report (:mod:`pool.dispatcher.telemetry`)."""

    stats: dict[str, Any]


Order = Started | Exited | Broken | Drain
Report = Linked | Stats
_ORDERS: typing.Final = {kind.KIND: kind for kind in (Started, Exited, Broken, Drain)}
_REPORTS: typing.Final = {kind.KIND: kind for kind in (Linked, Stats)}


def encode(message: Order | Report) -> str:
    """``message`` as one line (without its newline)."""
    return json.dumps({"kind": message.KIND} | dataclasses.asdict(message))


def order(line: str | bytes) -> Order:
    """The order ``line`` says.

    :raises BadLine: if it says none, or a field has the wrong type.
    """
    message: Order = _decode(line, _ORDERS)
    return message


def report(line: str | bytes) -> Report:
    """The report ``line`` says.

    :raises BadLine: if it says none, or a field has the wrong type.
    """
    message: Report = _decode(line, _REPORTS)
    return message


def _decode(line: str | bytes, kinds: dict[str, type[Any]]) -> Any:
    try:
        fields = json.loads(line)
    except ValueError:
        raise BadLine(f"not JSON: {line[:200]!r}") from None
    if not isinstance(fields, dict) or fields.get("kind") not in kinds:
        raise BadLine(f"not a message of this pipe: {line[:200]!r}")
    kind = kinds[fields.pop("kind")]
    hints = typing.get_type_hints(kind)
    wanted = {f.name for f in dataclasses.fields(kind)}
    if set(fields) != wanted:
        raise BadLine(f"{line[:200]!r}: a {kind.__name__} has {sorted(wanted)}")
    for name, value in fields.items():
        expected = typing.get_origin(hints[name]) or hints[name]
        if not isinstance(value, expected):
            raise BadLine(f"{line[:200]!r}: {name} is not of type {expected.__name__}")
    return kind(**fields)
