"""Input tensor of the rank-4 model (SPEC §2).

Axes: B batch, N tokens per state (x), T input slices (t), dx semantic fiber (n), dt temporal
fiber (q), V vocabulary.

    X[b,x,t,n,q] = Esem[tok[b,t,x], n] · Etmp[tok[b,t,x], q] + P[x, n] + R[x + t, q]
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models.common import sinusoid_table
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.layout import window_rows
from rank4jax.tokens import PAD_ID


def init_embedding(key: jax.Array, cfg: Rank4Config, dtype=jnp.float32) -> dict:
    """Esem (V, dx), Etmp (V, dt) ~ N(0, 1) with the PAD row zero (SPEC §5)."""
    k_sem, k_tmp = jax.random.split(key)
    sem = jax.random.normal(k_sem, (cfg.vocab_size, cfg.dx), dtype).at[PAD_ID].set(0)
    tmp = jax.random.normal(k_tmp, (cfg.vocab_size, cfg.dt), dtype).at[PAD_ID].set(0)
    return {"sem": sem, "tmp": tmp}


def position_tables(cfg: Rank4Config, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Fixed tables: P (N, dx) spatial and R[x+t] gathered to (N, T, dt) joint phase."""
    spatial = sinusoid_table(cfg.n_tokens, cfg.dx)  # P (N, dx)
    joint = sinusoid_table(cfg.n_tokens + cfg.n_slices, cfg.dt)  # R (N+T, dt)
    phase = np.arange(cfg.n_tokens)[:, None] + np.arange(cfg.n_slices)[None, :]  # (N, T)
    return spatial.astype(dtype), joint[phase].astype(dtype)


def embed_tokens(params: dict, tok: jax.Array, spatial: jax.Array, joint: jax.Array) -> jax.Array:
    """X = Esem[tok] ⊗ Etmp[tok] + P[x] + R[x + t] for token ids of any shape (...):
    ``spatial`` (..., dx) and ``joint`` (..., dt) are the position-table entries of each token,
    broadcastable to tok's shape. → (..., dx, dt)."""
    sem = jnp.take(params["sem"], tok, axis=0)  # (..., dx)
    tmp = jnp.take(params["tmp"], tok, axis=0)  # (..., dt)
    x = sem[..., :, None] * tmp[..., None, :]  # Stage A: outer product
    x = x + spatial[..., :, None]  # Stage B: P[x, n], same for every q
    return x + joint[..., None, :]  # Stage D: R[x + t, q], same for every n


def embed_rows(params: dict, rows, cfg: Rank4Config) -> jax.Array:
    """X at the rows of a layout (``rank4jax.models.rank4.layout.Rows``): (G, R, D) flattened fibers."""
    spatial, joint = position_tables(cfg, params["sem"].dtype)  # P (N, dx), R[x+t] (N, T, dt)
    # on one row axis, for the reason common.on_rows gives: XLA:CPU reduces the outer product's
    # backward (R, dx, dt) → (R, dx) several times faster than with the leading group axis kept apart
    tok, position, slice_ = (a.reshape(-1) for a in (rows.tokens, rows.position, rows.slice))
    x = embed_tokens(params, tok, jnp.asarray(spatial)[position], jnp.asarray(joint)[position, slice_])
    return x.reshape(rows.tokens.shape + (cfg.width,))


def apply_embedding(params: dict, tok: jax.Array, cfg: Rank4Config) -> jax.Array:
    """tok (B, N, T) int → X (B, N, T, dx, dt) in the parameters' dtype: :func:`embed_rows` of the
    windows' rows (p = x·T + t), so the same values as the forward's."""
    batch = tok.shape[0]
    chex.assert_shape(tok, (batch, cfg.n_tokens, cfg.n_slices))
    x = embed_rows(params, window_rows(jnp.swapaxes(tok, 1, 2)), cfg)  # (B, P, D)
    return x.reshape(batch, cfg.n_tokens, cfg.n_slices, cfg.dx, cfg.dt)
