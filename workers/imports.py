"""Finding a task's callable in a worker: by name, ``"module:qualname"``,
or shipped by value (:mod:`workers.protocol.shipping`).

Owns the worker's table of resolved names. Importing runs a module's code,
and unpickling a shipped function may import too, which may take any time,
so :func:`find` runs off the event loop (:mod:`workers.service` calls it
through its :class:`~workers.common.offload.Offload`) unless :func:`found`
already has it.

With ``--reload`` (:func:`reload_changed`), a module whose source file has
changed since it was imported is imported again before its next task, so an
edited ``tasks.py`` takes effect without a restart. Only the task's own
module is reloaded, not the modules it imports; objects made by the old
module (instances, closures) keep the old code, as ``importlib.reload``
says.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from workers.protocol import shipping
from workers.protocol.errors import BadTask, FunctionNotFound, NotCallable
from workers.protocol.worker_pb2 import Task

Stamp = tuple[int, int] | None  # a source file's (mtime ns, size)


class _Resolved(NamedTuple):
    fn: Callable[..., Any]
    source: str | None
    stamp: Stamp


_resolved: dict[str, _Resolved] = {}
_stamps: dict[str, Stamp] = {}  # by module name, when it was last imported
_reload = False
_reloading = threading.Lock()


def found(task: Task) -> Callable[..., Any] | None:
    """The task's callable if this worker has it at hand: no import, no
    unpickling."""
    if task.digest:
        return shipping.loaded(task.digest)
    return resolved(task.function)


def find(task: Task, code: bytes) -> Callable[..., Any]:
    """The task's callable: imported by name, or unpickled from ``code``.

    :raises BadTask: (a subclass that names the condition) if there is none.
    """
    if not task.digest:
        return resolve(task.function)
    try:
        fn = shipping.load_function(task.digest, code)
    except ImportError as exc:
        raise FunctionNotFound(
            f"the function shipped by value needs module {exc.name!r}, which "
            f"the worker cannot import ({exc}); {shipping.where_imports_look()}"
        ) from None
    except Exception as exc:
        raise BadTask(
            f"the function shipped by value does not unpickle in the worker: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not callable(fn):
        kind = type(fn).__name__
        raise NotCallable(f"the shipped object is a {kind}, not a callable")
    return fn  # type: ignore[no-any-return]


def reload_changed(on: bool = True) -> None:
    """Re-import a task's module whose source changed (``--reload``)."""
    global _reload
    _reload = on


def resolved(name: str) -> Callable[..., Any] | None:
    """The callable ``name`` if it has been resolved before and (with
    reload) its source has not changed since: no import."""
    hit = _resolved.get(name)
    if hit is None:
        return None
    if _reload and hit.source is not None and _stamp(hit.source) != hit.stamp:
        return None
    return hit.fn


def resolve(name: str) -> Callable[..., Any]:
    """Import the callable ``module:qualname`` (remembered once it resolves).

    :raises BadTask: if ``name`` is not of the form ``module:qualname``.
    :raises FunctionNotFound: if it does not import; the message says where
        the worker looks, and how to add to that.
    :raises NotCallable: if it is not callable.
    """
    module_name, sep, qualname = name.partition(":")
    dotted = (module_name.split("."), qualname.split("."))
    if not sep or not all(part.isidentifier() for names in dotted for part in names):
        raise BadTask(
            f"task function {name!r} is not of the form module:qualname "
            f"(dotted Python names)"
        )
    try:
        module = _import(module_name)
    except ImportError as exc:
        raise FunctionNotFound(
            f"cannot import module {module_name!r}: {exc}; "
            f"{shipping.where_imports_look()}"
        ) from None
    except (Exception, SystemExit) as exc:  # it ran and raised: the worker goes on
        raise FunctionNotFound(
            f"importing module {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    target: Any = module
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except Exception:
            raise FunctionNotFound(
                f"module {module_name!r} has no {qualname!r}"
            ) from None
    if not callable(target):
        raise NotCallable(f"{name!r} is a {type(target).__name__}, not a callable")
    source = getattr(module, "__file__", None)
    _resolved[name] = _Resolved(target, source, _stamps.get(module_name))
    return target  # type: ignore[no-any-return]


def _import(module_name: str) -> ModuleType:
    # Through the import system even when in sys.modules: another thread
    # may be importing it still (a module is listed before its code has run).
    module = importlib.import_module(module_name)
    source = getattr(module, "__file__", None)
    if not _reload or source is None:
        return module
    with _reloading:  # one reload at a time, whoever asks first
        stamp = _stamp(source)
        if stamp != _stamps.setdefault(module_name, stamp):
            # Its cached bytecode is checked by whole-second mtime and size:
            # an edit within the second that keeps the size would not show.
            with contextlib.suppress(OSError, NotImplementedError, ValueError):
                os.unlink(importlib.util.cache_from_source(source))
            module = importlib.reload(module)
            _stamps[module_name] = stamp
    return module


def _stamp(source: str | None) -> Stamp:
    if source is None:
        return None
    try:
        st = os.stat(source)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
