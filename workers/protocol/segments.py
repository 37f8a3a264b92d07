"""Shared-memory segments of the data plane: where large payloads lie.

Every name is in /dev/shm and starts with its namespace's key (the name of
the namespace's registry, ``shmp-<hash>``, which hashes the user in), so
``ls /dev/shm`` shows a leak at a glance and each namespace's are told
apart::

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
life ends (:mod:`workers.protocol.payload` says when).

A segment is a header page (magic, nonce, size), then its parts, each at a
page boundary. Its writer creates it with ``O_EXCL``, writes the parts with
``pwrite`` (so a full /dev/shm is ``ENOSPC``, never a SIGBUS) and the
header last: a reader that finds the magic and the nonce it was given reads
a whole payload. Readers map it copy-on-write (``MAP_PRIVATE``): their views
are writable, and a write copies only the pages written, which nobody else
sees. A reader holds a shared flock for as long as it maps the segment (the
mapping keeps its open file, and so the lock, until it is unmapped).

Callers: :mod:`workers.protocol.payload` (both ends of a stream), the
supervisor (:func:`reap`, every second), a pool as it starts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import itertools
import logging
import mmap
import os
import re
import secrets
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from discovery import paths
from workers.protocol.errors import DataGone, SharedMemoryFull

log = logging.getLogger(__name__)

SHM_DIR: Final = paths.SHM_DIR
PAGE: Final = mmap.PAGESIZE
HEADER: Final = struct.Struct("<8sQQ")  # magic, nonce, size
MAGIC: Final = b"shmpdat1"
WRITE_CHUNK: Final = 64 << 20  # bytes per pwrite (Linux caps one at ~2 GiB)
COMPARE_CHUNK: Final = 4 << 20

_KEY: Final = r"shmp-[0-9a-f]{24}"
_ID: Final = r"[0-9a-f]{16}"
SEGMENT_RE: Final = re.compile(rf"({_KEY})\.({_ID})\.({_ID})\.([a-z0-9-]{{1,40}})")
LOCK_RE: Final = re.compile(rf"({_KEY})\.({_ID})(\.new)?")
_CREATE: Final = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@functools.cache
def host_id() -> str:
    """Who can map what this process writes: the same kernel (its boot),
    the same /dev/shm (containers sharing one see the same device and
    inode) and the same user (segments are ``0600``)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "?"
    st = os.stat(SHM_DIR)
    where = f"{boot}:{st.st_dev}:{st.st_ino}:{os.geteuid()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]  # (short: per task)


@dataclass(frozen=True, slots=True)
class Written:
    """A segment as its writer made it: where each part lies in it."""

    name: str
    nonce: int
    size: int
    offsets: tuple[int, ...]


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
        offsets = []
        size = PAGE
        for part in parts:
            offsets.append(size)
            size += -(-memoryview(part).nbytes // PAGE) * PAGE
        self.check_room(size)
        nonce = secrets.randbits(64)
        _create(name, size, parts, offsets, HEADER.pack(MAGIC, nonce, size))
        return Written(name, nonce, size, tuple(offsets))

    def check_room(self, size: int) -> None:
        """:raises SharedMemoryFull: unless ``size`` more bytes fit."""
        free = free_bytes()
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
            unlink(name)
        unlink(f"{self.key}.{self.id}")
        os.close(self._lock_fd)
        self._lock_fd = -1


def _claim(key: str) -> tuple[str, int]:
    """A fresh owner id and the descriptor holding its lock. The lock file
    is made and locked under a temporary name, then linked into place, so
    that no reaper ever sees it unlocked."""
    for _ in range(8):
        owner = secrets.token_hex(8)
        new = SHM_DIR / f"{key}.{owner}.new"
        fd = os.open(new, _CREATE, 0o600)
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


def _create(
    name: str,
    size: int,
    parts: Sequence[memoryview | bytes],
    offsets: Sequence[int],
    header: bytes,
) -> None:
    path = SHM_DIR / check_name(name)
    fd = os.open(path, _CREATE, 0o600)
    try:
        os.ftruncate(fd, size)
        for part, offset in zip(parts, offsets, strict=True):
            _pwrite_all(fd, memoryview(part).cast("B"), offset)
        os.pwrite(fd, header, 0)  # last: the segment is whole from now on
    except BaseException as exc:
        unlink(name)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise SharedMemoryFull(size, free_bytes(), str(SHM_DIR)) from None
        raise
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < data.nbytes:
        done += os.pwrite(fd, data[done : done + WRITE_CHUNK], offset + done)


def check_name(name: str) -> str:
    """``name`` if it is a data segment's name (never a path elsewhere).

    :raises DataGone: if it is not.
    """
    if not SEGMENT_RE.fullmatch(name):
        raise DataGone(name, "is not the name of a shm-pool data segment")
    return name


def attach(name: str, nonce: int, size: int) -> mmap.mmap:
    """Map a whole segment copy-on-write, holding its reader's lock for as
    long as the mapping lives.

    :raises DataGone: if it is not there, or holds another payload.
    """
    path = SHM_DIR / check_name(name)
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        raise DataGone(name, "is not in /dev/shm") from None
    try:
        paths.check_segment_owner(path, fd)
        try:
            # flock, not lockf: the lock belongs to the open file, which the
            # mapping keeps (portalocker may be set to use either).
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataGone(name, "is being written again") from None
        if os.pread(fd, HEADER.size, 0) != HEADER.pack(MAGIC, nonce, size):
            raise DataGone(name, "holds another payload, or was never finished")
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=prot)
    finally:
        os.close(fd)


