"""Damaged checkpoints: what counts as damage and how a run falls back from it.

A checkpoint that cannot be read (truncated or missing array files, an emptied config, manifest or
metadata, a missing item, an empty step directory, non-finite values) raises
:class:`CheckpointDamaged`, never a config mismatch. ``first_readable`` walks the steps newest first
and takes the first readable one, with a warning naming each damaged one; training moves a damaged
checkpoint aside into ``<workdir>/damaged_checkpoints/`` (kept, never deleted, out of the way of the
steps it will save again); evaluation leaves it in place. A step that disappears while it is read
(a training run's keep policy deleted it) is skipped the same way.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import tensorstore as ts

from rank4jax.errors import CheckpointError, say


class CheckpointDamaged(CheckpointError):
    """A checkpoint whose files cannot be read back (not a mismatch with the config)."""

    def __init__(self, workdir: str, step: int, error: BaseException | str):
        self.step = step
        self.reason = error if isinstance(error, str) else reason(error)
        super().__init__(f"checkpoint {step} in {workdir} is damaged and cannot be read ({self.reason})")


def reason(error: BaseException) -> str:
    """One short line for a library exception (orbax/tensorstore messages run to kilobytes)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
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


# how an array's metadata key ends in orbax's OCDBT database, by TensorStore driver (zarr v2 and v3)
_ZARR_METADATA = {"zarr": b"/.zarray", "zarr3": b"/zarr.json"}


def check_readable(workdir: str, step: int, item_dir: str, prefix: str = "") -> None:
    """Read every array of a checkpoint item (orbax's OCDBT database in ``item_dir``) whose name
    starts with ``prefix`` through TensorStore's own futures, one array at a time: a missing or
    truncated data file or an emptied manifest raises CheckpointDamaged naming the array. orbax's
    restore reads the arrays at once from coroutines on an event loop it closes when one read
    fails, and each read still in flight then prints "Event loop is closed" with a traceback;
    checked here first, a damaged checkpoint fails before that restore starts. An item stored
    otherwise (no OCDBT manifest) is left to orbax."""
    if not os.path.isfile(os.path.join(item_dir, "manifest.ocdbt")):
        return
    base = {"driver": "ocdbt", "base": f"file://{os.path.abspath(item_dir)}/"}
    try:
        keys = ts.KvStore.open(base).result().list().result()
        arrays = [
            (d, k[: -len(end)].decode()) for k in sorted(keys) for d, end in _ZARR_METADATA.items() if k.endswith(end)
        ]
        for driver, name in arrays:
            if name.startswith(prefix):  # orbax names an array by its tree path joined with "."
                spec = {"driver": driver, "kvstore": {**base, "path": f"{name}/"}, "open": True}
                ts.open(spec, read=True).result().read().result()
    except Exception as e:  # noqa: BLE001 -- whatever TensorStore raises, the files are unreadable
        raise CheckpointDamaged(workdir, step, e) from None


def first_readable(ckpt, candidates, load, *, set_aside: bool = False):
    """``(step, load(step))`` for the first of ``candidates`` (steps, best first) that reads; each
    damaged one is named in a warning and, when ``set_aside``, moved into ``damaged_checkpoints/``
    once a readable one is found (if none is, all stay where they are); a step deleted meanwhile is
    skipped. No readable candidate: one CheckpointError listing why."""
    problems, damaged = [], []
    for step in candidates:
        try:
            result = load(step)
        except CheckpointDamaged as e:
            if not os.path.isdir(ckpt.step_dir(step)):  # deleted while being read (another run's keep policy)
                problems.append(f"{step}: removed while being read")
                say(f"rank4jax: warning: checkpoint {step} was removed while being read; trying another")
                ckpt.manager.reload()
                continue
            problems.append(f"{step}: {e.reason}")
            damaged.append(step)
            say(f"rank4jax: warning: {e}; trying the next older checkpoint")
            continue
        for bad in damaged if set_aside else ():
            say(f"rank4jax: moved damaged checkpoint {bad} to {ckpt.set_aside(bad)} (kept for inspection)")
        return step, result
    why = "; ".join(problems) or "none saved"
    raise CheckpointError(f"no readable checkpoint in {ckpt.workdir} ({why}); nothing was moved or deleted")
