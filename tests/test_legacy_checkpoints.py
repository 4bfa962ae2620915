"""Checkpoints of the layout before 2026-12-05 (the whole train state as one ``state`` item) are refused
in one line naming the last commit that reads them; nothing is moved or written."""

import os
import shutil

import orbax.checkpoint as ocp
import pytest

from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.errors import CheckpointError
from rank4jax.runs import describe_run, load_run
from rank4jax.training.loop import train
from tests.helpers import tiny_config

REFUSAL = r"checkpoint 6 in .* has the layout before 2026-12-05 \(one 'state' item\), which rank4jax no longer reads: "


def _to_legacy(workdir) -> None:
    """Checkpoint 6 of ``workdir`` rewritten in the earlier layout (orbax's public API)."""
    with RunCheckpoints(str(workdir), read_only=True) as ckpt:
        state = ckpt.restore_state(6, describe_run(ckpt, 6).abstract_state)
    step_dir = os.path.join(workdir, "checkpoints", "6")
    for item in ("params", "opt_state", "data_iter"):
        shutil.rmtree(os.path.join(step_dir, item))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.join(step_dir, "state"), state)


def test_a_checkpoint_of_the_earlier_layout_is_refused_in_one_line(tiny_run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    _to_legacy(str(old))
    listing = sorted(os.listdir(old / "checkpoints" / "6"))
    with pytest.raises(CheckpointError, match=REFUSAL + "commit 5da16f5 resumes and evaluates it$"):
        load_run(str(old))
    with pytest.raises(CheckpointError, match=REFUSAL):
        train(tiny_config(num_steps=8), str(old))
    assert sorted(os.listdir(old / "checkpoints")) == ["4", "6"]  # nothing moved aside
    assert sorted(os.listdir(old / "checkpoints" / "6")) == listing
    assert load_run(str(old), 4).step == 4  # the current layout beside it reads as ever
