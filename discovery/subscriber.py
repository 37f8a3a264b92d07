"""Following a namespace's registry as a stream of lifecycle events.

:class:`Subscriber` is an async iterable; each iteration opens its own
stream (a :class:`_Follower`), which owns a mapping of the registry and a
watch on the namespace's directory (through :mod:`discovery.watch`) for as
long as the stream runs. A stream:

1. waits for the namespace to exist: it watches the runtime directory for
   the namespace's directory to appear, then that directory for its
   notification file, and also polls, so it may start before anything else;
2. reads the whole registry once, then on each wake-up only the slots whose
   change it has not seen (the registry's ring; see :mod:`registry`);
3. when the owner closes the namespace, or a new owner replaces the segment
   of a dead one, reports every known worker dropped and goes back to
   waiting.

Events are state transitions: a worker that changes twice between two
looks is reported once, with its latest info, but never out of order (an
added before its updates, its drop last), and ``worker-updated`` only when
the entry's content changed.

Nothing in the segment is trusted. A slot that fails to decode is skipped
with one warning and the stream goes on; a slot caught mid-write is read
again on the next wake-up, and one still torn at a poll, its writer having
died mid-write, is cleared under the registry lock. Each poll compares
every slot's version, whatever the ring says, so a change that was never
announced is found within a poll interval. A header this version does not
recognise is reported once and waited out, like a namespace that does not
exist yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

from discovery import paths, watch
from discovery.errors import NamespaceNotFound, RegistryCorrupt
from discovery.info import DiscoveryEvent, WorkerInfo, events_of
from discovery.layout import SlotRead
from discovery.liveness import PidWatch, PidWatches, Reaper, sweep
from discovery.registry import Registry

log = logging.getLogger(__name__)

POLL_INTERVAL_S: Final = 1.0
_NOTIFY_NAMES: Final = frozenset({paths.NOTIFY_FILE})

Filter = Callable[[WorkerInfo], bool]


@dataclass
class SubscriberStats:
    """Counters of a subscriber's work, summed over its streams."""

    wakeups: int = 0  # returns from waiting (a notification or a poll)
    scans: int = 0  # looks at the registry that found a new generation
    slots_read: int = 0  # slot copies taken


class Subscriber:
    """An async iterable of the :class:`DiscoveryEvent` of one namespace.

    :param namespace: the namespace to follow; it need not exist yet.
    :param filter: keep only workers for which it returns True. A worker
        that stops matching is reported dropped; one that starts, added.
    :param poll_interval: seconds between looks when no notification comes
        (default 1 s); a missed notification only delays an event this long.
    :raises InvalidNamespace: if ``namespace`` is not a valid name.
    :raises ValueError: if ``poll_interval`` is not positive.
    """

    def __init__(
        self,
        namespace: str,
        filter: Filter | None = None,
        *,
        poll_interval: float | None = None,
    ) -> None:
        self._namespace = paths.validate_namespace(namespace)
        if poll_interval is not None and not poll_interval > 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval}")
        self._filter = filter
        self._poll_interval = poll_interval
        self.stats = SubscriberStats()

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_subscriber,
            (self._namespace, self._filter, self._poll_interval),
        )

    @property
    def namespace(self) -> str:
        """The namespace this subscriber follows."""
        return self._namespace

    @property
    def poll_interval(self) -> float:
        """Seconds between looks when no notification comes."""
        return self._poll_interval or POLL_INTERVAL_S

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return events_of(lambda: _Follower(self))


@contextlib.contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Hold the cyclic garbage collector off while a look reads thousands of
    slots: every object it makes lives on, and the collections their number
    sets off (each walking the whole heap) cost a look at 4,096 workers a
    fifth of its time."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _rebuild_subscriber(
    namespace: str, filter: Filter | None, poll_interval: float | None
) -> Subscriber:
    return Subscriber(namespace, filter, poll_interval=poll_interval)


@dataclass(slots=True)
class _Known:
    version: int
    uid: UUID | None
    info: WorkerInfo | None  # None: the slot is empty or never decoded
    shown: bool  # reported to the consumer (passed the filter)
    death: PidWatch | None = None  # None: its liveness is polled


