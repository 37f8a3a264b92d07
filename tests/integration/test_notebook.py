"""The notebook docs/notebook.ipynb, executed by nbclient in a real
ipykernel: cells' functions, classes and lambdas on an embedded Pool and on
a running pool, an initializer's global seen by the cells' tasks, a
progress line that reaches 100 %, and a task's print under its cell."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import ROOT
from tests.support.pools import running_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NOTEBOOK = ROOT / "docs" / "notebook.ipynb"


def _texts(cell: Any) -> tuple[str, list[str]]:
    """What a code cell printed, and the last text of each display it made."""
    printed = "".join(
        out["text"] for out in cell.outputs if out["output_type"] == "stream"
    )
    shown = [
        out["data"]["text/plain"]
        for out in cell.outputs
        if out["output_type"] == "display_data"
    ]
    errors = [out for out in cell.outputs if out["output_type"] == "error"]
    assert not errors, errors
    return printed, shown


def test_the_notebook_runs_on_an_embedded_and_a_running_pool(
    namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each cell's outputs, as a user sees them."""
    import nbformat
    from nbclient import NotebookClient

    notebook = tmp_path / "notebook.ipynb"
    shutil.copy(NOTEBOOK, notebook)
    nb = nbformat.read(notebook, as_version=4)  # type: ignore[no-untyped-call]
    monkeypatch.setenv("POOL_NAMESPACE", namespace)
    with running_pool(namespace, "--workers", "1"):
        client = NotebookClient(
            nb,
            timeout=180,
            kernel_name="python3",
            resources={"metadata": {"path": str(tmp_path)}},
        )
        client.execute()
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert _texts(code[0]) == ("", [])
    printed, shown = _texts(code[1])
    assert printed == f"{{'small'}}\nPoint(42)\n{sum(x * x for x in range(100_000))}\n"
    assert len(shown) == 1 and "100% 100,000/100,000" in shown[0]
    assert shown[0].endswith("0 failed")
    printed, _ = _texts(code[2])
    assert re.fullmatch(r"\[w0 pid=\d+\] hello from a worker\n", printed), printed
    printed, shown = _texts(code[3])
    assert printed == "Point(7)\n[0, 1, 2, 3, 4]\n"
    assert len(shown) == 1 and "100% 5/5" in shown[0]
