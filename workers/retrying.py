"""Calls run again when they raise what their client named: a task's
``retries`` and ``retry_on`` (``proto/workers/protocol/worker.proto``;
set by ``client.options(retries=..., retry_on=...)``).

:func:`retrying` wraps a task's callable (each call of a chunk on its
own): a call that raises an instance of one of the ``retry_on`` types runs
again at once, in the same slot, up to ``retries`` more times; the last
exception is raised as itself, with a note that says what each earlier
attempt raised (notes travel with the exception to the client; the
earlier exceptions themselves, and their frames, are let go of). Any
other exception is raised at once. The time limit of the task covers
every attempt. The types are unpickled at the first exception, in the
thread that runs the call, and kept by their pickle
(:data:`MAX_RULES`). Used by :mod:`workers.service`.
"""

from __future__ import annotations

import functools
import inspect
import pickle
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from workers.protocol.errors import BadTask
from workers.protocol.worker_pb2 import Task

MAX_RULES: Final = 256
_rules: OrderedDict[bytes, tuple[type[BaseException], ...]] = OrderedDict()

Fn = Callable[..., Any]


def retrying(fn: Fn, task: Task) -> Fn:
    """``fn``, or with ``task.retries``, ``fn`` run again as the module
    docstring says (a coroutine function stays one)."""
    retries, pickled = task.retries, task.retry_on
    if not retries:
        return fn
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def again_async(*args: Any, **kwargs: Any) -> Any:
            earlier: list[str] = []
            while True:
                try:
                    return await fn(*args, **kwargs)
                except BaseException as exc:
                    _again_or_raise(exc, earlier, retries, pickled)

        return again_async

    @functools.wraps(fn)
    def again(*args: Any, **kwargs: Any) -> Any:
        earlier: list[str] = []
        while True:
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                _again_or_raise(exc, earlier, retries, pickled)

    return again


def _again_or_raise(
    exc: BaseException, earlier: list[str], retries: int, pickled: bytes
) -> None:
    """Return to run the call again (``exc`` noted in ``earlier``), or raise
    ``exc`` (with its note, if it was retried), or a :class:`BadTask` if
    ``retry_on`` does not load."""
    if not isinstance(exc, _retry_on(pickled)):
        raise exc
    if len(earlier) < retries:
        earlier.append(f"{type(exc).__qualname__}: {exc}")
        return
    if earlier:
        lines = (f"  attempt {i}: {text}" for i, text in enumerate(earlier, 1))
        exc.add_note(
            f"retried {retries} time(s); the earlier attempts raised:\n"
            + "\n".join(lines)
        )
    raise exc


def _retry_on(pickled: bytes) -> tuple[type[BaseException], ...]:
    """The exception types a pickle names (kept once loaded).

    :raises BadTask: if it does not load, or names something else.
    """
    if (types := _rules.get(pickled)) is not None:
        _rules.move_to_end(pickled)
        return types
    try:
        types = pickle.loads(pickled)
    except Exception as exc:
        raise BadTask(f"the task's retry_on does not load here: {exc!r}") from None
    if not (
        isinstance(types, tuple)
        and all(isinstance(t, type) and issubclass(t, BaseException) for t in types)
    ):
        raise BadTask(f"the task's retry_on is not exception types: {types!r}")
    _rules[pickled] = types
    while len(_rules) > MAX_RULES:
        _rules.popitem(last=False)
    return types
