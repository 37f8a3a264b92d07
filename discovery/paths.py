"""Names and private runtime paths of a namespace.

Owns the per-user runtime directory (``$XDG_RUNTIME_DIR/shm-pool``, else
``<tmp>/shm-pool-<uid>``) and, inside it, one directory per namespace that
holds the namespace's lock and notification files (and, later, liveness
files, the pool's address and its token). Called by :mod:`registry`,
:mod:`publisher` and :mod:`subscriber`; nothing else builds these paths.

Every directory is created 0700 and checked on each use: a real directory
(not a symlink), owned by this user, closed to group and others. Files are
opened with ``O_NOFOLLOW | O_CLOEXEC``. A namespace name is validated and
hashed, so no caller-supplied text ever reaches a path or a segment name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Final

from discovery.errors import InvalidNamespace, UnsafeRuntimeDirectory

NAMESPACE_MAX_LEN: Final = 64
SEGMENT_PREFIX: Final = "shmp-"
SHM_DIR: Final = Path("/dev/shm")
LOCK_FILE: Final = "lock"
NOTIFY_FILE: Final = "notify"

_NAMESPACE_RE: Final = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)
_OPEN_FLAGS: Final = os.O_NOFOLLOW | os.O_CLOEXEC


def validate_namespace(namespace: object) -> str:
    """Return ``namespace`` if it is a valid name.

    :raises InvalidNamespace: (a ``ValueError``) naming what is wrong.
    """
    if not isinstance(namespace, str):
        raise InvalidNamespace(namespace, f"a name is a str, not {type(namespace)}")
    if not namespace:
        raise InvalidNamespace(namespace, "it is empty")
    if len(namespace) > NAMESPACE_MAX_LEN:
        raise InvalidNamespace(
            namespace, f"it is {len(namespace)} characters long, over 64"
        )
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise InvalidNamespace(namespace, "it has a character outside the set")
    if namespace in {".", ".."}:
        raise InvalidNamespace(namespace, "it is a path component")
    return namespace


def namespace_key(namespace: str) -> str:
    """The hashed token of a namespace used in every file and segment name."""
    digest = hashlib.sha256(validate_namespace(namespace).encode()).hexdigest()
    return f"{SEGMENT_PREFIX}{digest[:24]}"


def segment_name(namespace: str) -> str:
    """The shared-memory segment name of this user's namespace (``shmp-<hash>``).

    /dev/shm is shared by every user: the hash covers the user id as well,
    so one user's namespace never meets, or squats, another's of the same name.
    """
    name = f"{os.geteuid()}:{validate_namespace(namespace)}"
    return f"{SEGMENT_PREFIX}{hashlib.sha256(name.encode()).hexdigest()[:24]}"


def runtime_dir() -> Path:
    """The per-user runtime directory, created and checked.

    :raises UnsafeRuntimeDirectory: if it is a symlink, another user's, or
        open to group or others.
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        base = Path(xdg) / "shm-pool"
    else:
        base = Path(tempfile.gettempdir()) / f"shm-pool-{os.geteuid()}"
    return ensure_private_dir(base)


def namespace_dir(namespace: str, *, create: bool = True) -> Path:
    """The namespace's directory inside the runtime directory.

    With ``create=False`` the path is returned whether or not it exists.
    """
    path = runtime_dir() / namespace_key(namespace)
    return ensure_private_dir(path) if create else path


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` 0700 if missing, then check that it is safe to use."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_private_dir(path)
    return path


def check_private_dir(path: Path) -> None:
    """Refuse a directory that another user could redirect or read."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRuntimeDirectory(
            path, "it is a symbolic link", "remove the link; it will be recreated"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRuntimeDirectory(
            path, "it is not a directory", "remove it; it will be recreated"
        )
    if st.st_uid != os.geteuid():
        raise UnsafeRuntimeDirectory(
            path,
            f"it belongs to uid {st.st_uid}, not {os.geteuid()}",
            "remove it or set XDG_RUNTIME_DIR to a directory of your own",
        )
    if st.st_mode & 0o077:
        raise UnsafeRuntimeDirectory(
            path,
            f"its mode is {stat.S_IMODE(st.st_mode):04o}",
            f"run `chmod 700 {path}`",
        )


def open_private_file(path: Path, flags: int = os.O_RDWR) -> int:
    """Open (creating 0600) a file inside a checked directory; never a symlink.

    :returns: a close-on-exec descriptor the caller owns.
    :raises UnsafeRuntimeDirectory: if ``path`` is a symlink.
    """
    try:
        return os.open(path, flags | os.O_CREAT | _OPEN_FLAGS, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeRuntimeDirectory(
                path, "it is a symbolic link", "remove the link"
            ) from exc
        raise


def remove_namespace_dir(namespace: str) -> None:
    """Remove the namespace's files and directory. Never raises."""
    try:
        path = namespace_dir(namespace, create=False)
        for entry in os.scandir(path):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        os.rmdir(path)
    except OSError:
        pass


def same_file(fd: int, path: os.PathLike[str]) -> bool | None:
    """True if ``path`` still names the file open as ``fd``; None if it
    names nothing."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def check_segment_owner(path: os.PathLike[str], fd: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafeRuntimeDirectory(
            path,
            f"the segment belongs to uid {st.st_uid}",
            "use a namespace of your own",
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise UnsafeRuntimeDirectory(
            path,
            f"the segment's mode is {stat.S_IMODE(st.st_mode):04o}",
            "remove it, or use another namespace",
        )


def write_private(namespace: str, name: str, text: str) -> None:
    """Write ``text`` to the file ``name`` (0600) in the namespace's directory."""
    fd = open_private_file(namespace_dir(namespace) / name, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
