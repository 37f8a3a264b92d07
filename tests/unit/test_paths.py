import os
import stat
from pathlib import Path

import pytest

from discovery import InvalidNamespace, UnsafeRuntimeDirectory, paths


@pytest.mark.parametrize(
    "name",
    [
        "",
        "../../etc/passwd",
        "a/b",
        "..",
        ".",
        "x" * 65,
        "nul\x00byte",
        "\uff50ool",  # fullwidth look-alike
        "p\u043e\u043el",  # Cyrillic look-alikes
        "trailing\n",
        "sp ace",
        7,
    ],
)
def test_invalid_namespace_is_a_value_error(name: object) -> None:
    """Traversal, separators, empty, over-long, look-alikes and NUL are refused."""
    with pytest.raises(InvalidNamespace, match=r"^invalid namespace .*; use 1 to 64"):
        paths.validate_namespace(name)
    assert issubclass(InvalidNamespace, ValueError)


def test_namespace_is_hashed_into_names() -> None:
    """Segment and directory names carry a hash, never the raw name."""
    name = "My.pool-1_" + "z" * 54
    assert len(name) == 64 and paths.validate_namespace(name) == name
    for key in paths.segment_name(name), paths.namespace_dir(name, create=False).name:
        assert key.startswith("shmp-") and "My" not in key and len(key) == 29


def test_runtime_dir_is_private() -> None:
    """The runtime directory is created 0700 and owned by this user."""
    st = os.stat(paths.runtime_dir())
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_runtime_dir_refuses_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted symlink in place of the runtime directory is refused."""
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", tmp_path / "shm-pool")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(UnsafeRuntimeDirectory, match="symbolic link; remove the link"):
        paths.runtime_dir()


def test_runtime_dir_refuses_open_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group- or world-accessible runtime directory is refused, with the fix."""
    (tmp_path / "shm-pool").mkdir(mode=0o700)
    os.chmod(tmp_path / "shm-pool", 0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(UnsafeRuntimeDirectory, match=r"mode is 0777; run `chmod 700"):
        paths.runtime_dir()


def test_private_file_refuses_symlink(tmp_path: Path) -> None:
    """Opening a runtime file never follows a symlink (and so never truncates)."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "lock")
    with pytest.raises(UnsafeRuntimeDirectory, match="symbolic link"):
        paths.open_private_file(tmp_path / "lock")
    assert victim.read_text() == "precious"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_runtime_dir_refuses_other_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime directory owned by another user is refused."""
    (tmp_path / "shm-pool").mkdir(mode=0o700)
    os.chown(tmp_path / "shm-pool", 54321, 54321)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(UnsafeRuntimeDirectory, match=r"belongs to uid 54321"):
        paths.runtime_dir()
