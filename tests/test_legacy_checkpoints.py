"""Checkpoints of the earlier layout (the whole train state as one ``state`` item, grain's per-process
iterator files in ``data_iter``) still evaluate and resume, through ``rank4jax.checkpoint.legacy``:
the same parameters, and a resumed run identical to one resumed from the current layout."""

import glob
import json
import os
import pathlib
import shutil

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from rank4jax.checkpoint import legacy
from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.data.pipeline import train_dataset
from rank4jax.engine.data_setup import prepare_data
from rank4jax.errors import CheckpointError
from rank4jax.runs import describe_run, load_run
from rank4jax.training.loop import train
from tests.helpers import tiny_config


def _to_legacy(workdir, config) -> None:
    """Rewrite every checkpoint of ``workdir`` in the earlier layout, with orbax's and grain's public APIs."""
    with RunCheckpoints(str(workdir), read_only=True) as ckpt:
        steps = ckpt.all_steps()
        saved = {step: ckpt.restore_state(step, describe_run(ckpt, step).abstract_state) for step in steps}
        positions = {
            step: ckpt.manager.restore(step, args=ocp.args.Composite(data_iter=ocp.args.JsonRestore()))["data_iter"]
            for step in steps
        }
        _, tokenizer = ckpt.load_meta(steps[-1])
    windows = prepare_data(config, tokenizer).windows["train"].windows
    for step in steps:
        step_dir = os.path.join(workdir, "checkpoints", str(step))
        for item in ("params", "opt_state", "data_iter"):
            shutil.rmtree(os.path.join(step_dir, item))
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(os.path.join(step_dir, "state"), saved[step])
        iterator = iter(train_dataset(windows, config.batch_size, seed=config.seed))
        iterator.set_state(positions[step])
        (epath.Path(step_dir) / "data_iter").mkdir()
        grain.checkpoint.CheckpointHandler().save(
            epath.Path(step_dir) / "data_iter", args=grain.checkpoint.CheckpointSave(iterator)
        )


def test_a_run_of_the_earlier_layout_evaluates_and_resumes_exactly(tiny_run, tmp_path):
    config = tiny_config()
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(tiny_run, old)
    shutil.copytree(tiny_run, new)
    _to_legacy(str(old), config)
    assert legacy.is_legacy(str(old / "checkpoints" / "6")) and not legacy.is_legacy(str(new / "checkpoints" / "6"))
    for step in (4, 6):  # the parameters alone, as evaluation and load_run read them
        for a, b in zip(
            jax.tree.leaves(load_run(str(old), step).params),
            jax.tree.leaves(load_run(str(tiny_run), step).params),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)
    longer = tiny_config(num_steps=8)
    assert train(longer, str(old))["step"] == train(longer, str(new))["step"] == 8  # resumed from 6, both
    for a, b in zip(
        jax.tree.leaves(load_run(str(old), 8).params), jax.tree.leaves(load_run(str(new), 8).params), strict=True
    ):
        np.testing.assert_array_equal(a, b)  # the same state and data position: the same steps 7 and 8
    assert not legacy.is_legacy(str(old / "checkpoints" / "8"))  # new checkpoints: the current layout


def test_an_edited_config_of_the_earlier_layout_is_damage_in_one_line_each(tiny_run, tmp_path, capsys):
    """The earlier layout whose saved configs say another n_heads (was 1,572 lines and 57 tracebacks):
    each checkpoint is damage in one warning line, then one error; nothing is moved."""
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    _to_legacy(str(old), tiny_config())
    for path in glob.glob(str(old / "checkpoints" / "*" / "config" / "*")):
        try:
            saved = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
        except ValueError:
            continue
        saved["model"]["n_heads"] = 1
        pathlib.Path(path).write_text(json.dumps(saved), encoding="utf-8")
    capsys.readouterr()
    with pytest.raises(CheckpointError, match=r"no readable checkpoint .*\(6: its state params/layers/0/attn/wk is"):
        load_run(str(old))
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 2
    assert sorted(os.listdir(old / "checkpoints")) == ["4", "6"]
