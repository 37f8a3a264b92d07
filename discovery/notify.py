"""Waking a namespace's subscribers after a change to its registry.

Writers (publishers, the owner, a subscriber that reaped a dead worker)
write the registry's generation to ``<namespace dir>/notify``; subscribers
watch that directory (:mod:`discovery.watch`).
"""

from __future__ import annotations

import os
import struct
from typing import Final

from discovery import paths

_GENERATION: Final = struct.Struct("<Q")


class Notifier:
    """Wakes a namespace's subscribers by writing its notification file.

    A write (not a touch) so that inotify reports ``IN_MODIFY``: watchdog 7
    reports a touch as an attribute change, which older handlers ignore.
    """

    def __init__(self, namespace: str) -> None:
        path = paths.namespace_dir(namespace) / paths.NOTIFY_FILE
        self._fd: int | None = paths.open_private_file(path, os.O_WRONLY)

    def notify(self, generation: int) -> None:
        """Announce that the registry reached ``generation``."""
        if self._fd is not None:
            os.pwrite(self._fd, _GENERATION.pack(generation), 0)

    def close(self) -> None:
        """Close the file. Never raises."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
