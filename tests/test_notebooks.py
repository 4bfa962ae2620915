"""Every notebook executes (library code only, small sizes); inspect_checkpoint.ipynb on a tiny
trained run (its workdir passed as RANK4JAX_WORKDIR, which the kernel inherits)."""

import glob

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO


@pytest.mark.parametrize("path", sorted(glob.glob(str(REPO / "notebooks" / "*.ipynb"))))
def test_notebook_executes(path, tiny_run, monkeypatch):
    monkeypatch.setenv("RANK4JAX_WORKDIR", str(tiny_run))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    images = sum(o.get("output_type") == "display_data" for c in nb.cells for o in c.get("outputs", []))
    if "gradients" in path:
        worst = float(outputs.split("worst relative error:")[1].split()[0])
        assert worst <= 1e-10
    if "inspect_checkpoint" in path:
        assert f"{tiny_run}: best step " in outputs and outputs.count("  gold   ") == 4
        assert "weights on PAD keys: 0.0\n" in outputs and "picked: " in outputs
        assert "predicted S(T): " in outputs and images == 2  # attention grids, saliency map


def test_both_notebooks_are_found():
    names = sorted(p.rsplit("/", 1)[-1] for p in glob.glob(str(REPO / "notebooks" / "*.ipynb")))
    assert names == ["gradients.ipynb", "inspect_checkpoint.ipynb"]