def same_content(name: str, offset: int, data: memoryview) -> bool:
    """Whether the segment ``name`` holds ``data`` at ``offset`` (read with
    ``pread``, a few MiB at a time: nothing of it is mapped here)."""
    data = data.cast("B")
    try:
        fd = os.open(SHM_DIR / check_name(name), _READ)
    except FileNotFoundError:
        return False
    try:
        scratch = bytearray(min(COMPARE_CHUNK, data.nbytes))
        for at in range(0, data.nbytes, COMPARE_CHUNK):
            part = data[at : at + COMPARE_CHUNK]
            if part.nbytes < len(scratch):
                del scratch[part.nbytes :]
            # (bytearray == compares with memcmp; memoryview == item by item)
            if os.preadv(fd, [scratch], offset + at) != part.nbytes or scratch != part:
                return False
        return True
    finally:
        os.close(fd)


def unlink(name: str) -> None:
    """Remove a name from /dev/shm (its memory goes once nobody maps it).
    Never raises."""
    with contextlib.suppress(OSError):
        os.unlink(SHM_DIR / name)


def names(prefix: str) -> Iterator[str]:
    """The names in /dev/shm that start with ``prefix``."""
    with contextlib.suppress(OSError), os.scandir(SHM_DIR) as entries:
        for entry in entries:
            if entry.name.startswith(prefix):
                yield entry.name


def free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


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
    segments: list[tuple[str, str, str]] = []
    locks: dict[str, list[str]] = {}  # owner: its lock files
    for name in names(f"{key}." if key else paths.SEGMENT_PREFIX):
        if found := SEGMENT_RE.fullmatch(name):
            segments.append((name, found[2], found[3]))
        elif found := LOCK_RE.fullmatch(name):
            locks.setdefault(found[2], []).append(name)
    alive = {owner: _held(locks.get(owner, ())) for owner in locks}
    removed = []
    for name, owner, writer in segments:
        if _mine(name) and (
            not alive.get(owner, False)
            or (not alive.get(writer, False) and not _finished(name))
        ):
            unlink(name)
            removed.append(name)
    for owner, lock_names in locks.items():
        if not alive[owner]:
            for name in lock_names:
                unlink(name)
                removed.append(name)
    return removed


def _held(lock_names: Sequence[str]) -> bool:
    """Whether a live process holds one of an owner's lock files."""
    for name in lock_names:
        try:
            fd = os.open(SHM_DIR / name, _READ)
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


def _finished(name: str) -> bool:
    try:
        fd = os.open(SHM_DIR / name, _READ)
    except OSError:
        return True  # gone already
    try:
        return os.pread(fd, len(MAGIC), 0) == MAGIC
    finally:
        os.close(fd)
