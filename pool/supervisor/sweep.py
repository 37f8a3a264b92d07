"""The temporary directories of this user's pool processes, and the
sweep of those dead ones left.

``multiprocessing`` keeps the forkserver's socket in a temporary directory
(``/tmp/pymp-*``), removed at exit, and left behind by a process that is
killed. A pool process's goes in the runtime directory instead
(:func:`use_private_temp_dir`), named after its pid namespace and pid, and
the next pool to start removes those of dead processes
(:func:`sweep_temp_dirs`; ``pool ls --clean`` too). The dead pools'
namespaces themselves are swept by :func:`discovery.sweep_dead`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from multiprocessing import process, util
from pathlib import Path
from typing import Final

from discovery import paths
from discovery.liveness import pid_namespace

# multiprocessing keeps the forkserver's socket in a temporary directory
# (``/tmp/pymp-*``), removed at exit, and left behind by a process that is
# killed. This process's goes in the runtime directory instead, named after
# its pid namespace and pid, and the next pool to start removes those of
# dead processes.
TEMP_PREFIX: Final = "mp-"


def temp_dir_of(pid: int) -> Path:
    """The temporary directory :func:`use_private_temp_dir` gives process
    ``pid`` (of this pid namespace)."""
    return paths.runtime_dir() / f"{TEMP_PREFIX}{pid_namespace()}-{pid}"


def use_private_temp_dir() -> None:
    """Give this process's ``multiprocessing`` a temporary directory in the
    runtime directory, unless it has one already; it is removed at exit."""
    config = process.current_process()._config  # type: ignore[attr-defined]
    if config.get("tempdir") is not None:
        return
    path = temp_dir_of(os.getpid())
    path.mkdir(mode=0o700, exist_ok=True)
    config["tempdir"] = str(path)
    # As multiprocessing registers its own: after every other finalizer.
    util.Finalize(None, _remove_temp_dir, args=(str(path),), exitpriority=-100)


def _remove_temp_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if (current := process.current_process()) is not None:
        current._config["tempdir"] = None  # type: ignore[attr-defined]


def sweep_temp_dirs() -> None:
    """Remove the temporary directories of dead processes (see
    :func:`use_private_temp_dir`). Never raises."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(paths.runtime_dir()):
            name = entry.name
            if not name.startswith(TEMP_PREFIX) or not entry.is_dir(
                follow_symlinks=False
            ):
                continue
            pidns, _, pid = name[len(TEMP_PREFIX) :].partition("-")
            # (Another pid namespace's, such as a container's, is not ours to
            # judge.)
            if pidns == str(pid_namespace()) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
