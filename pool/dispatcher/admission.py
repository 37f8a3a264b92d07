"""Which of the registry's workers the dispatcher links: :func:`follow`
passes the registry's events to the router, but none of a worker it must
not send tasks and the token to (:func:`refusal`). Run in
:func:`pool.dispatcher.server.serve`'s task group.
"""

from __future__ import annotations

import logging
from pathlib import Path
from uuid import UUID

from discovery import WorkerInfo, backends, paths
from pool.routing.placement import Router
from workers.common import channels

log = logging.getLogger("pool.dispatcher")


async def follow(
    namespace: str, router: Router, url: str | None, require_tls: bool
) -> None:
    """Pass the registry's events to the router, but none of a worker that
    is not to be sent tasks (and the token): see :func:`refusal`."""
    refused: set[UUID] = set()
    async for event in backends.subscriber_for(namespace, url):
        info = event.worker_info
        if info.uid in refused:
            if event.type == "worker-dropped":
                refused.discard(info.uid)
            continue
        if event.type == "worker-added" and (
            why := refusal(info, namespace, require_tls)
        ):
            log.warning("not linking worker %s at %s: %s", info.uid, info.address, why)
            refused.add(info.uid)
            continue
        router.on_event(event)


def refusal(info: WorkerInfo, namespace: str, require_tls: bool) -> str | None:
    """Why the dispatcher must not send ``info`` tasks and the token, if it
    must not. Whoever can write to the registry (Redis, say) could publish
    any address: a unix socket must be in the pool's own private directory,
    and once given a CA (``require_tls``), a worker on TCP must serve TLS,
    so that its certificate is checked against the CA."""
    if info.address.startswith("unix:"):
        home = paths.namespace_dir(namespace, create=False)
        if Path(info.address[5:]).parent != home:
            return f"its unix socket is outside the pool's directory {home}"
        return None
    if require_tls and info.extra.get(channels.TLS_EXTRA) != "1":
        return "it does not serve TLS, and the pool requires it (--tls-ca)"
    return None
