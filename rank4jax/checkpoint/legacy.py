"""Checkpoints written before the two-item layout, read in one place: their train state is one
``state`` item (saved with ``StandardSave``) and their data position grain's per-process files in
``data_iter`` (``grain.checkpoint``); their ``config`` and ``tokenizer`` items are read as the current
layout's are. They resume and evaluate; new checkpoints are always written in the current layout."""

from __future__ import annotations

import os

import grain
import orbax.checkpoint as ocp
from etils import epath

from rank4jax.checkpoint.damage import CheckpointDamaged

STATE_ITEM = "state"


def is_legacy(step_dir: str) -> bool:
    """Whether a checkpoint holds the whole train state as one ``state`` item."""
    return os.path.isdir(os.path.join(step_dir, STATE_ITEM))


def restore_params(workdir: str, step: int, step_dir: str, abstract_params):
    """The parameters alone from the ``state`` item (a partial restore of its tree)."""
    target = {"params": abstract_params}
    args = ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
    )
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            return checkpointer.restore(os.path.join(step_dir, STATE_ITEM), args=args)["params"]
    except Exception as e:  # noqa: BLE001 -- the config was checked first: a failure here is damage
        raise CheckpointDamaged(workdir, step, e) from None


def restore_state(workdir: str, step: int, step_dir: str, abstract_state, data_iter=None):
    """The whole train state from the ``state`` item, and the data iterator from grain's files (saved
    by the same number of processes as now resume)."""
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            state = checkpointer.restore(os.path.join(step_dir, STATE_ITEM), abstract_state)
        if data_iter is not None:
            handler = grain.checkpoint.CheckpointHandler()
            handler.restore(epath.Path(step_dir) / "data_iter", args=grain.checkpoint.CheckpointRestore(data_iter))
    except Exception as e:  # noqa: BLE001
        raise CheckpointDamaged(workdir, step, e) from None
    return state
