"""Checkpoints written before the two-item layout, read in one place: their train state is one
``state`` item (saved with ``StandardSave``) and their data position grain's per-process files in
``data_iter`` (``grain.checkpoint``); their ``config`` and ``tokenizer`` items are read as the current
layout's are. They resume and evaluate; new checkpoints are always written in the current layout."""

from __future__ import annotations

import dataclasses
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
    """The parameters alone from the ``state`` item (a partial restore of its tree), their shapes
    checked against the config first."""
    from rank4jax.checkpoint.storage import check_shapes

    saved = _saved_shapes(workdir, step, step_dir)
    check_shapes(workdir, step, "state", {k: v for k, v in saved.items() if k.startswith("params/")},
                 {"params": abstract_params})  # fmt: skip
    target = {"params": abstract_params}
    args = ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
    )
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            return checkpointer.restore(os.path.join(step_dir, STATE_ITEM), args=args)["params"]
    except Exception as e:  # noqa: BLE001 -- the config was checked first: a failure here is damage
        raise CheckpointDamaged(workdir, step, e) from None


def _saved_shapes(workdir: str, step: int, step_dir: str) -> dict:
    """{path: shape} of the ``state`` item's arrays, from its metadata (no array read)."""
    from rank4jax.checkpoint.storage import shapes_of

    try:
        with ocp.StandardCheckpointer() as checkpointer:
            return shapes_of(checkpointer.metadata(os.path.join(step_dir, STATE_ITEM)).item_metadata.tree)
    except Exception as e:  # noqa: BLE001
        raise CheckpointDamaged(workdir, step, e) from None


def restore_state(workdir: str, step: int, step_dir: str, abstract_state, data_iter=None):
    """The whole train state from the ``state`` item, and the data iterator from grain's files (saved
    by the same number of processes as now resume), each checked as the current layout's are."""
    from rank4jax.checkpoint.storage import check_position, check_shapes

    path = os.path.join(step_dir, STATE_ITEM)
    fields = {f.name: getattr(abstract_state, f.name) for f in dataclasses.fields(abstract_state)}
    check_shapes(workdir, step, "state", _saved_shapes(workdir, step, step_dir), fields)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            state = checkpointer.restore(path, abstract_state)
        position = {"next_index": step}
        if data_iter is not None:
            handler = grain.checkpoint.CheckpointHandler()
            handler.restore(epath.Path(step_dir) / "data_iter", args=grain.checkpoint.CheckpointRestore(data_iter))
            position = data_iter.get_state()
    except Exception as e:  # noqa: BLE001
        raise CheckpointDamaged(workdir, step, e) from None
    check_position(workdir, step, state.step, position)
    return state
