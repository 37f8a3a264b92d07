import dataclasses
import uuid

import pytest

from discovery import DiscoveryEvent, WorkerInfo
from tests.support.streams import make_info


def test_worker_info_round_trips_through_protobuf() -> None:
    """Every field survives to_protobuf/from_protobuf and encode/decode."""
    info = make_info(
        tags={"gpu", "fast"},
        extra={"zone": "a", "rack": "7"},
        status="draining",
        capacity=4,
    )
    assert WorkerInfo.from_protobuf(info.to_protobuf()) == info
    assert WorkerInfo.decode(info.encode()) == info


def test_worker_info_encoding_is_deterministic() -> None:
    """Equal infos encode to equal bytes, whatever order tags and extra came in."""
    uid = uuid.uuid4()
    a = make_info(uid=uid, tags=["x", "y", "z"], extra={"a": "1", "b": "2"})
    b = make_info(uid=uid, tags=["z", "y", "x"], extra={"b": "2", "a": "1"})
    assert a == b and a.encode() == b.encode()


def test_worker_info_is_frozen_and_hashable() -> None:
    """An info cannot change under a subscriber, and can key a dict."""
    info = make_info(extra={"k": "v"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.status = "draining"  # type: ignore[misc]
    with pytest.raises(TypeError):
        info.extra["k"] = "w"  # type: ignore[index]
    assert {info: 1}[info] == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status": "sleeping"}, r"^status must be one of \['draining', 'ready'"),
        ({"capacity": 0}, r"^capacity must be at least 1, got 0$"),
        ({"pid": -1}, r"^pid must not be negative, got -1$"),
        ({"uid": "not-a-uuid"}, r"^uid must be a UUID"),
    ],
)
def test_worker_info_rejects_bad_fields(
    fields: dict[str, object], message: str
) -> None:
    """A bad field is a ValueError that names it."""
    with pytest.raises(ValueError, match=message):
        make_info(**fields)


def test_worker_info_decode_rejects_an_unknown_status() -> None:
    """A status number this version does not know (or none) is refused."""
    message = make_info().to_protobuf()
    message.status = 0  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"^unknown worker status 0$"):
        WorkerInfo.from_protobuf(message)


def test_worker_info_decode_rejects_garbage() -> None:
    """Undecodable bytes are a ValueError, not a protobuf-specific error."""
    with pytest.raises(ValueError, match=r"^undecodable WorkerInfo"):
        WorkerInfo.decode(b"\xff\xff\xff")


def test_discovery_event_carries_type_and_info() -> None:
    info = make_info()
    event = DiscoveryEvent("worker-added", info)
    assert (event.type, event.worker_info) == ("worker-added", info)
