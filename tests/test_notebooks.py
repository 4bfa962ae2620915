"""Every notebook executes (library code only, small sizes)."""

import glob

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO


@pytest.mark.parametrize("path", sorted(glob.glob(str(REPO / "notebooks" / "*.ipynb"))))
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    if "gradients" in path:
        worst = float(outputs.split("worst relative error:")[1].split()[0])
        assert worst <= 1e-10
