"""Which registered workers the dispatcher sends tasks (and the token) to:
anyone who can write to the registry may publish any address."""

from __future__ import annotations

import uuid

import pytest

from discovery import WorkerInfo, paths
from pool.dispatcher.admission import refusal


def _worker(address: str, **extra: str) -> WorkerInfo:
    return WorkerInfo(uuid.uuid4(), address, 1, "1", extra=extra)


@pytest.mark.parametrize("require_tls", [False, True])
def test_a_unix_socket_in_the_pools_directory_is_taken(
    namespace: str, require_tls: bool
) -> None:
    home = paths.namespace_dir(namespace, create=False)
    assert refusal(_worker(f"unix:{home}/w-1.sock"), namespace, require_tls) is None


@pytest.mark.parametrize(
    "where", ["/tmp/w.sock", "{home}/../w.sock", "{home}/sub/w.sock", "{home}x/w.sock"]
)
def test_a_unix_socket_elsewhere_is_refused(namespace: str, where: str) -> None:
    home = paths.namespace_dir(namespace, create=False)
    address = "unix:" + where.format(home=home)
    why = refusal(_worker(address), namespace, require_tls=False)
    assert why == f"its unix socket is outside the pool's directory {home}"


def test_plain_tcp_is_refused_only_once_a_ca_is_given(namespace: str) -> None:
    plain, tls = _worker("10.0.0.7:5000"), _worker("10.0.0.7:5001", tls="1")
    assert refusal(plain, namespace, require_tls=False) is None
    assert refusal(tls, namespace, require_tls=False) is None
    assert refusal(tls, namespace, require_tls=True) is None
    assert refusal(plain, namespace, require_tls=True) == (
        "it does not serve TLS, and the pool requires it (--tls-ca)"
    )
