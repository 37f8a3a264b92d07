"""Who owns a namespace, told by a lock rather than by a pid.

The process that creates a namespace's registry holds an exclusive flock on
``<namespace dir>/owner`` for as long as it owns it; the file names the
owner's pid and the namespace. The kernel releases the lock when the owner
dies, however it dies, so "lock free" means "owner gone" (pids are reused;
a lock is not), and whatever the namespace still holds then is garbage
that the next owner, or :func:`sweep_dead`, removes.

A runtime directory is one user's of one login, so a pool that ran with
another (another ``XDG_RUNTIME_DIR``: a service, a container sharing
``/dev/shm``) leaves its segment where :func:`sweep_dead` cannot see whose
it is. :func:`reap_registries` judges such a segment by itself: its creator
holds a shared ``flock`` on it for as long as it has it open
(:meth:`discovery.registry.Registry.create`), so a registry nobody holds,
whose creator's pid (in its header) is gone, is garbage.

Callers: :mod:`discovery.local` (claims and releases ownership, reclaims),
and the pool (``owner_pid`` for ``pool down``, ``sweep_dead`` and
``reap_registries`` when a pool starts and in ``pool ls --clean``). This
module and :mod:`local` are the only ones that remove a namespace's segment.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Self

import portalocker

from discovery import paths
from discovery.errors import NamespaceInUse
from discovery.layout import HEADER, MAGIC
from discovery.lock import RegistryLock
from discovery.registry import Registry

log = logging.getLogger(__name__)

OWNER_FILE: Final = "owner"
_REGISTRY_NAME: Final = re.compile(rf"{paths.SEGMENT_PREFIX}[0-9a-f]{{24}}")
_CLAIM_ATTEMPTS: Final = 5
_EXCLUSIVE_NOW: Final = (
    portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING
)


class Ownership:
    """This process's hold on a namespace (see the module docstring)."""

    def __init__(self, namespace: str, fd: int) -> None:
        self.namespace, self._fd = namespace, fd

    @classmethod
    def claim(cls, namespace: str) -> Self | None:
        """Take ownership of ``namespace`` unless a live process holds it.

        :returns: the hold, or None if another live owner has it.
        """
        for _ in range(_CLAIM_ATTEMPTS):
            path = paths.namespace_dir(namespace) / OWNER_FILE
            try:
                fd = paths.open_private_file(path)
            except FileNotFoundError:  # its directory was swept meanwhile
                continue
            try:
                portalocker.lock(fd, _EXCLUSIVE_NOW)
            except portalocker.AlreadyLocked:
                os.close(fd)
                return None
            if paths.same_file(fd, path):  # not removed (swept) as we locked it
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {namespace}\n".encode(), 0)
                return cls(namespace, fd)
            os.close(fd)
        raise RuntimeError(f"could not claim namespace {namespace!r}: it keeps moving")

    def release(self) -> None:
        """Give ownership up (the owner file goes with its directory). Never
        raises."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def owner_pid(namespace: str) -> int | None:
    """The pid of the live process that owns ``namespace``, or None."""
    path = paths.namespace_dir(namespace, create=False) / OWNER_FILE
    held = _read_if_held(path)
    return held[0] if held is not None else None


def _read_if_held(path: Path) -> tuple[int, str] | None:
    """The (pid, namespace) an owner file names while its lock is held."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            portalocker.lock(fd, _EXCLUSIVE_NOW)
        except portalocker.AlreadyLocked:
            text = os.pread(fd, 200, 0).decode(errors="replace")
            pid, _, namespace = text.partition(" ")
            return (int(pid) if pid.isdigit() else 0), namespace.strip()
        return None
    finally:
        os.close(fd)  # releases the lock if we took it


def reclaim(namespace: str) -> bool:
    """Remove what a dead owner left of ``namespace``: its segment and files.

    :returns: True if a segment was removed.
    :raises NamespaceInUse: if a live process owns it.
    """
    lock = RegistryLock(namespace)
    try:
        with lock.hold():
            removed = _remove_unowned(namespace)
    finally:
        lock.close()
    if removed is None:
        raise NamespaceInUse(namespace, owner_pid(namespace) or 0)
    return removed


