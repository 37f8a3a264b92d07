"""The shared-memory registry of one namespace, and its lock.

The only module that touches shared memory or the registry lock. Callers:
:mod:`discovery.local` (creates and owns a namespace), :mod:`publisher`
(writes under the lock) and :mod:`subscriber` (reads without it).

One segment per namespace, ``/dev/shm/shmp-<hash>``, mapped with
``os.open`` + ``mmap`` so that no resource tracker ever hears of it (on
Python < 3.13, ``SharedMemory(name)`` would let a killed attacher's tracker
unlink a segment it does not own). Only the creator unlinks; it holds a
shared ``flock`` on the segment for as long as it has the registry open,
taken before the header is written, so that a registry nobody holds, whose
creator is gone, is known for garbage wherever its pool's runtime
directory was (:func:`discovery.ownership.reap_registries`). Layout, all
little-endian, every field 8-byte aligned::

    header  64 B   magic, layout version, capacity, block size, ring size,
                   state, owner pid, generation (bumped on every change)
    ring    R x 8  the slot changed at generation g, at index g % R,
                   packed (g << 24) | slot: a reader that is fewer than R
                   changes behind reads only the slots that changed
    slots   capacity x (40 B + block)
                   version, uid, pid and pid namespace of the publishing
                   process (see liveness.py), length, the encoded WorkerInfo

Writers hold the exclusive lock file (portalocker, non-blocking attempts
with capped back-off, bounded by a deadline). Readers take no lock: a slot
is a seqlock. Its version is odd while a write is under way; a reader
copies the slot and keeps the copy only if the version was even and
unchanged around it. Limits: at most 2**24 slots; generations wrap after
2**40 changes, long after any pool's life.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
from contextlib import suppress
from typing import Self
from uuid import UUID

from discovery import paths
from discovery.errors import (
    NamespaceNotFound,
    RegistryCorrupt,
    RegistryMismatch,
    UnsafeRuntimeDirectory,
)
from discovery.layout import (
    GENERATION_OFFSET,
    HEADER,
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    MAX_BLOCK_SIZE,
    MAX_CAPACITY,
    NULL_UID,
    OWNER_OFFSET,
    RING_GEN_MASK,
    RING_SLOT_MASK,
    SLOT,
    SLOT_BODY,
    STATE_CLOSED,
    STATE_OFFSET,
    STATE_OPEN,
    U32,
    U64,
    U64_MASK,
    SlotRead,
    ring_size_for,
    segment_size,
    slot_stride,
)
from discovery.paths import check_segment_owner

log = logging.getLogger(__name__)


class Registry:
    """A mapping of one namespace's segment.

    Use :meth:`create` or :meth:`attach`; :meth:`close` releases the
    mapping, and only the creator calls :meth:`unlink`.
    """

    def __init__(self, namespace: str, fd: int, created: bool) -> None:
        self.namespace = namespace
        self.created = created
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)
        size = st.st_size
        try:
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._buf: memoryview | None = memoryview(self._mmap)
        self._held = -1  # the creator's lock on the segment (see the module)
        self.capacity = 0
        self.block_size = 0
        self.ring_size = 0
        self._slots_at = 0
        self._stride = 0

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def create(cls, namespace: str, *, capacity: int, block_size: int) -> Self:
        """Create the namespace's segment; the caller holds the lock.

        :raises FileExistsError: if the segment already exists.
        """
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be 1 to {MAX_CAPACITY}, got {capacity}")
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise ValueError(
                f"block_size must be 1 to {MAX_BLOCK_SIZE}, got {block_size}"
            )
        path = paths.SHM_DIR / paths.segment_name(namespace)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # (the creator's, for the registry's life)
            os.ftruncate(fd, segment_size(capacity, block_size))
            held = os.dup(fd)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        self = cls(namespace, fd, created=True)
        self._held = held
        ring = ring_size_for(capacity)
        fields = (b"", LAYOUT_VERSION, capacity, block_size, ring, STATE_OPEN)
        HEADER.pack_into(self._view, 0, *fields, os.getpid(), 0)
        self._view[:8] = MAGIC  # last: an attacher waits for it
        self._load_header()
        return self

    @classmethod
    def attach(cls, namespace: str) -> Self:
        """Map an existing namespace's segment.

        :raises NamespaceNotFound: if it does not exist (or is still being
            created).
        :raises RegistryCorrupt: if it is not a registry this version knows.
        :raises UnsafeRuntimeDirectory: if another user owns it or may write it.
        """
        path = paths.SHM_DIR / paths.segment_name(namespace)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NamespaceNotFound(namespace) from None
        except PermissionError:
            raise UnsafeRuntimeDirectory(
                path, "another user owns it", "use a namespace of your own"
            ) from None
        try:
            check_segment_owner(path, fd)
            if os.fstat(fd).st_size < HEADER_SIZE:
                raise NamespaceNotFound(namespace)
        except BaseException:
            os.close(fd)
            raise
        self = cls(namespace, fd, created=False)
        try:
            self._load_header()
        except BaseException:
            self.close()
            raise
        return self

    def check_layout(self, capacity: int, block_size: int) -> None:
        """Refuse a registry whose layout differs from the one asked for."""
        if (self.capacity, self.block_size) != (capacity, block_size):
            found = f"capacity {self.capacity} and block size {self.block_size}"
            raise RegistryMismatch(
                self.namespace, capacity=capacity, block_size=block_size, found=found
            )

    def _load_header(self) -> None:
        magic, layout, capacity, block_size, ring, _state, _pid, _gen = (
            HEADER.unpack_from(self._view, 0)
        )
        if magic == bytes(8):
            raise NamespaceNotFound(self.namespace)
        if magic != MAGIC:
            raise RegistryCorrupt(self.namespace, f"bad magic {magic!r}")
        if layout != LAYOUT_VERSION:
            raise RegistryCorrupt(self.namespace, f"layout version {layout}")
        ok = (
            1 <= capacity <= MAX_CAPACITY
            and 1 <= block_size <= MAX_BLOCK_SIZE
            and ring == ring_size_for(capacity)
        )
        if not ok or len(self._view) < segment_size(capacity, block_size):
            raise RegistryCorrupt(
                self.namespace,
                f"capacity {capacity}, block size {block_size} and ring {ring} "
                f"do not fit a segment of {len(self._view)} bytes",
            )
        self.capacity, self.block_size, self.ring_size = capacity, block_size, ring
        self._slots_at = HEADER_SIZE + ring * 8
        self._stride = slot_stride(block_size)

    @property
    def _view(self) -> memoryview:
        if self._buf is None:
            raise ValueError(f"registry of {self.namespace!r} is closed")
        return self._buf

    def close(self) -> None:
        """Release the mapping (and the creator's lock). Never raises."""
        if self._held >= 0:
            os.close(self._held)
            self._held = -1
        if self._buf is not None:
            self._buf.release()
            self._buf = None
            try:
                self._mmap.close()
            except (BufferError, ValueError):  # pragma: no cover - defensive
                log.warning("registry of %r: mapping still exported", self.namespace)

    def replaced(self) -> bool:
        """True if the namespace's segment name no longer leads to this
        mapping: its owner died and a new owner reclaimed the namespace."""
        try:
            st = os.stat(paths.SHM_DIR / paths.segment_name(self.namespace))
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    def unlink(self) -> None:
        """Remove the segment name (the creator only). Never raises."""
        self.unlink_name(self.namespace)

    @staticmethod
    def unlink_name(namespace: str) -> None:
        """Remove a namespace's segment name. Never raises."""
        with suppress(OSError):
            os.unlink(paths.SHM_DIR / paths.segment_name(namespace))

    # -- header ------------------------------------------------------------

    @property
    def generation(self) -> int:
        """How many changes the registry has seen."""
        return int(U64.unpack_from(self._view, GENERATION_OFFSET)[0])

    @property
    def owner_pid(self) -> int:
        """The pid of the process that created the registry."""
        return int(U32.unpack_from(self._view, OWNER_OFFSET)[0])

    @property
    def closed(self) -> bool:
        """True once the owner has closed the namespace."""
        return bool(U32.unpack_from(self._view, STATE_OFFSET)[0] == STATE_CLOSED)

    def mark_closed(self) -> None:
        """Mark the namespace closed and announce it (under the lock)."""
        U32.pack_into(self._view, STATE_OFFSET, STATE_CLOSED)
        self._bump(0)

    def changed_slots(self, since: int) -> tuple[int, list[int] | None]:
        """The generation now and the slots changed after ``since``.

        :returns: ``(generation, slots)``; ``slots`` is None when the ring no
            longer covers ``since`` and the caller must compare every slot.
        """
        view, ring = self._view, self.ring_size
        now = self.generation
        if now == since:
            return now, []
        if not 0 < now - since <= ring:
            return now, None
        slots = []
        for gen in range(since + 1, now + 1):
            entry = U64.unpack_from(view, HEADER_SIZE + gen % ring * 8)[0]
            slot = entry & RING_SLOT_MASK
            if entry >> 24 != gen & RING_GEN_MASK or slot >= self.capacity:
                return now, None  # overwritten, or not written by us
            slots.append(slot)
        if self.generation - since > ring:  # lapped while we read the ring
            return now, None
        return now, slots

    # -- slots: readers ----------------------------------------------------

    def slot_version(self, index: int) -> int:
        """The slot's seqlock version: odd while a write is under way, and
        left odd by a writer that died mid-write (see :meth:`repair`)."""
        offset = self._slots_at + index * self._stride
        return int(U64.unpack_from(self._view, offset)[0])

    def read_slot(self, index: int) -> SlotRead | None:
        """A consistent copy of a slot, or None while a write is under way."""
        view, offset = self._view, self._slots_at + index * self._stride
        version, uid, pid, length, pidns = SLOT.unpack_from(view, offset)
        if version & 1:
            return None
        data = None
        if length <= self.block_size:
            start = offset + SLOT.size
            data = bytes(view[start : start + length])
        if U64.unpack_from(view, offset)[0] != version:
            return None
        owner = None if uid == NULL_UID else UUID(bytes=uid)
        return SlotRead(version, owner, pid, pidns, data)

    # -- slots: writers (caller holds the lock) ----------------------------

    def find(self, uid: UUID, hint: int | None = None) -> int | None:
        """The slot holding ``uid``, trying ``hint`` first."""
        if hint is not None and self._slot_uid(hint) == uid.bytes:
            return hint
        for index in range(self.capacity):
            if self._slot_uid(index) == uid.bytes:
                return index
        return None

    def find_free(self) -> int | None:
        """A slot holding no worker."""
        for index in range(self.capacity):
            if self._slot_uid(index) == NULL_UID:
                return index
        return None

    def write_slot(
        self, index: int, uid: UUID | None, data: bytes, pid: int = 0, pidns: int = 0
    ) -> None:
        """Write a slot (``uid=None`` clears it) and announce the change."""
        if len(data) > self.block_size:
            raise ValueError(f"{len(data)} bytes do not fit a {self.block_size} block")
        view, offset = self._view, self._slots_at + index * self._stride
        version = U64.unpack_from(view, offset)[0]
        version += 1 + (version & 1)  # odd: a write is under way
        U64.pack_into(view, offset, version)
        raw_uid = NULL_UID if uid is None else uid.bytes
        SLOT_BODY.pack_into(view, offset + 8, raw_uid, pid, len(data), pidns)
        start = offset + SLOT.size
        view[start : start + len(data)] = data
        U64.pack_into(view, offset, version + 1)
        self._bump(index)

    def repair(self, index: int) -> bool:
        """Clear the slot if a writer died in the middle of writing it.

        Call with the lock held: no write is under way, so an odd version can
        only be a writer's that was killed. :returns: whether it was torn.
        """
        if not self.slot_version(index) & 1:
            return False
        self.write_slot(index, None, b"")
        return True

    def _slot_uid(self, index: int) -> bytes:
        offset = self._slots_at + index * self._stride + 8
        return bytes(self._view[offset : offset + 16])

    def _bump(self, index: int) -> None:
        view = self._view
        generation = (self.generation + 1) & U64_MASK  # wraps only if corrupted
        entry = (generation & RING_GEN_MASK) << 24 | index
        U64.pack_into(view, HEADER_SIZE + generation % self.ring_size * 8, entry)
        U64.pack_into(view, GENERATION_OFFSET, generation)
