"""Tied, factorised vocabulary readout (SPEC §4).

Axes: B batch, P = N·T positions, D = dx·dt flattened fiber φ(n, q) = n·dt + q, V vocabulary.

    M[φ(n,q), v] = Esem[v, n] · W′[v, q]          built once per call, (D, V) — stored as (V, D)
    logits[b, p, v] = Σ_φ Y[b, p, φ] · M[φ, v]

No O(B·N·T·dt·V) intermediate is ever formed: the largest tensors are M (V·D) and the logits.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


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
    m = readout_matrix(sem, tmp)
    chex.assert_shape(y, (None, None, m.shape[1]))
    return jnp.einsum("bpd,vd->bpv", y, m)