def _remove_unowned(namespace: str) -> bool | None:
    """With the registry lock held, remove the namespace unless a live
    process owns it (None then); whether it had a segment."""
    ownership = Ownership.claim(namespace)
    if ownership is None:
        return None
    try:
        existed = (paths.SHM_DIR / paths.segment_name(namespace)).exists()
        Registry.unlink_name(namespace)
        paths.remove_namespace_dir(namespace)
    finally:
        ownership.release()
    return existed


def sweep_dead() -> list[str]:
    """Remove every namespace of this user whose owner has died: its segment
    in /dev/shm and its runtime directory. A namespace that is busy (its
    registry lock held) or owned is left alone. Never raises.

    :returns: the namespaces removed.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(paths.runtime_dir()))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(paths.SEGMENT_PREFIX) or not entry.is_dir(
            follow_symlinks=False
        ):
            continue
        try:
            namespace = _dead_namespace(Path(entry.path))
            if namespace is not None and _remove_if_dead(namespace):
                removed.append(namespace)
        except (OSError, ValueError) as exc:
            log.warning("could not sweep %s: %s", entry.path, exc)
    return removed


@dataclass(frozen=True)
class NamespaceEntry:
    """A namespace this user's runtime directory holds (``pool ls``)."""

    namespace: str
    owner_pid: int | None  # None: its owner is dead, and it is garbage
    directory: Path
    segment: Path
    segment_exists: bool


def namespaces() -> list[NamespaceEntry]:
    """Every namespace in this user's runtime directory, live or left by a
    dead pool, sorted by name. Never raises for one unreadable entry."""
    found = []
    try:
        entries = list(os.scandir(paths.runtime_dir()))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(paths.SEGMENT_PREFIX):
            continue
        directory = Path(entry.path)
        held = _read_if_held(directory / OWNER_FILE)
        namespace = held[1] if held is not None else _dead_namespace(directory)
        if namespace is None:
            continue
        try:
            if paths.namespace_key(namespace) != directory.name:
                continue  # a file that lies about what its directory holds
            segment = paths.SHM_DIR / paths.segment_name(namespace)
        except ValueError:
            continue
        found.append(
            NamespaceEntry(
                namespace,
                held[0] if held is not None else None,
                directory,
                segment,
                segment.exists(),
            )
        )
    return sorted(found, key=lambda e: e.namespace)


def _dead_namespace(directory: Path) -> str | None:
    """The namespace a dead owner left in ``directory``, if it is one."""
    path = directory / OWNER_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # never owned (a subscriber waiting for it, say)
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace")
    finally:
        os.close(fd)
    namespace = text.partition(" ")[2].strip()
    try:
        if paths.namespace_key(namespace) != directory.name:
            return None  # not what this directory holds: leave it
    except ValueError:
        return None
    return namespace


def _remove_if_dead(namespace: str) -> bool:
    lock = RegistryLock(namespace)
    try:
        with lock.hold_if_free() as held:
            return held and _remove_unowned(namespace) is not None
    finally:
        lock.close()


def reap_registries() -> list[str]:
    """Remove this user's registry segments that no live process owns,
    whatever runtime directory their pool ran in (see the module
    docstring). Never raises.

    :returns: the segment names removed.
    """
    try:
        with os.scandir(paths.SHM_DIR) as entries:
            names = [e.name for e in entries if _REGISTRY_NAME.fullmatch(e.name)]
    except OSError:
        return []
    removed = []
    for name in names:
        with contextlib.suppress(OSError):
            if _remove_if_orphaned(paths.SHM_DIR / name):
                removed.append(name)
    return removed


def _remove_if_orphaned(path: Path) -> bool:
    """Unlink ``path``, a registry segment, if it is ours, complete, and
    neither its creator's lock is held nor its creator alive."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its creator has it open
        header = os.pread(fd, HEADER.size, 0)
        if len(header) < HEADER.size:
            return False
        magic, *_, creator, _ = HEADER.unpack(header)
        # (No magic yet: being created. A live creator: one of an earlier
        # version, which took no lock.)
        if magic != MAGIC or _alive(creator) or not paths.same_file(fd, path):
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)  # (and the lock with it)


def _alive(pid: int) -> bool:
    """Whether ``pid`` may be a live process (0, unknown: it may)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
