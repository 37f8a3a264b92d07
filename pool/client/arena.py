"""A client's spare segments: freed, their pages still in memory, kept a
while to be written again.

Writing a payload into fresh shared memory costs several times a memcpy of
it (the kernel allocates and clears each page; measured here: 0.12 s for
256 MB against 0.03 s for the copy itself), and freeing it costs again.
So when no task or reference holds a segment of at least :data:`MIN_BYTES`
any more, its client keeps it, up to :data:`MAX_BYTES` in all and for
:data:`KEEP_S` at most, as Ray's object store keeps its memory: the next
payload of about its size is written into it (an argument), or it is lent
to a task for its value (a result). Spares fill at most a quarter of
/dev/shm, or of the pool's ``--shm-limit``, and a write of the client's
that finds no room drops them first. A segment that a reader still maps (a
task still running, a value still referenced here) cannot be written
again; it is skipped until its reader lets go, or its time runs out.

The :class:`~pool.client.store.Store` calls it under its own lock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from workers.protocol import owners, segments

MIN_BYTES: Final = 1 << 20
MAX_BYTES: Final = 2 << 30  # (and at most a quarter of /dev/shm)
KEEP_S: Final = 10.0
TRIES: Final = 3  # spares looked at for one payload
SLACK: Final = 2  # a spare at most this many times too large is taken


@dataclass(slots=True)
class _Spare:
    size: int
    since: float


class Arena:
    """The spare segments of one client (see the module docstring)."""

    def __init__(self, limit_bytes: int | None = None) -> None:
        self._spares: dict[str, _Spare] = {}  # by name, oldest first
        self._bytes = 0
        # (A quarter of what the pool may hold: spares never fill it.)
        room = owners.total_bytes() if limit_bytes is None else limit_bytes
        self.max_bytes = min(MAX_BYTES, room // 4)

    def __len__(self) -> int:
        return len(self._spares)

    def keep(self, name: str, size: int, since: float | None = None) -> bool:
        """Keep a segment nobody holds; False if it is too small, or over
        the budget (its owner unlinks it then)."""
        if size < MIN_BYTES or self._bytes + size > self.max_bytes:
            return False
        self._spares[name] = _Spare(size, time.monotonic() if since is None else since)
        self._bytes += size
        return True

    def take(self, need: int) -> Iterator[tuple[str, int, float]]:
        """Spares that fit ``need`` bytes, the snuggest first, each taken out
        as it is handed over (:meth:`keep` it again to put it back, with the
        time it was kept since)."""
        fits = sorted(
            (spare.size, name)
            for name, spare in self._spares.items()
            if need <= spare.size <= need * SLACK + segments.PAGE
        )
        for _, name in fits[:TRIES]:
            spare = self._spares.pop(name, None)
            if spare is not None:
                self._bytes -= spare.size
                yield name, spare.size, spare.since

    def expired(self, now: float) -> list[str]:
        """Take out and name the spares kept past :data:`KEEP_S`."""
        old = [n for n, spare in self._spares.items() if now - spare.since > KEEP_S]
        for name in old:
            self._bytes -= self._spares.pop(name).size
        return old

    def clear(self) -> list[str]:
        names = list(self._spares)
        self._spares.clear()
        self._bytes = 0
        return names
