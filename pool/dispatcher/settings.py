"""The dispatcher's settings (``python -m pool.dispatcher``), declared once
(see :mod:`workers.common.options`); ``pool up`` takes the same ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pool.dispatcher.placement import NO_WORKER_TIMEOUT_S
from pool.dispatcher.queue import MAX_QUEUED
from workers.common.options import (
    ADVERTISE,
    DISCOVERY,
    HOST,
    NAMESPACE,
    OUTPUT_FD,
    PARENT_FD,
    PORT,
    READY_FD,
    TLS_CERT,
    TLS_KEY,
    check_tcp,
)
from workers.common.spec import Spec, check, existing_file

NO_WORKER_TIMEOUT_SPEC: Final = Spec(
    NO_WORKER_TIMEOUT_S,
    "fail a task that finds no matching ready worker this long",
    low=0,
)
MAX_QUEUED_SPEC: Final = Spec(
    MAX_QUEUED,
    "tasks that may wait for a worker in the dispatcher; past it, clients wait "
    "to send more",
    flag="--max-queued",
    low=1,
)
TLS_CA: Final = Spec(
    None,
    "the CA that signed the certificates of workers serving TLS (`python -m "
    "workers --tls-cert ... --tls-key ...`); once given, no worker on TCP "
    "without TLS is taken (default: the system's roots, and plain-text workers "
    "are taken)",
    metavar="PEM",
    check=existing_file("--tls-ca"),
)


@dataclass(frozen=True)
class DispatcherSettings:
    """The dispatcher's settings. With ``tls_cert``, the TCP port of ``host``
    serves TLS, for clients of other machines; this machine's clients use
    the unix socket."""

    namespace: str = NAMESPACE.field()
    discovery_url: str | None = DISCOVERY.field(
        help="find workers in the registry at redis://HOST:PORT (or "
        "redis+sentinel://HOST:PORT[,...]/SERVICE) instead of the namespace's "
        "shared memory"
    )
    host: str | None = HOST.field()
    port: int = PORT.field()
    advertise: str | None = ADVERTISE.field()
    tls_cert: str | None = TLS_CERT.field(
        help=TLS_CERT.help + "; clients of other machines check it (this "
        "machine's use the unix socket)"
    )
    tls_key: str | None = TLS_KEY.field()
    tls_ca: str | None = TLS_CA.field()
    no_worker_timeout_s: float = NO_WORKER_TIMEOUT_SPEC.field()
    max_queued: int = MAX_QUEUED_SPEC.field()
    parent_fd: int | None = PARENT_FD.field()
    control_fd: int | None = Spec(
        None, "read the supervisor's control lines here"
    ).field()
    report_fd: int | None = Spec(
        None, "write a line here for each worker linked, for the supervisor"
    ).field()
    ready_fd: int | None = READY_FD.field()
    output_fd: int | None = OUTPUT_FD.field()
    telemetry: bool = Spec(
        False,
        "also write what tasks do to --report-fd, twice a second (for the "
        "supervisor's dashboard)",
    ).field()

    def __post_init__(self) -> None:
        check(self)
        check_tcp(self)

    @property
    def tls(self) -> tuple[str, str] | None:
        """The certificate and key files, if the TCP port serves TLS."""
        return (self.tls_cert, self.tls_key) if self.tls_cert and self.tls_key else None
