"""Data segments in real shared memory: who owns them is told by a lock
the kernel releases at death; readers map them copy-on-write; a segment is
written again only when nobody maps it, under a new nonce."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from discovery import paths
from workers.protocol import owners, segments
from workers.protocol.errors import DataGone
from workers.protocol.owners import DataOwner

pytestmark = pytest.mark.timeout(60)

CHILD = """
import os, sys
from workers.protocol import segments
from workers.protocol.owners import DataOwner
me = DataOwner(sys.argv[1])
owner = sys.argv[2] if len(sys.argv) > 2 else me.id
done = segments.create(me.name(owner, "r1"), [b"x" * 5000])
half = me.name(owner, "r2")
fd = os.open(segments.SHM_DIR / half, segments.CREATE, 0o600)
os.ftruncate(fd, 3 * segments.PAGE)
os.pwrite(fd, b"y" * 100, segments.PAGE)  # (its header never written)
print(me.id, done.name, half, flush=True)
sys.stdin.read()
"""


@contextmanager
def _child(*args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """A process that owns a data-plane id, wrote a finished segment and a
    half-written one (for ``args[1]``'s owner, if given), and waits."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        yield child, child.stdout.readline().split()
    finally:
        child.kill()
        child.wait()


def _exists(name: str) -> bool:
    return (paths.SHM_DIR / name).exists()


def test_what_a_dead_owner_left_is_reaped_and_a_live_ones_is_not(
    namespace: str,
) -> None:
    key = paths.segment_name(namespace)
    with _child(namespace) as (child, (owner, done, half)):
        assert owners.reap(key) == []
        assert _exists(done) and _exists(half) and _exists(f"{key}.{owner}")
        child.kill()
        child.wait()
        removed = owners.reap(key)
    assert sorted(removed) == sorted([done, half, f"{key}.{owner}"])
    assert not any(_exists(n) for n in removed)


def test_a_dead_writer_half_written_segment_goes_and_its_finished_one_stays(
    namespace: str,
) -> None:
    """A worker killed while it writes a client's result: the pool reaps
    what it left half-written; what it finished stays the (live) client's."""
    client = DataOwner(namespace)
    try:
        with _child(namespace, client.id) as (child, (_, done, half)):
            child.kill()
            child.wait()
            removed = owners.reap(paths.segment_name(namespace))
        assert half in removed and _exists(done) and not _exists(half)
    finally:
        client.close()
    assert not _exists(done)  # (its owner unlinks it as it closes)


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "shmp-x.1.2.a", "", "shmp-" + "0" * 24]
)
def test_a_name_that_is_no_data_segment_is_refused(name: str) -> None:
    with pytest.raises(DataGone, match="not the name of a shm-pool data segment"):
        segments.attach(name, 1, 4096)


def test_a_reader_maps_what_was_written_and_nothing_else(namespace: str) -> None:
    """The nonce a reader was given must be the segment's: a missing, a
    rewritten or a never finished segment is DataGone, never a mixture."""
    me = DataOwner(namespace)
    try:
        written = me.write(me.name(me.id, "a"), [b"abc" * 10_000])
        mapped = segments.attach(written.name, written.nonce, written.size)
        part = written.offsets[0]
        assert mapped[part : part + 3] == b"abc"
        mapped[part : part + 3] = b"zzz"  # (copy-on-write: nobody else sees it)
        again = segments.attach(written.name, written.nonce, written.size)
        assert again[part : part + 3] == b"abc"
        with pytest.raises(DataGone, match="another payload"):
            segments.attach(written.name, written.nonce + 1, written.size)
        with pytest.raises(DataGone, match="is not in /dev/shm"):
            segments.attach(me.name(me.id, "a"), 1, 4096)
        del mapped, again
    finally:
        me.close()


def test_a_segment_is_written_again_only_when_nobody_maps_it(namespace: str) -> None:
    """While a reader maps it, a rewrite is refused (None); once it lets go,
    the rewrite runs under a new nonce (also through a kept mapping, which
    must not keep the writer's lock: readers map it at once after)."""
    me = DataOwner(namespace)
    maps = segments.Mappings()
    try:
        first = me.write(me.name(me.id, "a"), [b"1" * 50_000])
        reader = segments.attach(first.name, first.nonce, first.size)
        assert me.rewrite(first.name, [b"2" * 50_000], maps=maps) is None
        reader.close()
        for byte in (b"3", b"4"):
            second = me.rewrite(first.name, [byte * 50_000], maps=maps)
            assert second is not None and second.nonce != first.nonce
            view = segments.attach(second.name, second.nonce, second.size)
            assert view[second.offsets[0]] == byte[0]
            view.close()
        with pytest.raises(DataGone, match="another payload"):
            segments.attach(first.name, first.nonce, first.size)
        assert segments.rewrite(first.name, [b"5"], expect=first.nonce) is None
    finally:
        maps.clear()
        me.close()