class _Follower:
    """One stream's state: its mapping, its watch and what it has reported."""

    def __init__(self, subscriber: Subscriber) -> None:
        self._namespace = subscriber.namespace
        self._filter = subscriber._filter
        self._poll_s = subscriber.poll_interval
        self._stats = subscriber.stats
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._handle: watch.Handle | None = None
        self._registry: Registry | None = None
        self._generation = 0
        self._slots: dict[int, _Known] = {}
        self._pending: set[int] = set()  # slots caught mid-write
        self._reaper: Reaper | None = None
        self._deaths: PidWatches | None = None
        self._suspects: dict[int, UUID] = {}  # slots whose publisher may be dead
        self._poll_tick = False  # the last wait ended by the poll interval
        self._corrupt_warned = False

    async def aclose(self) -> None:
        watch.unwatch(self._handle)
        self._handle = None
        self._release()

    def _release(self) -> None:
        """Let go of the registry and everything watched in it."""
        if self._deaths is not None:  # (every watch of a slot with it)
            self._deaths.close()
            self._deaths = None
        self._slots, self._pending, self._suspects = {}, set(), {}
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    async def next_batch(self) -> list[DiscoveryEvent]:
        """Wait for the next change and return its events (maybe none)."""
        if self._registry is None:
            self._attach()
        if self._registry is not None:
            full, self._poll_tick = self._poll_tick, False
            self._reap_suspects(full)
            events = self._scan(full)
            if events:
                return events
        await self._wait()
        return []

    def _on_death(self, index: int, uid: UUID) -> None:
        """A publisher's pidfd fired: reap its worker on the next look."""
        known = self._slots.get(index)
        if known is not None and known.death is not None:
            known.death.close()
            known.death = None
        self._suspects[index] = uid
        self._wake.set()

    def _reap_suspects(self, poll_tick: bool) -> None:
        assert self._registry is not None
        if self._reaper is None:
            self._reaper = Reaper(self._namespace, self._registry)
        if poll_tick:  # test every worker's lock; mend torn slots
            # Even a pidfd-watched worker's: its pid may have been reused
            # before the pidfd was opened, and then the pidfd watches another
            # process. The lock cannot be fooled so.
            for index, known in self._slots.items():
                if known.uid is not None:
                    self._suspects.setdefault(index, known.uid)
            registered = {k.uid for k in self._slots.values() if k.uid is not None}
            sweep(self._namespace, registered)
            for index in self._pending:  # still torn a whole poll interval on
                self._reaper.repair(index)
        if not self._suspects:
            return
        suspects, self._suspects = self._suspects, {}
        for index, uid in suspects.items():
            if self._reaper.reap(index, uid) is None:  # the lock was busy
                self._suspects[index] = uid

    def _on_change(self) -> None:  # observer thread
        self._loop.call_soon_threadsafe(self._wake.set)

    async def _wait(self) -> None:
        try:
            async with asyncio.timeout(self._poll_s):
                await self._wake.wait()
        except TimeoutError:
            self._poll_tick = True
        self._wake.clear()
        self._stats.wakeups += 1

    def _attach(self) -> None:
        """Watch, then look: a change between the two is never missed."""
        directory = paths.namespace_dir(self._namespace, create=False)
        exists = directory.is_dir()
        if exists:  # wait for the registry's notifications
            target, names = directory, _NOTIFY_NAMES
        else:  # wait for the namespace's directory to appear
            target, names = directory.parent, frozenset({directory.name})
        if not watch.alive(self._handle) or self._handle.directory != str(target):
            watch.unwatch(self._handle)
            self._handle = watch.watch(target, self._on_change, names)
        if not exists:
            if directory.is_dir():  # it appeared between the look and the watch
                self._wake.set()
            return
        try:
            self._registry = Registry.attach(self._namespace)
        except NamespaceNotFound:
            return
        except RegistryCorrupt as exc:  # wait for its owner to replace it
            if not self._corrupt_warned:
                self._corrupt_warned = True
                log.warning("%s; waiting for it to be replaced", exc)
            return
        self._generation = 0

    def _scan(self, full: bool) -> list[DiscoveryEvent]:
        """Read what changed; with ``full``, compare every slot's version."""
        registry = self._registry
        assert registry is not None
        if registry.closed:
            return self._detach()
        # The namespace's directory went (a new owner reclaiming a dead one's
        # files), or a poll: is the segment still the one mapped here?
        if (full or not watch.alive(self._handle)) and registry.replaced():
            return self._detach()
        generation, changed = registry.changed_slots(self._generation)
        if full:
            changed = None
        elif generation == self._generation and not self._pending:
            return []
        self._stats.scans += 1
        self._generation = generation
        indexes: Iterable[int] = range(registry.capacity)
        if changed is not None:
            indexes = dict.fromkeys([*self._pending, *changed])
        with _collector_paused(changed is None or len(changed) > 256):
            return self._read_and_apply(registry, indexes, changed)

    def _read_and_apply(
        self, registry: Registry, indexes: Iterable[int], changed: list[int] | None
    ) -> list[DiscoveryEvent]:
        reads = {}
        for index in indexes:
            if changed is None and index not in self._pending:
                known = self._slots.get(index)
                if known is not None and registry.slot_version(index) == known.version:
                    continue
                if known is None and registry.slot_version(index) == 0:
                    continue
            read = registry.read_slot(index)
            self._stats.slots_read += 1
            if read is None:
                self._pending.add(index)
            else:
                self._pending.discard(index)
                reads[index] = read
        return self._apply(reads)

    def _detach(self) -> list[DiscoveryEvent]:
        """The namespace closed or was replaced: everything known is dropped."""
        events = [
            DiscoveryEvent("worker-dropped", known.info)
            for known in self._slots.values()
            if known.shown and known.info is not None
        ]
        self._release()
        return events

    def _apply(self, reads: dict[int, SlotRead]) -> list[DiscoveryEvent]:
        """Turn fresh slot copies into events: every drop before any add."""
        drops: list[DiscoveryEvent] = []
        others: list[DiscoveryEvent] = []
        for index, read in reads.items():
            known = self._slots.get(index)
            if known is not None and known.version == read.version:
                continue
            info = self._decode(index, read)
            if known is not None and known.uid == read.uid and info is None:
                known.version = read.version  # undecodable: keep the old info
                continue
            shown = info is not None and (self._filter is None or self._filter(info))
            was_shown = known is not None and known.shown and known.info is not None
            same_worker = known is not None and known.uid == read.uid
            if was_shown and not (same_worker and shown):
                assert known is not None and known.info is not None
                drops.append(DiscoveryEvent("worker-dropped", known.info))
            if shown and info is not None:
                if not (same_worker and was_shown):
                    others.append(DiscoveryEvent("worker-added", info))
                elif known is not None and known.info != info:
                    others.append(DiscoveryEvent("worker-updated", info))
            self._slots[index] = self._track(index, read, known, info, shown)
        return drops + others

    def _track(
        self,
        index: int,
        read: SlotRead,
        known: _Known | None,
        info: WorkerInfo | None,
        shown: bool,
    ) -> _Known:
        """The slot's new state, watching its publisher for death."""
        death = known.death if known is not None else None
        if known is None or known.uid != read.uid:
            if death is not None:
                death.close()
                death = None
            if (uid := read.uid) is not None:
                if self._deaths is None:
                    self._deaths = PidWatches()
                death = self._deaths.open(
                    read.pid, read.pidns, lambda: self._on_death(index, uid)
                )
        return _Known(read.version, read.uid, info, shown, death)

    def _decode(self, index: int, read: SlotRead) -> WorkerInfo | None:
        if read.uid is None:
            return None
        try:
            if read.data is None:
                raise ValueError("its length runs past the block")
            info = WorkerInfo.decode(read.data, expect_uid=read.uid)
        except ValueError as exc:
            log.warning(
                "namespace %r: skipping slot %d (version %d): %s",
                self._namespace,
                index,
                read.version,
                exc,
            )
            return None
        return info
