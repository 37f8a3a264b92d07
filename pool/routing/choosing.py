"""Which link each queued job goes to, for one pump of the queue: :class:`Chooser`.

Two rules, by how long a link's tasks run (its worker's measured pace):

- **Short work is packed.** A link whose tasks run in under a quarter of
  a round trip (:data:`PACK_FACTOR`) takes jobs before any other, the
  busiest such link first, up to its room (what runs within one round
  trip: :attr:`~pool.routing.links.WorkerLink.free`), unless it holds
  tasks and lags (:func:`lag_after`). Such work travels in few, large
  messages to as few workers as keep up with it; spread over many, each
  message would carry a task or two, and the processes' wake-ups, not
  the tasks, would take the machine (no-ops with 256 in flight, on 2
  cores: 1,100 tasks a second spread over 128 workers, 4,900 packed). A
  task packed behind a long one (a short worker's pace is no promise)
  waits until its worker lags, then moves to an idle one
  (:mod:`pool.routing.stealing`).
- **The rest is spread**: the least-loaded link with room (tasks its
  worker holds, other dispatchers' too, over slots; the first on a tie),
  so that every slot runs.

A link whose pace is not known yet (a fresh worker) is spread to. The
room of each link is read once; a job without tags takes the top of a
heap (no scan of every link for every job), one with tags a scan. Used
by :class:`~pool.routing.queue.TaskQueue` for
:class:`~pool.routing.placement.Router`; no I/O.
"""

from __future__ import annotations

import heapq
import time
from typing import Final

from pool.routing.jobs import Job, Link

# A link packs when its tasks run this many times faster than a round trip.
PACK_FACTOR: Final = 4
# A link that keeps up may go this long without starting a task (or a
# round trip, if longer): a busy worker's loop waits for the GIL (a 5 ms switch
# interval) and for the kernel's time slices, and answers 2-20 ms apart
# were common here under load; a steal at each pause would spread the
# work again.
LAG_MIN_S: Final = 0.02


class Chooser:
    """The link for each job of one pump; see the module docstring."""

    def __init__(self, links: list[Link]) -> None:
        self._room = {link: link.free for link in links}
        self.room = sum(max(free, 0) for free in self._room.values())
        now = time.monotonic()
        self._packing = {k for k in links if self._room[k] > 0 and packs(k, now)}
        # The packing links with room, the busiest last (taken from the end).
        self._packers = sorted(self._packing, key=_load)
        self._heap = [
            (_load(link), i, link)
            for i, link in enumerate(links)
            if self._room[link] > 0
        ]
        heapq.heapify(self._heap)

    def choose(self, job: Job) -> Link | None:
        """The link for ``job`` (which the caller sends there at once)."""
        if job.tags:
            fits = [
                k for k, n in self._room.items() if n > 0 and job.tags <= k.info.tags
            ]
            packers = [k for k in fits if k in self._packing]
            if packers:
                link: Link | None = max(packers, key=_load)
            else:
                link = min(fits, key=_load, default=None)
        else:
            link = self._packer() or self._top()
        if link is not None:
            self._room[link] -= 1
            self.room -= 1
        return link

    def _packer(self) -> Link | None:
        """The busiest packing link with room (sending there keeps it so)."""
        packers = self._packers
        while packers and self._room[packers[-1]] <= 0:
            packers.pop()
        return packers[-1] if packers else None

    def _top(self) -> Link | None:
        heap = self._heap
        while heap:
            load, i, link = heap[0]
            if self._room[link] <= 0:
                heapq.heappop(heap)
            elif load != _load(link):  # (a tagged job went there since)
                heapq.heapreplace(heap, (_load(link), i, link))
            else:  # its load once the job is sent there:
                after = (link.load + 1) / link.slots
                heapq.heapreplace(heap, (after, i, link))
                return link
        return None


def packs(link: Link, now: float) -> bool:
    """Whether short work goes to ``link`` first: its tasks run far shorter
    than a round trip to it, and it has a slot free or keeps up."""
    return 0 < link.pace_s * PACK_FACTOR < link.rtt_s and (
        link.load < link.slots or keeps_up(link, now)
    )


def keeps_up(link: Link, now: float) -> bool:
    """Whether what ``link`` holds will have run before a steal arrives:
    its tasks are shorter than a round trip, and it started one lately."""
    return 0 < link.pace_s < link.rtt_s and now < lag_after(link)


def lag_after(link: Link) -> float:
    """When ``link`` lags, unless its worker starts a task again: a round
    trip after its last reported start, and at least :data:`LAG_MIN_S` (a
    withdrawal it answers is no sign its slots move on)."""
    return link.progressed_at + max(link.rtt_s, LAG_MIN_S)


def _load(link: Link) -> float:
    return link.load / link.slots
