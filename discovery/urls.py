"""The URL of a Redis registry, read before anything connects: which
forms are accepted, and what a Sentinel URL names.

- ``redis://HOST:PORT[/DB]``, ``rediss://`` (TLS) and ``unix://PATH``: one
  Redis, as redis-py reads them (``Redis.from_url``);
- ``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``:
  the primary that the Sentinels at those addresses name ``SERVICE``,
  looked up again whenever a connection is made, so that a failover is a
  reconnect (:func:`discovery.redis.connecting.connect`). The password, if any,
  is the primary's; the Sentinels are asked without one.

Imports no redis-py: the command lines check a URL with it
(:func:`discovery.backends.check_url`) before the extra is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

SENTINEL_SCHEME: Final = "redis+sentinel://"
SCHEMES: Final = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
SENTINEL_FORM: Final = "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]"


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def parse_sentinel(url: str) -> SentinelURL:
    """The Sentinels, service and database ``url`` names.

    :raises ValueError: for a URL not of the form :data:`SENTINEL_FORM`,
        saying which part is wrong.
    """
    rest = url.removeprefix(SENTINEL_SCHEME)
    password = None
    if "@" in rest:
        secret, rest = rest.rsplit("@", 1)
        password = unquote(secret.split(":", 1)[-1]) or None
    where, _, path = rest.partition("/")
    service, _, db = path.partition("/")
    if not where or not service:
        raise ValueError(_wrong(url, "it names no Sentinel or no service"))
    if db and not db.isdigit():
        raise ValueError(_wrong(url, f"the database {db!r} is not a number"))
    return SentinelURL(
        tuple(_address(url, part) for part in where.split(",")),
        unquote(service),
        int(db or 0),
        password,
    )


def _address(url: str, part: str) -> tuple[str, int]:
    host, _, port = part.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(_wrong(url, f"{part!r} is not HOST:PORT"))
    return host.strip("[]"), int(port)


def _wrong(url: str, why: str) -> str:
    return f"--discovery {url!r}: {why}; give {SENTINEL_FORM}"
