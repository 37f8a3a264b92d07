"""A pool's settings: ``pool up``'s flags and ``Pool(...)``'s keywords.

:class:`PoolSettings` declares what is the supervisor's own (how many
workers, restarts, the registry's capacity) and takes the workers' and the
dispatcher's settings from their own declarations (:mod:`workers.settings`,
:mod:`pool.dispatcher.settings`), so that a default, a bound or a check is
written once. :meth:`PoolSettings.worker` and
:meth:`PoolSettings.dispatcher` compose the settings each child is handed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pool.dispatcher.settings import (
    MAX_QUEUED_SPEC,
    NO_WORKER_TIMEOUT_SPEC,
    TLS_CA,
    DispatcherSettings,
)
from pool.supervisor import dashboard
from workers import initializer
from workers.common.options import (
    ADVERTISE,
    DISCOVERY,
    NAMESPACE,
    PORT,
    TLS_CERT,
    TOKEN_FILE,
    Listening,
    check_tcp,
)
from workers.common.spec import SettingError, Spec, check, existing_file, values
from workers.settings import (
    CONCURRENCY,
    GRACE_S,
    INITARGS,
    INITIALIZER,
    PATHS,
    RELOAD,
    TAGS,
    Limits,
    WorkerSettings,
)


def _dashboard_address(value: str) -> None:
    dashboard.listen_address(value)  # (raises ValueError, named)


DASHBOARD = Spec(
    None,
    "serve a live page of the pool and its Prometheus /metrics on [HOST:]PORT "
    f"(bare: {dashboard.DEFAULT_ADDRESS}; port 0: any free one; the ready line "
    "names the URL). Off loopback, every request needs the dashboard's own "
    "key (--dashboard-key-file), never the pool's token, and a pool with "
    "--tls-cert serves the page over TLS. Needs the dashboard extra: "
    + dashboard.INSTALL,
    metavar="[HOST:]PORT",
    form="optional",
    const=dashboard.DEFAULT_ADDRESS,
    check=_dashboard_address,
)
WORKERS = Spec(
    os.cpu_count() or 1,
    "worker processes to start and keep; 0 only with --discovery or "
    "--external-workers, for a pool whose workers all join from elsewhere",
    shown_default="one per CPU",
)


@dataclass(frozen=True)
class PoolSettings(Listening, Limits):
    """Everything one pool is started with; see the module docstring."""

    namespace: str = NAMESPACE.field()
    workers: int = WORKERS.field()
    external_workers: bool = Spec(
        False,
        "workers also join from elsewhere on this machine (`python -m workers "
        "-n NAMESPACE`, say in containers that share its IPC namespace and "
        "runtime directory): allows --workers 0",
        form="switch",
    ).field()
    concurrency: int = CONCURRENCY.field()
    tags: tuple[str, ...] = TAGS.field(help="comma-separated worker tags")
    paths: tuple[str, ...] = PATHS.field(
        help="add a directory workers import task modules from (repeatable); the "
        "directory `pool up` runs in is always one, after those given"
    )
    reload: bool = RELOAD.field(help="workers " + RELOAD.help)
    discovery_url: str | None = DISCOVERY.field()
    tls_ca: str | None = TLS_CA.field()
    token_file: str | None = TOKEN_FILE.field(
        help="use the token in PATH (shared with workers on other hosts, which "
        "read it with `python -m workers --token-file`) instead of a fresh one; "
        "$SHMPOOL_TOKEN also gives it"
    )
    initializer: str | Callable[..., Any] | None = INITIALIZER.field()  # noqa: RUF009
    initargs: tuple[Any, ...] = INITARGS.field()
    restart: bool = Spec(
        True,
        "report dead workers but do not replace them",
        flag="--no-restart",
        form="switch",
    ).field()
    grace_s: float = GRACE_S.field(help="how long draining workers may finish tasks")
    capacity: int = Spec(
        128, "registry slots (at least twice --workers)", low=1
    ).field()
    no_worker_timeout_s: float = NO_WORKER_TIMEOUT_SPEC.field()
    stuck_grace_s: float = Spec(
        60.0,
        "replace a worker whose every thread is held by a call nobody waits "
        "for any more (its dispatcher hung up on it), once it has been so this "
        "long (a call over its time limit, or stopped, ends its worker at once)",
        low=0,
    ).field()
    max_queued: int = MAX_QUEUED_SPEC.field()
    dashboard: str | None = DASHBOARD.field()
    dashboard_key_file: str | None = Spec(
        None,
        "with --dashboard off loopback: read the dashboard's key from PATH, what "
        "its viewers give (once as /?key=KEY). It lets them see the pool, not "
        "run code in it; at least 32 characters (`openssl rand -hex 32`)",
        metavar="PATH",
        check=existing_file("--dashboard-key-file"),
    ).field()
    # Show what children write to stdout and stderr through the view, a line
    # at a time, prefixed by who wrote it (else they share the caller's).
    capture_output: bool = Spec(False, "", flag=None).field()
    # Fields of a group, in the pool's words (each keeps its group's place).
    port: int = PORT.field(
        help="with --host: the dispatcher's TCP port, where clients connect"
    )
    advertise: str | None = ADVERTISE.field(
        help="with --host and --discovery: the dispatcher's address that clients "
        "of other machines are given, for NAT and containers (default: the bound "
        "address, or this host's name when --host is 0.0.0.0 or ::)"
    )
    tls_cert: str | None = TLS_CERT.field(
        help="with --host: serve TLS on the TCP ports with this certificate (and "
        "--tls-key): the dispatcher's, for clients of other machines (this "
        "machine's use its unix socket), and its workers'"
    )

    def __post_init__(self) -> None:
        check(self)
        check_tcp(self)
        joining = self.discovery_url or self.external_workers
        if self.workers < (0 if joining else 1):
            raise SettingError(
                f"workers must be at least {0 if joining else 1}, got {self.workers}"
                + ("" if joining else "; 0 only with --discovery or --external-workers")
            )
        if self.host and self.workers and bool(self.tls_ca) != bool(self.tls_cert):
            raise SettingError(
                "with --host, --tls-cert and --tls-ca go together: the workers "
                "`pool up` puts on TCP serve TLS with the certificate, and the "
                "dispatcher checks it against the CA (for a self-signed "
                "certificate, give it as its own CA)"
            )
        if self.dashboard is not None:
            _check_dashboard(self.dashboard, self.dashboard_key_file)
        object.__setattr__(self, "initargs", tuple(self.initargs))
        for name in ("tls_ca", "tls_cert", "tls_key"):
            if (path := getattr(self, name)) is not None:
                object.__setattr__(self, name, os.path.abspath(path))

    @property
    def registry_capacity(self) -> int:
        """Slots of the registry: room for every worker and a replacement."""
        return max(self.capacity, 2 * self.workers)

    def worker(self) -> WorkerSettings:
        """What each worker is started with (its descriptors aside): a
        callable initializer, or arguments that are not strings, pickled."""
        init, args = self.initializer, self.initargs
        by_name = init is None or (
            isinstance(init, str) and all(isinstance(a, str) for a in args)
        )
        return WorkerSettings(
            initializer=init if by_name else None,  # type: ignore[arg-type]
            initargs=args if by_name else (),
            initializer_pickle=None if by_name else _pickled(init, args),
            namespace=self.namespace,
            concurrency=self.concurrency,
            tags=self.tags,
            grace_s=self.grace_s,
            **values(self, Limits),
            paths=self.paths,
            reload=self.reload,
            discovery_url=self.discovery_url,
            host=self.host,
            # On TCP, the dispatcher's certificate is theirs too.
            tls_cert=self.tls_cert if self.host else None,
            tls_key=self.tls_key if self.host else None,
        )

    def dispatcher(self) -> DispatcherSettings:
        """What the dispatcher is started with (its descriptors aside)."""
        return DispatcherSettings(
            namespace=self.namespace,
            discovery_url=self.discovery_url,
            **values(self, Listening),
            tls_ca=self.tls_ca,
            no_worker_timeout_s=self.no_worker_timeout_s,
            max_queued=self.max_queued,
            telemetry=self.dashboard is not None,
        )


def _check_dashboard(address: str, key_file: str | None) -> None:
    """A dashboard others can reach asks for a key its viewers know; and it
    needs its extra installed."""
    host, _ = dashboard.listen_address(address)
    if not (dashboard.is_loopback(host) or key_file):
        raise SettingError(
            f"--dashboard on {host} is open to other machines, and every request "
            "there must give the dashboard's key: give --dashboard-key-file PATH "
            "(the key its viewers give), or listen on loopback "
            "(--dashboard 127.0.0.1:PORT)"
        )
    if not all(
        importlib.util.find_spec(name) for name in ("aiohttp", "prometheus_client")
    ):
        raise SettingError(
            f"--dashboard needs the dashboard extra: {dashboard.INSTALL}"
        )


def _pickled(init: str | Callable[..., Any] | None, args: tuple[Any, ...]) -> str:
    assert init is not None  # (a name is resolved in the worker, not here)
    return initializer.pickled(init, args)
