"""Mixed precision, as MaxText and Levanter have it: parameters, optimiser state, gradients and
checkpoints stay float32; the model computes in ``compute_dtype``.

A step casts the float32 parameters to the compute dtype (:func:`cast_to_compute`) and hands them to
the family's pure functions, which follow their parameters' dtype: matmuls and activations run in
bfloat16, while the softmax's max and sum, LayerNorm's statistics and the logits are taken in float32
(``rank4jax.models.common.at_least_f32``), so the losses are float32. The cast is differentiable: the
gradient reaching the float32 parameters is float32. A checkpoint holds the float32 state whatever
the policy, so a bfloat16 run resumes as float32 and back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rank4jax.errors import ConfigError

COMPUTE_DTYPES = ("float32", "bfloat16")


def check_compute_dtype(name: str) -> str:
    if name not in COMPUTE_DTYPES:
        raise ConfigError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {name!r}")
    return name


def cast_to_compute(params, compute_dtype: str):
    """Every floating leaf of ``params`` in ``compute_dtype``, integer leaves unchanged; under float32
    the parameters are returned as they are (float64 ones too: the float64 reference tests)."""
    if check_compute_dtype(compute_dtype) == "float32":
        return params
    dtype = jnp.dtype(compute_dtype)
    return jax.tree.map(lambda leaf: leaf.astype(dtype) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf, params)
