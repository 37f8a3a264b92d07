"""The pool's part in the data plane (:mod:`workers.protocol.payload`):
it tells this machine's clients that they may hand it large data through
shared memory, and reclaims what dead processes leave there.

A pool on shared-memory discovery has every worker on this machine (they
map its registry), so :func:`announce` writes the ``data-plane`` file
beside the pool's address (:class:`pool.client.rendezvous.DataPlane`): its
host and ``--shm-limit``. A pool on Redis writes none: its workers may be
anywhere, and large data travels in the messages.

:func:`reap_every` runs in the supervisor's task group for the pool's
life: every :data:`REAP_S` it removes the segments of the namespace whose
owner died (a client killed mid-submit, say) and those a dead worker left
half-written (:func:`workers.protocol.owners.reap`); a pool's start
reaps every namespace of the user, and its stop reaps its own once its
workers have exited.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from discovery import paths
from pool.client.rendezvous import DATA_FILE, DataPlane
from pool.supervisor.settings import PoolSettings
from workers.common.offload import Offload
from workers.protocol import owners, segments

log = logging.getLogger("pool.supervisor")

REAP_S: Final = 1.0


async def prepare(offload: Offload, settings: PoolSettings) -> None:
    """As a pool starts: reap what dead processes left in every namespace,
    and :func:`announce` the data plane (not on Redis: workers may be
    anywhere)."""
    await reap(offload)
    if not settings.discovery_url:
        await offload.run(announce, settings)


def announce(settings: PoolSettings) -> None:
    """Say that clients of this machine may use shared memory."""
    limit = settings.worker().shm_limit_bytes
    plane = DataPlane(segments.host_id(), limit)
    paths.write_private(settings.namespace, DATA_FILE, plane.encode())


async def reap(offload: Offload, namespace: str | None = None) -> None:
    """One pass of :func:`workers.protocol.owners.reap`, off the loop:
    the namespace's, or every namespace's of this user."""
    key = paths.segment_name(namespace) if namespace is not None else None
    removed = await offload.run(owners.reap, key)
    if removed:
        log.info("reclaimed %d segments of dead processes", len(removed))


async def reap_every(offload: Offload, namespace: str) -> None:
    """:func:`reap` the namespace every :data:`REAP_S`, until cancelled."""
    while True:
        await asyncio.sleep(REAP_S)
        await reap(offload, namespace)
