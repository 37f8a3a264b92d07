"""The settings that more than one pool process takes, each declared once
as a :class:`~workers.common.spec.Spec`: where the pool is (namespace,
registry), how a process listens (``--host``, TLS), the token, and the
descriptors a parent hands its child. Each process's own dataclass
(:mod:`workers.settings`, :mod:`pool.dispatcher.settings`,
:mod:`pool.supervisor.settings`) takes its fields from these, and the
groups of them it shares with another (:class:`Listening`,
:class:`FromParent`) as a base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from discovery import backends, paths
from workers.common.serving import LOOPBACK
from workers.common.spec import Group, SettingError, Spec, existing_file, port

NAMESPACE: Final = Spec(
    "default",
    "the pool's namespace",
    short="-n",
    check=paths.validate_namespace,
)
# Where a registry in Redis is, as --discovery takes it.
REDIS_URLS: Final = (
    "redis://HOST:PORT (or the primary that Sentinels name: "
    "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE)"
)
DISCOVERY: Final = Spec(
    None,
    f"register in Redis at {REDIS_URLS} instead of this machine's shared "
    "memory, so that workers on other hosts can join",
    flag="--discovery",
    metavar="URL",
    check=backends.check_url,
)
HOST: Final = Spec(
    None,
    f"listen on TCP at HOST (bare: {LOOPBACK}, this machine only) instead of a "
    "unix socket; any other address exposes the pool: read SECURITY.md",
    form="optional",
    const=LOOPBACK,
)
PORT: Final = Spec(
    0, "with --host: the TCP port", check=port, shown_default="a free one"
)
ADVERTISE: Final = Spec(
    None,
    "with --host: the address published for others, for NAT and containers "
    "(the bound port unless given; default: the bound address, or this host's "
    "name when --host is 0.0.0.0 or ::)",
    metavar="HOST[:PORT]",
)
TLS_CERT: Final = Spec(
    None,
    "with --host: serve TLS on the TCP port with this certificate (and --tls-key)",
    metavar="PEM",
    check=existing_file("--tls-cert"),
)
TLS_KEY: Final = Spec(
    None, "the key of --tls-cert", metavar="PEM", check=existing_file("--tls-key")
)
TOKEN_FILE: Final = Spec(
    None,
    "read the pool's token from PATH (else $SHMPOOL_TOKEN, else this host's "
    "pool's); never give the token itself on a command line",
    metavar="PATH",
    check=existing_file("--token-file"),
)
PARENT_FD: Final = Spec(
    None, "a pidfd (inherited) of the process whose death ends this one"
)
READY_FD: Final = Spec(None, "write the READY line here, not to stdout")
OUTPUT_FD: Final = Spec(None, "send stdout and stderr here, line by line")


@dataclass(frozen=True)
class Listening(Group):
    """How a process listens: a unix socket of this machine, or TCP at
    ``host`` (with TLS, given a certificate and its key)."""

    TITLE = "listening on TCP (default: a unix socket, this machine only)"

    host: str | None = HOST.field()
    port: int = PORT.field()
    advertise: str | None = ADVERTISE.field()
    tls_cert: str | None = TLS_CERT.field()
    tls_key: str | None = TLS_KEY.field()

    @property
    def tls(self) -> tuple[str, str] | None:
        """The certificate and key files, if the TCP port serves TLS."""
        return (self.tls_cert, self.tls_key) if self.tls_cert and self.tls_key else None


@dataclass(frozen=True)
class FromParent(Group):
    """The descriptors a parent (``pool up``) hands the child it starts."""

    TITLE = "given by the process that starts this one (pool up)"

    parent_fd: int | None = PARENT_FD.field()
    ready_fd: int | None = READY_FD.field()
    output_fd: int | None = OUTPUT_FD.field()


def check_tcp(settings: Listening) -> None:
    """What goes with ``host``: port, advertise and a whole TLS pair.

    :raises SettingError: naming the flags.
    """
    tls = settings.tls_cert or settings.tls_key
    if settings.host is None and (settings.port or settings.advertise or tls):
        raise SettingError("--port, --advertise and --tls-cert go with --host (TCP)")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise SettingError("--tls-cert and --tls-key go together")
