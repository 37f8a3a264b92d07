"""A task module whose import hangs: it creates the file
``$SHMP_IMPORT_GATE.importing``, then waits for the file that
``$SHMP_IMPORT_GATE`` names, for at most 10 s."""

from __future__ import annotations

import os
import time

_gate = os.environ.get("SHMP_IMPORT_GATE", "")
_deadline = time.monotonic() + 10
if _gate:
    open(_gate + ".importing", "w").close()
while _gate and not os.path.exists(_gate) and time.monotonic() < _deadline:
    time.sleep(0.01)


def identity(x: int) -> int:
    return x
