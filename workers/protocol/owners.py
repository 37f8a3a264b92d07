"""Who owns which segment of the data plane (:mod:`workers.protocol.segments`),
told by a lock the kernel releases at death; and the reaper of what the
dead leave.

Names, in /dev/shm beside the segments they own::

    <key>.<owner>                  an owner's lock: an empty file on which its
                                   process holds an exclusive flock for life
    <key>.<owner>.<writer>.<tag>   a segment, owned by <owner> and written by
                                   <writer>: the owner itself (arguments, a
                                   ``put``), or a worker (a result)

Owners and writers are :class:`DataOwner` s, 16 hex digits drawn at random
for each client and each worker. Who owns a segment is told by its name
and that lock, which the kernel releases when the owner dies, however it
dies; never by a pid (a pid is reused, and means nothing in another
container sharing /dev/shm). :func:`reap` removes what dead owners left,
and what a dead writer left half-written; owners unlink the rest when its
life ends (:class:`pool.client.store.Store` says when).

Callers: :mod:`workers.protocol.payload` and the client's store (to write),
the supervisor (:func:`reap`, every second), a pool as it starts,
``pool ls --clean``.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import secrets
from collections.abc import Sequence
from typing import Final

from discovery import paths
from workers.protocol import segments
from workers.protocol.errors import SharedMemoryFull
from workers.protocol.segments import (
    CREATE,
    ID_RE,
    KEY_RE,
    READ,
    SEGMENT_RE,
    SHM_DIR,
    Written,
)

LOCK_RE: Final = re.compile(rf"({KEY_RE})\.({ID_RE})(\.new)?")


class DataOwner:
    """This process's name in one namespace's data plane (see the module
    docstring), and its lock, held until :meth:`close`.

    :param limit_bytes: the most the namespace's segments may hold at once
        (the pool's ``--shm-limit``); None: what /dev/shm has.
    """

    def __init__(self, namespace: str, *, limit_bytes: int | None = None) -> None:
        self.key = paths.segment_name(namespace)
        self.limit_bytes = limit_bytes
        self.id, self._lock_fd = _claim(self.key)
        self._serial = itertools.count(1)

    @property
    def prefix(self) -> str:
        """What the names of the segments it owns start with."""
        return f"{self.key}.{self.id}."

    def name(self, owner: str, tag: str) -> str:
        """A new segment's name: owned by ``owner``, written by this one."""
        return f"{self.key}.{owner}.{self.id}.{tag}-{next(self._serial):x}"

    def owns(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def write(self, name: str, parts: Sequence[memoryview | bytes]) -> Written:
        """Create the segment ``name`` holding ``parts``.

        :raises SharedMemoryFull: if it does not fit (nothing is left of it).
        """
        self.check_room(segments.layout(parts)[0])
        return segments.create(name, parts)

    def rewrite(
        self,
        name: str,
        parts: Sequence[memoryview | bytes],
        expect: int = 0,
        maps: segments.Mappings | None = None,
    ) -> Written | None:
        """Write ``parts`` into the existing segment ``name``, whose pages are
        in memory already (:func:`workers.protocol.segments.rewrite`); None
        if a reader maps it, or (``expect``) it no longer holds that nonce.

        :raises SharedMemoryFull: if it must grow and does not fit.
        """
        return segments.rewrite(name, parts, expect, self.check_room, maps)

    def check_room(self, size: int) -> None:
        """:raises SharedMemoryFull: unless ``size`` more bytes fit."""
        free = segments.free_bytes()
        if size > free:
            raise SharedMemoryFull(size, free, str(SHM_DIR))
        if self.limit_bytes is not None:
            left = self.limit_bytes - used_bytes(self.key)
            if size > left:
                where = f"the pool's --shm-limit of {self.limit_bytes} bytes"
                raise SharedMemoryFull(size, max(0, left), where)

    def close(self) -> None:
        """Unlink every segment it owns, then its lock. Never raises."""
        if self._lock_fd < 0:
            return
        for name in names(self.prefix):
            segments.unlink(name)
        segments.unlink(f"{self.key}.{self.id}")
        os.close(self._lock_fd)
        self._lock_fd = -1


def _claim(key: str) -> tuple[str, int]:
    """A fresh owner id and the descriptor holding its lock. The lock file
    is made and locked under a temporary name, then linked into place, so
    that no reaper ever sees it unlocked."""
    for _ in range(8):
        owner = secrets.token_hex(8)
        new = SHM_DIR / f"{key}.{owner}.new"
        fd = os.open(new, CREATE, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.link(new, SHM_DIR / f"{key}.{owner}")
        except OSError:  # a reaper removed it before it was locked: again
            os.close(fd)
            continue
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new)
        return owner, fd
    raise RuntimeError(f"could not make a data-plane lock in {SHM_DIR}")


def names(prefix: str) -> list[str]:
    """The names in /dev/shm that start with ``prefix`` (a scan of it: a
    list, so that a caller can make it on another thread)."""
    with contextlib.suppress(OSError), os.scandir(SHM_DIR) as entries:
        return [entry.name for entry in entries if entry.name.startswith(prefix)]
    return []


def total_bytes() -> int:
    """The size of /dev/shm."""
    st = os.statvfs(SHM_DIR)
    return st.f_blocks * st.f_frsize


def used_bytes(key: str) -> int:
    """What the data segments of the namespace of ``key`` hold now."""
    used = 0
    for name in names(f"{key}."):
        with contextlib.suppress(OSError):
            used += os.stat(SHM_DIR / name, follow_symlinks=False).st_size
    return used


def reap(key: str | None = None) -> list[str]:
    """Unlink what dead owners left (of the namespace of ``key``, or of
    every namespace of this user's): their segments and their locks; and
    segments that a dead writer did not finish. Never raises.

    :returns: the names removed.
    """
    written: list[tuple[str, str, str]] = []  # name, owner, writer
    locks: dict[str, list[str]] = {}  # owner: its lock files
    for name in names(f"{key}." if key else paths.SEGMENT_PREFIX):
        if found := SEGMENT_RE.fullmatch(name):
            written.append((name, found[2], found[3]))
        elif found := LOCK_RE.fullmatch(name):
            locks.setdefault(found[2], []).append(name)
    alive = {owner: _held(locks.get(owner, ())) for owner in locks}
    removed = []
    for name, owner, writer in written:
        if _mine(name) and (
            not alive.get(owner, False)
            or (not alive.get(writer, False) and not segments.finished(name))
        ):
            segments.unlink(name)
            removed.append(name)
    for owner, lock_names in locks.items():
        if not alive[owner]:
            for name in lock_names:
                segments.unlink(name)
                removed.append(name)
    return removed


def _held(lock_names: Sequence[str]) -> bool:
    """Whether a live process holds one of an owner's lock files."""
    for name in lock_names:
        try:
            fd = os.open(SHM_DIR / name, READ)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                return True  # another user's: not ours to judge
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            continue
        finally:
            os.close(fd)  # (releases the lock if we took it)
    return False


def _mine(name: str) -> bool:
    """Whether a name in /dev/shm is this user's (root may remove any)."""
    try:
        return os.stat(SHM_DIR / name, follow_symlinks=False).st_uid == os.geteuid()
    except OSError:
        return False
