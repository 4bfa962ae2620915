"""Tied, factorised vocabulary readout (SPEC §4).

Axes: B batch, P = N·T positions, D = dx·dt flattened fiber φ(n, q) = n·dt + q, V vocabulary.

    M[φ(n,q), v] = Esem[v, n] · W′[v, q]          built once per call, (D, V) — stored as (V, D)
    logits[b, p, v] = Σ_φ Y[b, p, φ] · M[φ, v]

No O(B·N·T·dt·V) intermediate is ever formed: the largest tensors are M (V·D) and the logits.

The target's logit is also available straight from the factors (``target_logits``), so no gradient
has to flow through an index into the logits.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rank4jax.models.common import on_rows, wide_dtype


def init_readout(key: jax.Array, vocab_size: int, dt: int, width: int, dtype=jnp.float32) -> dict:
    """W′ (V, dt) ~ N(0, 1/D) so initial logits have unit scale (SPEC §5)."""
    return {"tmp": jax.random.normal(key, (vocab_size, dt), dtype) / jnp.sqrt(jnp.asarray(width, dtype))}


def readout_matrix(sem: jax.Array, tmp: jax.Array) -> jax.Array:
    """M as (V, D): row v is vec(Esem[v] ⊗ W′[v]) in φ order."""
    vocab, dx = sem.shape
    dt = tmp.shape[1]
    return (sem[:, :, None] * tmp[:, None, :]).reshape(vocab, dx * dt)


def apply_readout(sem: jax.Array, tmp: jax.Array, y: jax.Array) -> jax.Array:
    """y (B, P, D) final-normed stream → logits (B, P, V)."""
    with jax.named_scope("readout"):
        return _apply_readout(sem, tmp, y)


def _apply_readout(sem: jax.Array, tmp: jax.Array, y: jax.Array) -> jax.Array:
    m = readout_matrix(sem, tmp)
    chex.assert_shape(y, y.shape[:2] + (m.shape[1],))
    return logits_of(y, m)


def logits_of(y: jax.Array, m: jax.Array) -> jax.Array:
    """y (..., D) against the readout matrix M (V, D) → logits (..., V), in at least float32
    (accumulated there from bfloat16 inputs): the CE's logsumexp needs them."""
    return on_rows(lambda rows: jnp.matmul(rows, m.T, preferred_element_type=wide_dtype(y)), y)


def target_logits(sem: jax.Array, tmp: jax.Array, y: jax.Array, targets: jax.Array) -> jax.Array:
    """logits[b, p, targets[b, p]] without touching the logits: Σ_{n,q} Y[b,p,(n,q)]·Esem[v,n]·W′[v,q].

    y (B, P, D); targets (B, P) int → (B, P). Gathers B·P rows of the (V, dx) and (V, dt) factors."""
    dx, dt = sem.shape[1], tmp.shape[1]
    chex.assert_shape(y, targets.shape + (dx * dt,))
    fibers = y.reshape(targets.shape + (dx, dt))
    # Y·W′[v] contracted over q by a matmul, accumulated in at least float32 as the logits are; then Esem[v]
    per_n = jnp.einsum("bpnq,bpq->bpn", fibers, tmp[targets], preferred_element_type=wide_dtype(y))
    return jnp.sum(per_n * sem[targets], axis=-1)
