"""What makes a checkpoint damaged: unreadable files, NaN or infinite values, or an item that does not fit
its step (other shapes than the config makes, the optimiser or data position at another step);
``rank4jax.runs.first_readable`` moves it aside and falls back."""

from __future__ import annotations

import reprlib

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.errors import CheckpointError


class CheckpointDamaged(CheckpointError):
    """A checkpoint whose files cannot be read back, or whose items do not fit its step."""

    def __init__(self, workdir: str, step: int, error: BaseException | str):
        self.step = step
        self.reason = error if isinstance(error, str) else reason(error)
        super().__init__(f"checkpoint {step} in {workdir} is damaged and cannot be read ({self.reason})")


def reason(error: BaseException) -> str:
    """One short line for a library exception (orbax/TensorStore messages run to kilobytes)."""
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    if "See full TensorStore details" in text and error.__cause__ is not None:  # orbax quotes a bound method
        return reason(error.__cause__)  # TensorStore's own error, which names the array
    return text if len(text) <= 160 else text[:157] + "..."


@jax.jit  # one program per tree of shapes: every restore of a run reuses it
def _all_finite(floats: list) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in floats]))


def check_finite(workdir: str, step: int, tree) -> None:
    """NaN/inf in a restored tree (a flipped bit in an exponent) is damage, not divergence."""
    floats = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    if floats and not bool(_all_finite(floats)):
        raise CheckpointDamaged(workdir, step, "it holds NaN or infinite values")


def shapes_of(tree) -> dict:
    """{"a/b/0/c": shape} of a tree's arrays or their metadata (a namedtuple's fields, attributes in
    memory and dict keys in orbax's metadata, read alike)."""

    def name(key):
        return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))

    return {"/".join(map(name, p)): tuple(a.shape) for p, a in jax.tree_util.tree_leaves_with_path(tree)}


def check_shapes(workdir: str, step: int, item: str, saved: dict, abstract) -> None:
    """``saved`` (:func:`shapes_of` an item on disk) against the arrays ``abstract`` asks for."""
    wanted = shapes_of(abstract)
    for name in sorted(set(saved) | set(wanted)):
        if saved.get(name) != wanted.get(name):
            raise CheckpointDamaged(workdir, step, f"its {item} {name} is {saved.get(name, 'absent')}, where its "
                                    f"config makes it {wanted.get(name, 'absent')}")  # fmt: skip


def check_position(workdir: str, step: int, saved_step, data_state) -> None:
    """Checkpoint ``step`` holds the optimiser at that step and the data iterator at that batch
    (``{"next_index": step}``, one global batch a step); another step's item or an edited value is damage."""
    if int(np.asarray(saved_step)) != step:
        raise CheckpointDamaged(workdir, step, f"its optimiser state is at step {int(np.asarray(saved_step))}")
    if data_state != {"next_index": step} or type(data_state["next_index"]) is not int:  # 6.0 == 6, True == 1
        raise CheckpointDamaged(workdir, step, f"its data position is {reprlib.repr(data_state)}, not batch {step}")
