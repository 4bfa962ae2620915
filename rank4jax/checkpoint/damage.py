"""Damaged checkpoints and storage faults: what counts as each.

A checkpoint that cannot be read (truncated or missing files, an emptied config or metadata, a missing
item, an empty step directory, non-finite values) raises :class:`CheckpointDamaged`, never a config
mismatch; ``rank4jax.runs.first_readable`` falls back from it to the newest readable checkpoint. A
failed save whose cause is the disk (``storage_fault``) is one line (``storage.storage_error``); orbax
or TensorStore may have logged the same fault before it.
"""

from __future__ import annotations

import errno
import os
import re

import jax
import jax.numpy as jnp

from rank4jax.errors import CheckpointError

# the storage faults a failed save is reported as, by errno: no space, quota, read-only, permission
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
TENSORSTORE_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]")  # how TensorStore's errors carry the errno


def storage_fault(error: BaseException | None) -> OSError | None:
    """The storage fault behind a library exception: the first OSError of its cause/context chain
    whose errno is one of ``STORAGE_ERRNOS``, or the errno a TensorStore error of the chain carries
    (its ``[os_error_code='28']``); None for any other."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return error
        code = TENSORSTORE_ERRNO.search(str(error))
        if code and int(code.group(1)) in STORAGE_ERRNOS:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


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
