"""Every notebook executes as Jupyter runs it, the kernel started in notebooks/ (library code only,
small sizes); trained_model.ipynb on the released D = 64 runs (released/d64/)."""

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

# Checks run in each notebook's own kernel, on its variables, after its last cell.
CHECKS = {
    "gradients.ipynb": [
        "assert max(r[4] for r in rows) <= 1e-10, rows  # analytic vs autodiff, every parameter",
        "assert len(rows) == len(jax.tree_util.tree_leaves(g_auto))",
    ],
    "flax_modules.ipynb": [
        "assert losses[-1] < 0.05 and accuracy == 1.0, (losses[-1], accuracy)  # the class read from cell (0, 0)",
        "np.testing.assert_allclose(np.asarray(weights).sum(axis=(-2, -1)), 1.0, rtol=1e-5)  # one joint softmax",
        "assert float(np.abs(np.asarray(weights)[..., 3, 4:]).max()) == 0.0  # the missing patches: no weight",
        "assert float(np.abs(np.asarray(causal_weights)[:, :, 1, :, 2:]).max()) == 0.0  # frame 1 sees frames 0-1",
        "assert mean_map[:, 0, 0].max() > 0.25  # a head attends to cell (0, 0), uniform is 1/22",
        "assert grid_losses[-1] < 0.1 * float(jnp.var(targets)), grid_losses[-1]  # continuous inputs learned",
        "assert stack.attn.wq.shape == (LAYERS, HEADS, DX * DT, DX * DT)",
        "assert float(jnp.abs(stacked_out - one_by_one).max()) < 1e-5  # scan = the layers one by one",
        "assert bool(jnp.array_equal(restored(tokens[:8], visible), model(tokens[:8], visible)))",
        "assert g_wq.shape == (DX * DT, DX * DT) and np.abs(g_wq).max() > 0",
    ],
    "trained_model.ipynb": [
        "assert (rank4.family.name, baseline.family.name) == ('rank4', 'baseline')",
        "assert all(len(p.states) == 1 and p.states[0].tokens for p in predictions.values())",
        "np.testing.assert_allclose(np.asarray(maps[0][0, :, x_q, t_q]).sum(axis=(-2, -1)), 1.0, rtol=1e-5)",
        "assert float(np.asarray(maps[0][0, :, x_q, t_q])[:, np.asarray(window[0]).T == 0].sum()) == 0.0  # PAD keys",
        "f = jax.jit(ls_t)  # the gradient along X against a central difference",
        "fd, along = (float(f(x * 1.01)) - float(f(x * 0.99))) / 0.02, float(jnp.sum(g * x))",
        "assert saliency.shape == (cfg.n_tokens, cfg.n_slices) and abs(fd - along) <= 0.02 * max(1.0, abs(fd))",
        "assert all(v.shape == (2,) and np.all(np.isfinite(v)) for v in ending_ce.values())",
    ],
}


@pytest.mark.parametrize("path", sorted(glob.glob(str(REPO / "notebooks" / "*.ipynb"))))
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    checks = "\n".join(CHECKS[os.path.basename(path)])
    nb.cells.append(nbformat.v4.new_code_cell(checks))  # an assertion error fails the execution
    kernel_dir = {"metadata": {"path": str(REPO / "notebooks")}}  # where Jupyter starts the kernel
    NotebookClient(nb, timeout=300, kernel_name="python3", resources=kernel_dir).execute()
    images = sum(o.get("output_type") == "display_data" for c in nb.cells for o in c.get("outputs", []))
    figures = {"flax_modules.ipynb": 3, "gradients.ipynb": 3, "trained_model.ipynb": 2}
    assert images == figures[os.path.basename(path)]  # every figure


def test_every_notebook_is_found():
    names = sorted(p.rsplit("/", 1)[-1] for p in glob.glob(str(REPO / "notebooks" / "*.ipynb")))
    assert names == ["flax_modules.ipynb", "gradients.ipynb", "trained_model.ipynb"]
