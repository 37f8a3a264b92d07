"""The dispatcher's settings (``python -m pool.dispatcher``), declared once
(see :mod:`workers.common.options`); ``pool up`` takes the same ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pool.routing.matching import NO_WORKER_TIMEOUT_S
from pool.routing.queue import MAX_QUEUED
from workers.common.options import (
    DISCOVERY,
    NAMESPACE,
    REDIS_URLS,
    TLS_CERT,
    FromParent,
    Listening,
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
class FromSupervisor(FromParent):
    """What the supervisor hands its dispatcher besides: the two pipes of
    :mod:`pool.dispatcher.messages`."""

    control_fd: int | None = Spec(
        None, "read the supervisor's control lines here"
    ).field()
    report_fd: int | None = Spec(
        None, "write a line here for each worker linked, for the supervisor"
    ).field()
    telemetry: bool = Spec(
        False,
        "also write what tasks do to --report-fd, twice a second (for the "
        "supervisor's dashboard)",
        form="switch",
    ).field()


@dataclass(frozen=True)
class DispatcherSettings(FromSupervisor, Listening):
    """The dispatcher's settings. With ``tls_cert``, the TCP port of ``host``
    serves TLS, for clients of other machines; this machine's clients use
    the unix socket."""

    namespace: str = NAMESPACE.field()
    discovery_url: str | None = DISCOVERY.field(
        help=f"find workers in the registry at {REDIS_URLS}, not shared memory"
    )
    tls_ca: str | None = TLS_CA.field()
    no_worker_timeout_s: float = NO_WORKER_TIMEOUT_SPEC.field()
    max_queued: int = MAX_QUEUED_SPEC.field()
    # A field of a group, in the dispatcher's words (it keeps its place).
    tls_cert: str | None = TLS_CERT.field(
        help=TLS_CERT.help + "; clients of other machines check it (this "
        "machine's use the unix socket)"
    )

    def __post_init__(self) -> None:
        check(self)
        check_tcp(self)
