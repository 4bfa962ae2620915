"""Checkpoints of the layout before 2026-12-05, read in one place: the train state is one ``state`` item
(``StandardSave``) and the data position grain's per-process files in ``data_iter``; ``config`` and
``tokenizer`` read as today's. They resume and evaluate; new checkpoints are always today's layout."""

from __future__ import annotations

import dataclasses
import os

import grain
import orbax.checkpoint as ocp
from etils import epath

from rank4jax.checkpoint.damage import CheckpointDamaged, check_position, check_shapes, shapes_of

STATE_ITEM = "state"


def is_legacy(step_dir: str) -> bool:
    """Whether a checkpoint holds the whole train state as one ``state`` item."""
    return os.path.isdir(os.path.join(step_dir, STATE_ITEM))


def restore_params(workdir: str, step: int, step_dir: str, abstract_params):
    """The parameters alone (a partial restore of the ``state`` tree), their shapes checked first."""
    saved = {k: v for k, v in _saved_shapes(workdir, step, step_dir).items() if k.startswith("params/")}
    target = {"params": abstract_params}
    check_shapes(workdir, step, STATE_ITEM, saved, target)
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    args = ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            return checkpointer.restore(os.path.join(step_dir, STATE_ITEM), args=args)["params"]
    except Exception as e:  # noqa: BLE001 -- the shapes fit: a failure here is damage
        raise CheckpointDamaged(workdir, step, e) from None


def _saved_shapes(workdir: str, step: int, step_dir: str) -> dict:
    """{path: shape} of the ``state`` item's arrays, from its metadata (no array read)."""
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            return shapes_of(checkpointer.metadata(os.path.join(step_dir, STATE_ITEM)).item_metadata.tree)
    except Exception as e:  # noqa: BLE001
        raise CheckpointDamaged(workdir, step, e) from None


def restore_state(workdir: str, step: int, step_dir: str, abstract_state, data_iter=None):
    """The train state, and the data iterator from grain's files (saved by as many processes as now
    resume), each checked as today's layout's are."""
    fields = {f.name: getattr(abstract_state, f.name) for f in dataclasses.fields(abstract_state)}
    check_shapes(workdir, step, STATE_ITEM, _saved_shapes(workdir, step, step_dir), fields)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            state = checkpointer.restore(os.path.join(step_dir, STATE_ITEM), abstract_state)
        position = {"next_index": step}
        if data_iter is not None:
            handler = grain.checkpoint.CheckpointHandler()
            handler.restore(epath.Path(step_dir) / "data_iter", args=grain.checkpoint.CheckpointRestore(data_iter))
            position = data_iter.get_state()
    except Exception as e:  # noqa: BLE001
        raise CheckpointDamaged(workdir, step, e) from None
    check_position(workdir, step, state.step, position)
    return state
