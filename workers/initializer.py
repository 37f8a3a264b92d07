"""A pool's initializer, run once in each worker before its first task (as
``ProcessPoolExecutor(initializer=, initargs=)`` and
``multiprocessing.Pool`` do), and again in every replacement.

It is ``--initializer MODULE:FUNCTION`` with ``--initarg`` strings, or
what ``Pool(initializer=..., initargs=...)`` pickled (any callable, any
arguments: :func:`pickled`). A worker whose initializer raises does not
serve: it writes its failure, an
:class:`~workers.protocol.errors.InitializerFailed` carrying the
initializer's exception and traceback, as one ``INIT-FAILED`` line where
it would have said READY, and exits 1. Its supervisor counts such failures
(:class:`pool.supervisor.children.InitializerFailures`).
"""

from __future__ import annotations

import base64
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Final

from workers import imports
from workers.common import serving
from workers.protocol import codec, shipping
from workers.protocol.errors import InitializerFailed
from workers.protocol.worker_pb2 import Failure

INIT_FAILED_PREFIX: Final = "INIT-FAILED "


def pickled(fn: Callable[..., Any] | str, args: Sequence[Any]) -> str:
    """``fn`` (or its ``module:function`` name, resolved in the worker) and
    ``args`` as ``--initializer-pickle`` takes them."""
    return base64.b64encode(shipping.dumps((fn, tuple(args)))).decode()


def run(
    name: str | None, args: Sequence[str], pickle_text: str | None
) -> Failure | None:
    """Run the initializer, if there is one; None if it returned, else the
    failure to report."""
    if not (name or pickle_text):
        return None
    label = name or "the initializer"
    try:
        if pickle_text:
            fn, call_args = pickle.loads(base64.b64decode(pickle_text))
            if isinstance(fn, str):  # a name given with arguments of any kind
                label, fn = fn, imports.resolve(fn)
            else:
                label = getattr(fn, "__qualname__", None) or repr(fn)
        else:
            assert name is not None
            fn, call_args = imports.resolve(name), tuple(args)
        fn(*call_args)
    except BaseException as exc:  # (its SystemExit too: it is reported)
        return failure_of(label, exc)
    return None


def failure_of(label: str, exc: BaseException) -> Failure:
    """An InitializerFailed failure: the initializer's exception inside (if
    it pickles) and its traceback as the remote one."""
    own: BaseException | None = exc
    try:
        pickle.loads(shipping.dumps(exc))
    except BaseException:
        own = None
    message = (
        f"the pool's initializer {label} raised {type(exc).__name__}: {exc}; "
        f"its workers cannot start, so no task runs (fix it and start the pool again)"
    )
    failure = codec.failure_of(InitializerFailed(message, own), remote=False)
    failure.traceback = "".join(traceback.format_exception(exc))
    return failure


def report(ready_fd: int | None, failure: Failure) -> None:
    """Tell the parent the initializer failed: one ``INIT-FAILED`` line on
    ``ready_fd`` (then closed), or on stdout; and say it on stderr."""
    print(f"worker: error: {failure.message}", file=sys.stderr, flush=True)
    encoded = base64.b64encode(failure.SerializeToString()).decode()
    serving.tell_parent(ready_fd, INIT_FAILED_PREFIX + encoded)
