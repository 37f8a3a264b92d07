"""What a ``redis+sentinel://`` URL names (no Redis needed)."""

from __future__ import annotations

import pytest

from discovery.backends import check_url
from discovery.urls import SentinelURL, is_sentinel, parse_sentinel


def test_a_sentinel_url_names_its_sentinels_service_database_and_password() -> None:
    url = "redis+sentinel://:s%40cret@10.0.0.7:26379,[::1]:26380/my%20primary/3"
    assert is_sentinel(url) and not is_sentinel("redis://10.0.0.7:6379")
    assert parse_sentinel(url) == SentinelURL(
        (("10.0.0.7", 26379), ("::1", 26380)), "my primary", 3, "s@cret"
    )


def test_a_sentinel_url_defaults_to_database_0_and_no_password() -> None:
    assert parse_sentinel("redis+sentinel://h:1/m") == SentinelURL((("h", 1),), "m")


@pytest.mark.parametrize("port", ["0", "65536", ""])
def test_a_port_out_of_range_is_refused(port: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_sentinel(f"redis+sentinel://h:{port}/m")


@pytest.mark.parametrize(
    ("url", "wrong"),
    [
        ("redis+sentinel://127.0.0.1:26379", "no Sentinel or no service"),
        ("redis+sentinel:///mymaster", "no Sentinel or no service"),
        ("redis+sentinel://127.0.0.1/mymaster", "'127.0.0.1' is not HOST:PORT"),
        ("redis+sentinel://h:1,h:x/mymaster", "'h:x' is not HOST:PORT"),
        ("redis+sentinel://h:1/mymaster/zero", "the database 'zero'"),
    ],
)
def test_a_sentinel_url_that_is_not_well_formed_says_what_is_wrong(
    url: str, wrong: str
) -> None:
    with pytest.raises(ValueError, match="redis\\+sentinel://HOST:PORT") as raised:
        check_url(url)
    assert wrong in str(raised.value)
