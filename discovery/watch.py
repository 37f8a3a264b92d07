"""One watchdog observer per process, shared by every subscriber in it.

Each observed directory costs an inotify instance, and a user has 128 by
default, so a process watches each directory once however many
subscribers follow it, and stops its observer when the last one leaves.
Callers register a callback for a directory and, optionally, the names of
entries inside it they care about; a callback runs on the observer thread
and must only hand off (``loop.call_soon_threadsafe``).

When no observer can be had (the inotify limits), :func:`watch` returns
None once with a warning per process, and callers fall back to polling.
Owned here: the observer thread and its watches. Caller: :mod:`subscriber`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from watchdog.events import DirDeletedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

log = logging.getLogger(__name__)


class _StoppedEmitter(logging.Filter):
    """Drops what watchdog's inotify emitter logs at ERROR when it is
    stopped while it waits for an event (a race inside watchdog, seen on a
    double Ctrl-C and when an embedded pool stops): nothing is lost, the
    watch is going away."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


logging.getLogger("watchdog.observers.inotify").addFilter(_StoppedEmitter())

Callback = Callable[[], None]


@dataclass(eq=False)
class Handle:
    """A registration returned by :func:`watch`; pass it to :func:`unwatch`."""

    directory: str
    names: frozenset[str] | None
    callback: Callback


@dataclass(eq=False)
class _Directory(FileSystemEventHandler):
    path: str
    handles: list[Handle] = field(default_factory=list)
    watch: ObservedWatch | None = None
    dead: bool = False

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Runs on the observer thread, under the observer's lock: take no
        # lock of ours here (watch() takes ours, then the observer's).
        src = os.fsdecode(event.src_path)
        if isinstance(event, DirDeletedEvent) and src == self.path:
            self.dead = True  # the watch went with the directory
        name = os.path.basename(src)
        for handle in list(self.handles):
            if handle.names is None or name in handle.names or src == self.path:
                handle.callback()


_lock = threading.Lock()
_observer: BaseObserver | None = None
_directories: dict[str, _Directory] = {}
_warned = False


def watch(
    directory: Path, callback: Callback, names: frozenset[str] | None = None
) -> Handle | None:
    """Call ``callback`` on changes to ``names`` in ``directory`` (any, if None).

    :returns: a handle, or None if the directory cannot be watched (missing,
        or no inotify instance to be had).
    """
    global _observer, _warned
    key = os.fspath(directory)
    handle = Handle(key, names, callback)
    with _lock:
        entry = _directories.get(key)
        if entry is not None and entry.dead:
            _unschedule(entry)
            entry = None
        if entry is None:
            entry = _Directory(key)
            try:
                if _observer is None:
                    _observer = Observer()
                    _observer.daemon = True
                    _observer.start()
                entry.watch = _observer.schedule(entry, key, recursive=False)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if not _warned:
                    _warned = True
                    log.warning(
                        "cannot watch %s (%s); subscribers poll instead", key, exc
                    )
                return None
            _directories[key] = entry
        entry.handles.append(handle)
    return handle


def alive(handle: Handle | None) -> TypeGuard[Handle]:
    """True while the handle's directory is still watched."""
    if handle is None:
        return False
    entry = _directories.get(handle.directory)
    return entry is not None and not entry.dead and handle in entry.handles


def unwatch(handle: Handle | None) -> None:
    """Undo :func:`watch`; the last handle of the process stops the observer."""
    if handle is None:
        return
    with _lock:
        entry = _directories.get(handle.directory)
        if entry is None or handle not in entry.handles:
            return
        entry.handles.remove(handle)
        if not entry.handles:
            _unschedule(entry)
        _stop_if_idle()


def _unschedule(entry: _Directory) -> None:
    _directories.pop(entry.path, None)
    if _observer is not None and entry.watch is not None:
        # The emitter may already have gone with its directory.
        with contextlib.suppress(KeyError, OSError):
            _observer.unschedule(entry.watch)


def _stop_if_idle() -> None:
    global _observer
    if _observer is not None and not _directories:
        observer, _observer = _observer, None
        observer.stop()
        observer.join(timeout=5)
