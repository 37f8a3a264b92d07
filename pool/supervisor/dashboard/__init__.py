"""The browser dashboard and Prometheus metrics of ``pool up --dashboard``.

The supervisor shows the pool to a :class:`~.board.Board` as it shows the
terminal, and hands it its dispatcher's reports of what tasks do; a
:class:`~.server.Dashboard` serves the board (the page, a live event
stream, ``/metrics``) on the supervisor's loop. aiohttp and
prometheus_client are the ``dashboard`` extra, imported only here and only
when a pool has a dashboard: a pool without one never loads them.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pool.supervisor.dashboard.server import Dashboard

DEFAULT_ADDRESS: Final = "127.0.0.1:8787"
INSTALL: Final = ".venv/bin/pip install -e '.[dashboard]'"  # (the README's form)


def listen_address(value: str) -> tuple[str, int]:
    """``[HOST:]PORT`` as a host and a port (the host 127.0.0.1 by default).

    :raises ValueError: for anything else.
    """
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(
            f"--dashboard {value!r}: give [HOST:]PORT, such as 8787 or "
            "0.0.0.0:8787 (port 0: any free one)"
        )
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, assume others


def dashboard_key(key_file: str | None) -> str | None:
    """The dashboard's key, read from ``key_file`` (None: none is asked).

    :raises BadToken: for a file that cannot be read, or a key too short.
    """
    if key_file is None:
        return None
    from workers.protocol.auth import read_secret

    return read_secret(key_file, "key", "see the pool's dashboard")


def dashboard_for(
    namespace: str,
    address: str | None,
    discovery_url: str | None,
    tls: tuple[str | None, str | None, str | None],
) -> Dashboard | None:
    """A dashboard of the pool of ``namespace``, to serve on ``address``
    (``[HOST:]PORT``; None: no dashboard) once started. ``tls`` is the
    pool's CA, certificate and key: off loopback, a certificate and its key
    serve the page over TLS. On Redis (``discovery_url``, and the CA to
    check its dispatchers), it shows every dispatcher."""
    if address is None:
        return None
    from pool.client.rendezvous import Locator
    from pool.supervisor.dashboard.board import Board
    from pool.supervisor.dashboard.metrics import Metrics
    from pool.supervisor.dashboard.server import Dashboard

    host, port = listen_address(address)
    board = Board(namespace)
    metrics = Metrics(board)
    board.on_drop_seen = metrics.drop_seen
    tls_ca, cert, key = tls
    remote = Locator(namespace, discovery_url, None, tls_ca) if discovery_url else None
    page_tls = (cert, key) if cert and key and not is_loopback(host) else None
    return Dashboard(board, metrics, host, port, tls=page_tls, remote=remote)
