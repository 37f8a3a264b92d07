"""Headless Chromium for the dashboard's tests and benchmark: Debian's
(``.ci/run`` installs it), driven by Playwright, which cannot download a
browser of its own here."""

from __future__ import annotations

from typing import Any, Final

CHROMIUM: Final = "/usr/bin/chromium"
# As Chromium must run here: no sandbox as root, and nothing that reaches
# for the network on its own (this machine refuses it).
CHROMIUM_ARGS: Final = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def launch(playwright: Any) -> Any:
    """A headless Chromium of Playwright's ``playwright`` object."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM, args=list(CHROMIUM_ARGS)
    )
