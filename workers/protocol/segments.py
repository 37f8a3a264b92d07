"""Shared-memory segments of the data plane: the bytes of one, where large
payloads lie. Who owns which, and who removes them, is
:mod:`workers.protocol.owners`.

Every name is in /dev/shm and starts with its namespace's key (the name of
the namespace's registry, ``shmp-<hash>``, which hashes the user in), so
``ls /dev/shm`` shows a leak at a glance (:data:`SEGMENT_RE`)::

    <key>.<owner>.<writer>.<tag>   a segment, owned by <owner> and written by
                                   <writer> (see workers.protocol.owners)

A segment is a header page (magic, nonce, size), then its parts, each at a
page boundary. Its writer creates it with ``O_EXCL``, writes the parts with
``pwrite`` (so a full /dev/shm is ``ENOSPC``, never a SIGBUS) and the
header last: a reader that finds the magic and the nonce it was given reads
a whole payload. Readers map it copy-on-write (``MAP_PRIVATE``): their views
are writable, and a write copies only the pages written, which nobody else
sees. A reader holds a shared flock for as long as it maps the segment (the
mapping keeps its open file, and so the lock, until it is unmapped). Its
owner may write a segment again (:func:`rewrite`: its pages are in memory
already, which makes the write several times cheaper) only under the
exclusive lock, so never while a reader maps it, and under a new nonce, so
that a reader of what it held before finds another payload, never a
mixture.

Callers: :mod:`workers.protocol.owners` (writes), :mod:`workers.protocol.payload`
(reads), both ends of a stream.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import mmap
import os
import re
import secrets
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from discovery import paths
from workers.protocol.errors import DataGone, SharedMemoryFull

SHM_DIR: Final = paths.SHM_DIR
PAGE: Final = mmap.PAGESIZE
HEADER: Final = struct.Struct("<8sQQ")  # magic, nonce, size
MAGIC: Final = b"shmpdat1"
WRITE_CHUNK: Final = 64 << 20  # bytes per pwrite (Linux caps one at ~2 GiB)
COMPARE_CHUNK: Final = 4 << 20

KEY_RE: Final = r"shmp-[0-9a-f]{24}"
ID_RE: Final = r"[0-9a-f]{16}"
SEGMENT_RE: Final = re.compile(
    rf"({KEY_RE})\.({ID_RE})\.({ID_RE})\.([a-z0-9-]{{1,40}})"
)
CREATE: Final = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


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


def create(name: str, parts: Sequence[memoryview | bytes]) -> Written:
    """Create the segment ``name`` holding ``parts``.

    :raises SharedMemoryFull: if /dev/shm runs out (nothing is left of it).
    """
    size, offsets = layout(parts)
    nonce = secrets.randbits(64)
    _create(name, size, parts, offsets, HEADER.pack(MAGIC, nonce, size))
    return Written(name, nonce, size, offsets)


class Mappings:
    """Writable mappings of the segments a process writes again and again
    (a client's spares), kept so that a rewrite is a plain memory copy: the
    page tables of a new mapping cost about as much as the copy (measured:
    0.05 s for 256 MB through a new mapping, 0.03 s through a kept one).
    Its owner drops each with its segment. Thread-safe for distinct names."""

    def __init__(self) -> None:
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}

    def get(self, name: str, fd: int, size: int) -> mmap.mmap:
        """The mapping of ``fd`` (the segment ``name``, ``size`` bytes)."""
        inode = os.fstat(fd).st_ino
        kept = self._maps.get(name)
        if kept is not None and kept[0] == inode and len(kept[1]) == size:
            return kept[1]
        self.drop(name)
        # Through an open file of its own: the mapping keeps the file it is
        # made from open, and ``fd``'s holds the writer's lock (readers
        # would find it held for as long as the mapping lives).
        own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            mapped = mmap.mmap(own, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(own)
        self._maps[name] = (inode, mapped)
        return mapped

    def drop(self, name: str) -> None:
        if (kept := self._maps.pop(name, None)) is not None:
            kept[1].close()

    def clear(self) -> None:
        for name in list(self._maps):
            self.drop(name)


def rewrite(
    name: str,
    parts: Sequence[memoryview | bytes],
    expect: int = 0,
    room: Callable[[int], None] = lambda grow: None,
    maps: Mappings | None = None,
) -> Written | None:
    """Write ``parts`` into the existing segment ``name``, resized, under a
    new nonce (through ``maps``' mapping of it, if given). None if a reader
    maps it, or (``expect``) its header no longer holds that nonce. ``room``
    checks that it may grow by so many bytes.

    :raises SharedMemoryFull: if it must grow and does not fit.
    """
    size, offsets = layout(parts)
    nonce = secrets.randbits(64)
    with _locked(name) as fd:
        if fd is None or (expect and _nonce(fd) != expect):
            return None
        if (grow := size - os.fstat(fd).st_size) > 0:
            room(grow)
        os.pwrite(fd, bytes(HEADER.size), 0)  # (not whole while rewritten)
        if grow:
            os.ftruncate(fd, size)
        header = HEADER.pack(MAGIC, nonce, size)
        if grow > 0:  # (fresh pages: pwrite, where a full /dev/shm is ENOSPC)
            if maps is not None:
                maps.drop(name)
            _fill(fd, size, parts, offsets, header)
        else:  # (every page there: a mapping is the fastest way in)
            mapped = maps.get(name, fd, size) if maps is not None else None
            _copy_in(fd, size, parts, offsets, header, mapped)
    return Written(name, nonce, size, offsets)


def stamp(name: str) -> Written | None:
    """Give the existing segment ``name`` a new nonce, as it is lent to a
    task for its value (its writer expects that nonce); None if a reader
    maps it."""
    nonce = secrets.randbits(64)
    with _locked(name) as fd:
        if fd is None:
            return None
        size = os.fstat(fd).st_size
        os.pwrite(fd, HEADER.pack(MAGIC, nonce, size), 0)
    return Written(name, nonce, size, ())


def layout(parts: Sequence[memoryview | bytes]) -> tuple[int, tuple[int, ...]]:
    """The size of a segment holding ``parts``, and where each starts (after
    the header page, each at a page boundary)."""
    offsets = []
    size = PAGE
    for part in parts:
        offsets.append(size)
        size += -(-memoryview(part).nbytes // PAGE) * PAGE
    return size, tuple(offsets)


def _create(
    name: str,
    size: int,
    parts: Sequence[memoryview | bytes],
    offsets: Sequence[int],
    header: bytes,
) -> None:
    path = SHM_DIR / check_name(name)
    fd = os.open(path, CREATE, 0o600)
    try:
        os.ftruncate(fd, size)
        _fill(fd, size, parts, offsets, header)
    except BaseException:
        unlink(name)
        raise
    finally:
        os.close(fd)


def _fill(
    fd: int,
    size: int,
    parts: Sequence[memoryview | bytes],
    offsets: Sequence[int],
    header: bytes,
) -> None:
    """Write the parts, then the header: the segment is whole from then on.

    :raises SharedMemoryFull: if /dev/shm runs out on the way.
    """
    try:
        for part, offset in zip(parts, offsets, strict=True):
            _pwrite_all(fd, memoryview(part).cast("B"), offset)
        os.pwrite(fd, header, 0)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise SharedMemoryFull(size, free_bytes(), str(SHM_DIR)) from None
        raise


def _copy_in(
    fd: int,
    size: int,
    parts: Sequence[memoryview | bytes],
    offsets: Sequence[int],
    header: bytes,
    mapped: mmap.mmap | None = None,
) -> None:
    """:func:`_fill` by a memory copy into ``mapped``, or a new mapping
    populated at once (measured: 0.05 s for 256 MB where ``pwrite`` takes
    0.07 s); for pages that exist already (a new page would be a SIGBUS on a
    full /dev/shm)."""
    flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
    with contextlib.ExitStack() as stack:
        if mapped is None:
            mapped = stack.enter_context(mmap.mmap(fd, size, flags=flags))
        view = stack.enter_context(memoryview(mapped))
        for part, offset in zip(parts, offsets, strict=True):
            data = memoryview(part).cast("B")
            view[offset : offset + data.nbytes] = data
        view[: len(header)] = header


@contextlib.contextmanager
def _locked(name: str) -> Iterator[int | None]:
    """An existing segment open for writing, under its exclusive lock; None
    if it is gone or a reader maps it."""
    path = SHM_DIR / check_name(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        paths.check_segment_owner(path, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


def _nonce(fd: int) -> int:
    magic, nonce, _ = HEADER.unpack(os.pread(fd, HEADER.size, 0).ljust(HEADER.size))
    return nonce if magic == MAGIC else 0


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
        fd = os.open(path, READ)
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
        fd = os.open(SHM_DIR / check_name(name), READ)
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


def rename(old: str, new: str) -> None:
    """Give a segment another name (its mappings and pages stay as they are).

    :raises OSError: if it is gone.
    """
    os.rename(SHM_DIR / check_name(old), SHM_DIR / check_name(new))


def unlink(name: str) -> None:
    """Remove a name from /dev/shm (its memory goes once nobody maps it).
    Never raises."""
    with contextlib.suppress(OSError):
        os.unlink(SHM_DIR / name)


def free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def finished(name: str) -> bool:
    try:
        fd = os.open(SHM_DIR / name, READ)
    except OSError:
        return True  # gone already
    try:
        return os.pread(fd, len(MAGIC), 0) == MAGIC
    finally:
        os.close(fd)
