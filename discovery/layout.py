"""The byte layout of a registry segment (drawn in :mod:`discovery.registry`):
its header, change ring and slots, and their sizes. No I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final
from uuid import UUID

MAGIC: Final = b"SHMPREG\x00"
LAYOUT_VERSION: Final = 3  # 3: WorkerInfo.status became an enum


MAX_CAPACITY: Final = 1 << 24
MAX_BLOCK_SIZE: Final = 1 << 20

HEADER: Final = struct.Struct("<8sIIIIIIQ")  # ... state, owner pid, generation
HEADER_SIZE: Final = 64
GENERATION_OFFSET: Final = 32
STATE_OFFSET: Final = 24
OWNER_OFFSET: Final = 28
U64: Final = struct.Struct("<Q")
U32: Final = struct.Struct("<I")
SLOT: Final = struct.Struct("<Q16sIIQ")  # version, uid, pid, length, pid ns
SLOT_BODY: Final = struct.Struct("<16sIIQ")  # the slot after its version
SLOT_HEADER_BYTES: Final = SLOT.size
RING_GEN_MASK: Final = (1 << 40) - 1
RING_SLOT_MASK: Final = (1 << 24) - 1
NULL_UID: Final = bytes(16)
U64_MASK: Final = (1 << 64) - 1

STATE_OPEN: Final = 1
STATE_CLOSED: Final = 2


def ring_size_for(capacity: int) -> int:
    """Ring entries for a capacity: enough for every slot to change once."""
    return max(256, capacity)


def segment_size(capacity: int, block_size: int) -> int:
    """Bytes of the segment for a capacity and a block size."""
    return (
        HEADER_SIZE + ring_size_for(capacity) * 8 + capacity * slot_stride(block_size)
    )


def slot_stride(block_size: int) -> int:
    return SLOT.size + (block_size + 7) // 8 * 8


@dataclass(frozen=True, slots=True)
class SlotRead:
    """A consistent copy of one slot. ``data`` is None when ``length`` is bad."""

    version: int
    uid: UUID | None
    pid: int  # of the process that published the slot
    pidns: int  # that process's pid namespace
    data: bytes | None
