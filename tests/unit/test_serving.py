"""Where a worker's or a dispatcher's server listens, and what it says of
it (:func:`workers.common.serving.bind`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from grpc import aio

from tests.support.pools import self_signed
from workers.common import serving

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_server_off_loopback_warns_of_plain_text_only_without_tls(
    tls: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Listening on all addresses warns that traffic is not encrypted, and
    only when it is not. Regression: a pool with --tls-cert said it was."""
    caplog.set_level(logging.WARNING, logger=serving.log.name)
    credentials = None
    if tls:
        cert, key = self_signed(tmp_path, "127.0.0.1")
        credentials = serving.server_credentials(str(cert), str(key))
    server = aio.server()
    try:
        address, socket_path = serving.bind(
            server, "0.0.0.0", lambda: tmp_path / "s.sock", credentials=credentials
        )
    finally:
        await server.stop(None)
    assert socket_path is None and address.rsplit(":", 1)[1].isdigit()
    said = [record.getMessage() for record in caplog.records]
    assert any("not encrypted" in line for line in said) is not tls
