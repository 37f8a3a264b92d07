"""What each call of a client carries besides the call itself:
:class:`CallOptions`, checked once where they are given (a client's
constructor, or ``client.options(...)``), then put on every task it sends
(:meth:`CallOptions.apply`).

- ``task_timeout_s``: the call's time limit, from when a worker starts it
  (retries included). Over it, a coroutine is cancelled and a plain
  function's worker ends (and is replaced): the call fails with
  :class:`~workers.protocol.errors.TaskTimeout`.
- ``priority``: among the calls waiting in the pool, a higher one starts
  first; equal ones start in the order they came, each client in turn.
- ``retries`` and ``retry_on``: a call that raises one of the exception
  types ``retry_on`` names runs again, at once in the same worker, up to
  ``retries`` more times; the last exception is raised, with a note per
  earlier attempt. Nothing is retried unless named.
- ``tags``: a worker must have each of them.

No I/O; :class:`~pool.client.core.Submissions` applies them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from workers.protocol import shipping
from workers.protocol.worker_pb2 import Task

PRIORITY_RANGE: Final = range(-(2**31), 2**31)  # (a sint32 on the wire)


class CallOptionsGiven(TypedDict, total=False):
    """The per-call options a client, or ``client.options``, takes."""

    tags: Iterable[str]
    task_timeout_s: float | None
    priority: int
    retries: int
    retry_on: type[BaseException] | Iterable[type[BaseException]]


@dataclass(frozen=True)
class CallOptions:
    """A client's per-call options (see the module docstring), checked.

    :raises ValueError: for a bad value, named, with what it takes.
    :raises TypeError: for a value of the wrong type.
    """

    tags: tuple[str, ...] = ()
    task_timeout_s: float | None = None
    priority: int = 0
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = ()
    # The pickle of ``retry_on`` that tasks carry (made once, here).
    _retry_on_pickle: bytes = field(default=b"", init=False, repr=False)

    @classmethod
    def of(
        cls, given: CallOptionsGiven, base: CallOptions | None = None
    ) -> CallOptions:
        """``base`` (the defaults, if None) with what is ``given`` instead."""
        base = base or cls()
        changes: dict[str, Any] = dict(given)
        if "tags" in changes:
            changes["tags"] = _tags(changes["tags"])
        if "retry_on" in changes:
            changes["retry_on"] = _exception_types(changes["retry_on"])
        return dataclasses.replace(base, **changes)

    def __post_init__(self) -> None:
        _check_timeout(self.task_timeout_s)
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise TypeError(f"priority must be an int, got {self.priority!r}")
        if self.priority not in PRIORITY_RANGE:
            raise ValueError(f"priority must fit 32 bits, got {self.priority}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be 0 or more, got {self.retries!r}")
        if self.retries and not self.retry_on:
            raise ValueError(
                f"retries={self.retries} retries nothing without retry_on: name "
                f"the exception types to retry, such as retry_on=(OSError,) "
                f"(retry_on=Exception for any)"
            )
        if self.retries:
            pickled = shipping.dumps(self.retry_on)
            object.__setattr__(self, "_retry_on_pickle", pickled)

    def apply(self, task: Task) -> None:
        """Put these options on ``task`` (its tags go on its submission)."""
        if self.task_timeout_s:
            task.timeout_s = self.task_timeout_s
        if self.priority:
            task.priority = self.priority
        if self.retries:
            task.retries = self.retries
            task.retry_on = self._retry_on_pickle


def _check_timeout(timeout_s: float | None) -> None:
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"task_timeout_s must be seconds, got {timeout_s!r}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(
            f"task_timeout_s must be a positive number of seconds (None: no "
            f"limit), got {timeout_s!r}"
        )


def _tags(tags: Iterable[str]) -> tuple[str, ...]:
    if isinstance(tags, str):
        raise TypeError(f"tags takes an iterable of tags, not the string {tags!r}")
    return tuple(tags)


def _exception_types(
    given: type[BaseException] | Iterable[type[BaseException]],
) -> tuple[type[BaseException], ...]:
    types = (given,) if isinstance(given, type) else tuple(given)
    for kind in types:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise TypeError(f"retry_on takes exception types, got {kind!r}")
    return types
